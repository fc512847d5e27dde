"""A training step's host cost at two commits of a generated package, in one process: the package as checked in now
against the same spec's package at another commit (its files from `git show`, imported under another name; the
runtime is this tree's), interleaved. At a tiny shape (B 1, T 256: kernels of a few µs) a step's wall clock is its
host time; at the reference shape the wall clock and the profiler's kernel sum show whether the step is host-bound.

    . benchmarks/device_env.sh && python3 benchmarks/host_ab.py gdn --against HEAD~1 [--reps 5]

Where the device's git lacks the commit, `python3 benchmarks/host_ab.py gdn --against REV --export` here first and
carry `.ab`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def git_show(rev: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def package_files(rev: str, spec: str) -> list[str]:
    return subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:generated/{spec}"],
                          capture_output=True, text=True, check=True).stdout.split()


def export(rev: str, spec: str) -> Path:
    """generated/<spec> at `rev` into .ab/<rev>/<spec> (ignored; a device run carries `.ab`)."""
    out = ROOT / ".ab" / rev / spec
    out.mkdir(parents=True, exist_ok=True)
    for f in package_files(rev, spec):
        (out / f).write_text(git_show(rev, f"generated/{spec}/{f}"))
    return out


def package_at(rev: str, spec: str, into: Path):  # noqa: ANN201
    """generated/<spec> at `rev`, imported as the package `<spec>_at_rev`."""
    name = f"{spec}_at_rev"
    (into / name).mkdir(parents=True)
    exported = ROOT / ".ab" / rev / spec  # `--export` wrote it here: the device's git may not hold `rev`
    if exported.is_dir():
        for f in exported.iterdir():
            (into / name / f.name).write_text(f.read_text())
    else:
        for f in package_files(rev, spec):
            (into / name / f).write_text(git_show(rev, f"generated/{spec}/{f}"))
    spec_obj = importlib.util.spec_from_file_location(name, into / name / "__init__.py",
                                                      submodule_search_locations=[str(into / name)])
    mod = importlib.util.module_from_spec(spec_obj)
    sys.modules[name] = mod
    spec_obj.loader.exec_module(mod)
    return mod


def main() -> int:
    import triton.testing
    from bench_backward import kernel_times

    import dgps

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--against", required=True, help="the other commit")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128])
    p.add_argument("--json")
    p.add_argument("--export", action="store_true", help="only write the other commit's package under .ab/ and exit")
    a = p.parse_args()
    if a.export:
        print(export(a.against, a.spec))
        return 0
    rec = dgps.load((ROOT / "specs" / f"{a.spec}.dgps").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = {"now": importlib.import_module(f"dgps.generated.{a.spec}"),
                a.against: package_at(a.against, a.spec, Path(tmp))}
        out: dict = {}
        for label, (B, T) in (("tiny", (1, 256)), ("full", tuple(a.shape[:2]))):
            H, D = a.shape[2], a.shape[3]
            x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda", on_device=True)
            do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")
            steps = {}
            for key, pkg in pkgs.items():
                def step(pkg=pkg, x=x, do=do) -> None:  # noqa: ANN001
                    leaves = {k: v.detach().requires_grad_(True) for k, v in x.items()}
                    pkg.forward(**leaves).o.backward(do)
                step()
                steps[key] = step
            times: dict[str, list[float]] = {k: [] for k in steps}
            for _ in range(a.reps):
                for key, step in steps.items():
                    times[key].append(triton.testing.do_bench(step, warmup=10, rep=100, return_mode="median"))
            row = {f"{key}_step_ms": round(statistics.median(v), 4) for key, v in times.items()}
            if label == "full":
                row.update({f"{key}_kernel_sum_ms": round(sum(kernel_times(s).values()), 4) for key, s in steps.items()})
            out[label] = row
            print(a.spec, label, json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
