"""Run one spec's chunk forward and backward on the GPU at given launch settings, to reproduce (and, under
compute-sanitizer, locate) a fault that a launch setting provokes.

    compute-sanitizer --tool memcheck --print-limit 4 python3 benchmarks/launch_fault.py SPEC \
        --launch "bwd_curvature_query=64,32,4,1" [--shape B T H D]

The interpreter's bounds checker (runtime/bounds.py) says whether the kernels as written stay in bounds; this runs
the compiled sm_90 kernels, so a fault here that the checker does not see is in what Triton made of them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--launch", default="", help='DGPS_LAUNCH form: "stage=BK,BV,warps,stages;..."')
    p.add_argument("--shape", type=int, nargs=4, default=[1, 256, 2, 128], metavar=("B", "T", "H", "D"))
    args = p.parse_args()
    import dgps
    from dgps.codegen.launch import parse_launch_overrides
    from dgps.runtime.compile import load_chunk

    spec = Path(args.spec)
    rec = dgps.load(spec if spec.exists() else ROOT / "specs" / f"{args.spec}.dgps")
    mod = load_chunk(rec.ir)
    mod.LAUNCH_OVERRIDES.update(parse_launch_overrides(args.launch))
    B, T, H, D = args.shape
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda")
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")
    out, kept = mod.chunk_forward_train(x)
    torch.cuda.synchronize()
    print("forward done", flush=True)
    grads, _ = mod.chunk_backward(x, do=do, kept=kept)
    torch.cuda.synchronize()
    print("backward done:", ", ".join(f"{n} {float(g.float().norm()):.4g}" for n, g in grads.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
