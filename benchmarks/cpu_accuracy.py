"""Per-output relative errors of specs' chunk kernels (forward o, every gradient) against the float64 reference, on
the CPU under the Triton interpreter: the same numbers at two commits say a restructure kept the arithmetic.

    python benchmarks/cpu_accuracy.py ccq_gdn ccq_gla [--T 256 --dk 32 --dtype bf16]
    # the same at another commit too (a temporary git worktree, its own kernel cache), one line per spec and commit
    python benchmarks/cpu_accuracy.py ccq_gdn --against HEAD~3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import dgps  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grad_errors import grad_errors  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def errors(name: str, B: int, T: int, H: int, HV: int, dk: int, dv: int, dtype: torch.dtype, seed: int) -> dict:
    rec = dgps.load(os.path.join(os.path.dirname(dgps.__file__), "specs", f"{name}.dgps"))
    return grad_errors(rec, B, T, H, HV, dk, dv, dtype, seed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="+")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=256)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--HV", type=int, default=2)
    p.add_argument("--dk", type=int, default=32)
    p.add_argument("--dv", type=int, default=32)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--against", metavar="REV", help="also run this script's arguments at git revision REV")
    a = p.parse_args()
    for name in a.specs:
        e = errors(name, a.B, a.T, a.H, a.HV, a.dk, a.dv, DTYPES[a.dtype], a.seed)
        print(name, " ".join(f"{k}={v:.3e}" for k, v in e.items()), flush=True)
    if a.against:
        opts = {"--B": a.B, "--T": a.T, "--H": a.H, "--HV": a.HV, "--dk": a.dk, "--dv": a.dv, "--dtype": a.dtype,
                "--seed": a.seed}
        against(a.against, [*a.specs, *(str(x) for kv in opts.items() for x in kv)])


def against(rev: str, argv: list[str]) -> None:
    """Run this script with `argv` in a temporary worktree of the repository at `rev` (its package importable as
    dgps, its own kernel cache), printing its lines after `rev:`."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "dgps"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        try:
            env = dict(os.environ, PYTHONPATH=tmp, DGPS_CACHE_DIR=str(Path(tmp) / "cache"))
            out = subprocess.run([sys.executable, str(tree / "benchmarks" / "cpu_accuracy.py"), *argv], cwd=tree,
                                 env=env, capture_output=True, text=True, check=True).stdout
            print(f"{rev}:\n{out}", end="", flush=True)
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=True,
                           capture_output=True)


if __name__ == "__main__":
    main()
