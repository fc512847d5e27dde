"""Regenerate (or check) generated/: the compiled spec library, importable as dgps.generated.<name>.

    python -m dgps.codegen.generate           rewrite generated/ from specs/
    python -m dgps.codegen.generate --check   exit 1 if any generated file is stale (CI runs this)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ..compiler.ir import IR
from ..compiler.lower import lower
from ..dsl.parser import parse
from .package import render_package

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
GENERATED = ROOT / "generated"
INIT = '"""The compiled spec library: one package per file in specs/, written by `python -m dgps.codegen.generate`."""\n'


@dataclass(frozen=True)
class _Spec:
    ir: IR
    source: str


def expected_files() -> dict[Path, str]:
    files: dict[Path, str] = {GENERATED / "__init__.py": INIT}
    for spec in sorted(SPECS.glob("*.dgps")):
        text = spec.read_bytes().decode("utf-8")
        rec = _Spec(lower(parse(text, f"specs/{spec.name}")), text)
        for name, body in render_package(rec, module_name=f"dgps.generated.{rec.ir.name}").items():
            files[GENERATED / rec.ir.name / name] = body
    return files


def stale_files() -> list[str]:
    want = expected_files()
    problems = [str(p.relative_to(ROOT)) for p, text in want.items() if not p.exists() or p.read_text() != text]
    have = {p for p in GENERATED.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    problems += [f"{p.relative_to(ROOT)} (no longer generated)" for p in sorted(have - set(want))]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for s in stale:
            print(f"stale: {s}", file=sys.stderr)
        if stale:
            print("generated/ is stale: run `python -m dgps.codegen.generate`", file=sys.stderr)
        return 1 if stale else 0
    want = expected_files()
    for p in GENERATED.rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and p not in want:
            p.unlink()
    for p, text in want.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
    print(f"wrote {len(want)} files under {GENERATED.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
