"""Where a training step's host time goes on a GPU machine: the wall clock per step at a tiny shape (B 1, T 256, H 2:
the kernels take a few µs, so the wall clock is the host's) and, with --profile, cProfile over the steps sorted by
own and by cumulative time. Whichever `dgps` is on the path is timed: two trees compare in alternating processes.

    . benchmarks/device_env.sh && python3 benchmarks/host_profile.py gdn [--steps 300] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    import dgps

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--top", type=int, default=45)
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", nargs=4, type=int, default=[1, 256, 2, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    B, T, H, D = a.shape
    rec = dgps.load((ROOT / "specs" / f"{a.spec}.dgps").read_text())
    pkg = importlib.import_module(f"dgps.generated.{a.spec}")
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device=a.device, on_device=True)
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device=a.device)

    def step() -> None:
        leaves = {k: v.detach().requires_grad_(True) for k, v in x.items()}
        pkg.forward(**leaves).o.backward(do)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    print(f"{a.spec} {dgps.__file__} B {B} T {T} H {H} D {D}: {1e6 * (time.perf_counter() - t0) / a.steps:.0f} us "
          "per step", flush=True)
    if not a.profile:
        return 0
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(a.top)
    st.sort_stats("cumulative").print_stats(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
