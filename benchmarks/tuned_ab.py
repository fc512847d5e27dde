"""One process, same inputs: a spec's training step (forward + backward) with the launch settings `dgps tune` recorded
for this GPU against the shipped table's, interleaved rounds, medians; plus each stage's kernel time both ways.

    python benchmarks/tuned_ab.py SPEC [SPEC ...] [--shape B T H D] [--reps 5] [--json OUT]

DGPS_TUNED=0 / 1 switches between the two per call (the generated hosts key their launch lists on it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_backward import kernel_times  # noqa: E402
from bench_fla import interleaved  # noqa: E402


def _kernel_times(step, reps: int = 3) -> dict[str, float]:  # noqa: ANN001
    """bench_backward.kernel_times (the profiler's CUDA time per kernel over one call), median of `reps` calls."""
    rounds = [kernel_times(step) for _ in range(reps)]
    return {k: round(statistics.median(r.get(k, 0.0) for r in rounds), 4) for k in rounds[0]}


def _step(pkg, x: dict, do: torch.Tensor, tuned: str):  # noqa: ANN001, ANN202
    """One training step with DGPS_TUNED = `tuned` (0: the table's launch settings, 1: the recorded ones)."""

    def run() -> None:
        os.environ["DGPS_TUNED"] = tuned
        for t in x.values():
            t.grad = None
        pkg.forward(**x).o.backward(do)

    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("specs", nargs="+")
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import dgps

    B, T, H, D = args.shape
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape, "specs": {}}
    for spec in args.specs:
        pkg = dgps.compile(dgps.load(str(ROOT / "specs" / f"{spec}.dgps")))
        x = pkg.RECURRENCE.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda", on_device=True)
        x = {k: v.requires_grad_(True) for k, v in x.items()}
        do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")

        fns = {"table": _step(pkg, x, do, "0"), "tuned": _step(pkg, x, do, "1")}
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        ms = interleaved(fns, args.reps)
        kernels = {k: _kernel_times(f) for k, f in fns.items()}
        out["specs"][spec] = {"step_ms": ms, "kernels": kernels}
        print(f"{spec}: training step table {ms['table']:.3f} ms, tuned {ms['tuned']:.3f} ms "
              f"({ms['tuned'] / ms['table']:.3f}x)", flush=True)
        for k in sorted(kernels["table"], key=lambda k: -kernels["table"][k]):
            a, b = kernels["table"][k], kernels["tuned"].get(k, 0.0)
            if abs(a - b) > 0.002:
                print(f"  {k:<40} {a:.4f} -> {b:.4f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
