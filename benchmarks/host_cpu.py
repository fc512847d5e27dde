"""A gdn training step's host cost on the CPU, kernels not run: the Python work of a step through FLA's signature
(dgps.fla_compat.chunk_gated_delta_rule) with every launch replaced by a no-op after a first real (interpreted) step.
What it leaves out, against a GPU host: the launches themselves (~9 per step) and CUDA allocations' extra cost.

    python benchmarks/host_cpu.py [--steps 200] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import dgps.fla_compat as fla  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--profile", action="store_true", help="cProfile over the steps, top functions by own time")
    a = p.parse_args()
    B, T, H, D = 1, 256, 2, 32
    gen = torch.Generator().manual_seed(0)
    x = {n: torch.randn(B, T, H, D, generator=gen) for n in ("q", "k", "v")}
    x["g"] = -torch.rand(B, T, H, generator=gen)
    x["beta"] = torch.rand(B, T, H, generator=gen)
    x = {n: t.to(torch.bfloat16).requires_grad_() for n, t in x.items()}
    do = torch.randn(B, T, H, D).to(torch.bfloat16)

    def forward() -> torch.Tensor:
        return fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0]

    forward().backward(do)  # compiles and runs the kernels once
    launches = [0]

    def no_launch(lst, tensors, key, interpret=False):  # noqa: ANN001, ANN202, ARG001
        launches[0] += len(lst)

    for name, mod in list(sys.modules.items()):  # the generated modules bound launch_all at import
        if name != "dgps.runtime.launcher" and getattr(mod, "launch_all", None) is not None:
            mod.launch_all = no_launch
    forward().backward(do)
    launches[0] = 0
    t_fwd = t_bwd = 0.0
    pr = cProfile.Profile() if a.profile else None
    for _ in range(a.steps):
        t0 = time.perf_counter()
        if pr:
            pr.enable()
        o = forward()
        t1 = time.perf_counter()
        o.backward(do)
        if pr:
            pr.disable()
        t2 = time.perf_counter()
        t_fwd, t_bwd = t_fwd + t1 - t0, t_bwd + t2 - t1
    n = a.steps
    print(f"host µs per step {(t_fwd + t_bwd) / n * 1e6:.0f} (forward {t_fwd / n * 1e6:.0f}, backward "
          f"{t_bwd / n * 1e6:.0f}), launches per step {launches[0] / n:.1f}")
    if pr:
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "30")))
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
