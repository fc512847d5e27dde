"""Snapshot the modules codegen renders, and compare a later tree against it: the check for a codegen refactor.

    python scripts/render_snapshot.py save /tmp/before.json [--fuzz 400]
    ... change codegen/ ...
    python scripts/render_snapshot.py compare /tmp/before.json

Renders the chunk module and the recurrent forward and backward modules for every spec in specs/ and tests/*.dgps and
for `--fuzz` specs drawn from the fuzzer's strategy (runtime/fuzz.py `specs()`, derandomised: the same draw for the
same hypothesis version), and on `compare` sorts each module into identical, comments-only (after dropping comments
and blank lines) or code changes, printing each distinct code change once with the modules it touched. Exit status 1
when any module's code changed, so that a refactor meant to keep the kernels as they are can be held to it (generated/
covers the library specs only).
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _drawn(count: int) -> list[str]:
    from hypothesis import HealthCheck, given, settings

    from dgps.runtime.fuzz import specs

    texts: list[str] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(specs())
    def draw(text: str) -> None:
        texts.append(text)

    draw()
    return list(dict.fromkeys(texts))


def render_all(fuzz: int) -> dict[str, str]:
    """Every module codegen renders for each spec: the chunk module (keyed by the spec's name) and the recurrent
    forward and backward modules (keyed `name [recurrent]`, `name [recurrent_bwd]`)."""
    from dgps.codegen.chunk import render_chunk, supports_chunk
    from dgps.codegen.recurrent import render_recurrent
    from dgps.codegen.recurrent_bwd import render_recurrent_backward
    from dgps.compiler.lower import lower
    from dgps.dsl.parser import parse

    files = sorted([*(ROOT / "specs").glob("*.dgps"), *(ROOT / "tests").glob("*.dgps")])
    items = [(str(f.relative_to(ROOT)), f.read_text()) for f in files]
    items += [(f"fuzz{i}", t) for i, t in enumerate(_drawn(fuzz))] if fuzz else []
    out: dict[str, str] = {}
    for name, text in items:
        ir = lower(parse(text, name))
        ok, why = supports_chunk(ir)
        out[name] = render_chunk(ir) if ok else f"unsupported: {why}"
        for kind, render in (("recurrent", render_recurrent), ("recurrent_bwd", render_recurrent_backward)):
            try:
                out[f"{name} [{kind}]"] = render(ir)
            except NotImplementedError as e:  # a spec the recurrent kernels decline (their error classes): recorded
                out[f"{name} [{kind}]"] = f"unsupported: {type(e).__name__}: {e}"
    return out


def _code(src: str) -> list[str]:
    """The lines that are code: comments and blank lines dropped (kernels hold no '#' inside strings)."""
    return [line for raw in src.splitlines() if (line := re.sub(r"\s*#.*$", "", raw)).strip()]


def compare(before: dict[str, str], after: dict[str, str]) -> int:
    counts = collections.Counter()
    changes: dict[str, list[str]] = {}
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a == b:
            counts["identical"] += 1
        elif a is None or b is None:
            counts["only in one snapshot"] += 1
        elif _code(a) == _code(b):
            counts["comments or blank lines only"] += 1
        else:
            counts["code changed"] += 1
            diff = "\n".join(line for line in difflib.unified_diff(_code(a), _code(b), lineterm="", n=0)
                             if line[:1] in "+-" and line[:3] not in ("+++", "---"))
            changes.setdefault(diff, []).append(name)
    for diff, names in sorted(changes.items(), key=lambda kv: -len(kv[1])):
        print(f"== {len(names)} module(s), e.g. {', '.join(names[:4])}\n{diff[:4000]}\n")
    print(", ".join(f"{k}: {v}" for k, v in counts.items()))
    return 1 if changes else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["save", "compare"])
    p.add_argument("path", type=Path)
    p.add_argument("--fuzz", type=int, default=400, help="drawn specs besides the library's (default 400)")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    if a.action == "save":
        rendered = render_all(a.fuzz)
        a.path.write_text(json.dumps(rendered))
        print(f"{len(rendered)} modules rendered to {a.path}")
        return 0
    before = json.loads(a.path.read_text())
    fuzz = sum(name.startswith("fuzz") and "[" not in name for name in before)
    return compare(before, render_all(fuzz))


if __name__ == "__main__":
    sys.exit(main())
