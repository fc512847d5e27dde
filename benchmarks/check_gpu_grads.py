"""Chunked forward (training path) and backward on the GPU vs float64 autograd through the reference, at a moderate shape.

    python benchmarks/check_gpu_grads.py [--systems ...] [--B 2 --T 300 --H 2 --HV 4 --D 128] [--dtype fp32|bf16]

Prints the relative error of every input and initial-state gradient (fp32 inputs: expect ≤ 1e-4 up to
TF32-free fp32 accumulation; bf16: ≤ 2e-2). Run with CUDA_LAUNCH_BLOCKING=1 to localise a faulting kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    import dgps
    from dgps.runtime.compile import load_chunk
    from dgps.runtime.reference import random_states, state_shapes
    from dgps.runtime.tensors import Dims

    p = argparse.ArgumentParser()
    p.add_argument("--systems", nargs="+", default=["gdn", "kda", "gla", "pgdn", "ccq_gdn", "cler_h_gdn", "cler_h_kda"])
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--T", type=int, default=300)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--HV", type=int, default=4)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cuda", help="cpu: the same check under TRITON_INTERPRET=1 (small shapes)")
    p.add_argument("--gate-scale", type=float, default=1.0,
                   help="log-gates times this (0.05: every chunk within the per-channel kernels' bounded forms)")
    a = p.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("--device cpu runs the kernels under the interpreter: set TRITON_INTERPRET=1")

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    worst_all = 0.0
    for name in a.systems:
        rec = dgps.load(str(ROOT / "specs" / f"{name}.dgps"))
        dims = Dims(a.B, a.T, a.H, a.HV, a.D, a.D)
        x = rec.random_inputs(a.B, a.T, a.H, a.D, a.D, a.HV, seed=0)
        for d in rec.ir.inputs:
            if d.domain == "log_gate" and not d.is_param:
                x[d.name] = x[d.name] * a.gate_scale
        x = {k: v.to(dtype).to(dev) for k, v in x.items()}
        st = {k: v.to(dev) for k, v in random_states(rec.ir, dims, a.B, 0).items()}
        gen = torch.Generator().manual_seed(1)
        do = torch.randn(a.B, a.T, a.HV, a.D, generator=gen).to(dtype).to(dev)
        dfin = {k: torch.randn(s, generator=gen).to(dev) for k, s in state_shapes(rec.ir, dims, a.B).items() if k != "n"}
        dr = torch.randn(a.B, a.T, a.HV, a.D, generator=gen).to(dtype).to(dev) if rec.ir.route != "none" else None
        x64 = {k: v.double().requires_grad_() for k, v in x.items()}
        s64 = {k: v.double().requires_grad_(k != "n") for k, v in st.items()}
        out = rec.reference(**x64, initial_state=s64, output_final_state=True)
        loss = (out.o * do.double()).sum() + sum((out.final_state[k] * g.double()).sum() for k, g in dfin.items())
        if dr is not None:
            loss = loss + (out.route * dr.double()).sum()
        leaves = {**x64, **{f"state {k}": s64[k] for k in dfin}}
        ref = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()), allow_unused=True), strict=True))
        mod = load_chunk(rec.ir)
        if os.environ.get("DGPS_TRACE_LAUNCH"):  # name each stage and wait for it: localises a faulting kernel
            def launch(self, kernels, _orig=mod._Run.launch):  # noqa: ANN001, ANN202
                for k in kernels:
                    print("launch", k[0], flush=True)
                    _orig(self, [k])
                    sync()
            mod._Run.launch = launch
        # the training path: the forward keeps its per-token buffers, the backward reuses them
        fwd, kept = mod.chunk_forward_train(x, initial_state=st)
        gx, gs = mod.chunk_backward(x, initial_state=st, do=do, d_final_state=dfin, d_route=dr, kept=kept)
        sync()
        ours = {**gx, **{f"state {k}": v for k, v in gs.items()}}
        errs = {"o": ((fwd.o.double() - out.o).norm() / out.o.norm()).item(),
                "S": ((fwd.final_state["S"].double() - out.final_state["S"]).norm() / out.final_state["S"].norm()).item()}
        ref = {k: (v.detach() if v is not None else None) for k, v in ref.items()}
        for k, want in ref.items():
            want = torch.zeros_like(ours[k], dtype=torch.float64) if want is None else want
            errs[k] = ((ours[k].double() - want).norm() / want.norm().clamp_min(1e-30)).item()
        worst = max(errs.values())
        worst_all = max(worst_all, worst)
        print(f"{name:<12} {a.dtype} worst {worst:.2e}  " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
    print(f"worst over all systems: {worst_all:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
