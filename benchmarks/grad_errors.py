"""Relative errors of one spec's chunk kernels against float64 autograd through its reference, on any device: the
check shared by benchmarks/cpu_accuracy.py (CPU, interpreter) and benchmarks/plan_experiment.py (GPU)."""

from __future__ import annotations

import torch

from dgps.runtime.compile import load_chunk
from dgps.runtime.reference import random_states, state_shapes
from dgps.runtime.tensors import Dims


def grad_errors(rec, B: int, T: int, H: int, HV: int, dk: int, dv: int, dtype: torch.dtype,  # noqa: ANN001
                seed: int, device: str = "cpu", train: bool = False, route_in_rerun: bool = True) -> dict[str, float]:
    """Errors of o ("o"), every input gradient ("d<name>") and initial-state gradient ("dS:<state>"), with a route's
    gradient in the loss where the spec has a route (and its error, "r"); with `train` the training path (the forward
    keeps its buffers for the backward) and the final states ("S:<state>") too; `route_in_rerun` (train): the
    backward's rerun reads R from the forward's route where the plan says it can (compiler/plan.py:
    rerun_reads_route), else it forms R again."""
    dims = Dims(B, T, H, HV, dk, dv)
    x = {k: v.to(dtype).to(device)
         for k, v in rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=seed).items()}
    # consistent states (CCQ's C_0 a sum of k kᵀ, m_0 and n_0 with it)
    states = {k: v.to(device) for k, v in random_states(rec.ir, dims, B, seed).items()}
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(B, T, HV, dv, generator=gen).to(dtype).to(device)
    dfinal = {k: torch.randn(s, generator=gen).to(device)
              for k, s in state_shapes(rec.ir, dims, B).items() if k != "n"}
    dr = torch.randn(B, T, HV, dv, generator=gen).to(dtype).to(device) if rec.ir.route != "none" else None
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    s64 = {k: v.double().requires_grad_(k != "n") for k, v in states.items()}
    out = rec.reference(**x64, initial_state=s64, output_final_state=True)
    loss = (out.o * do.double()).sum() + sum((out.final_state[k] * g.double()).sum() for k, g in dfinal.items())
    if dr is not None:
        loss = loss + (out.route * dr.double()).sum()
    leaves = {**x64, **{f"S:{k}": s64[k] for k in dfinal}}
    ref = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()), allow_unused=True), strict=True))
    mod = load_chunk(rec.ir)
    if train:
        fwd, kept = mod.chunk_forward_train(x, initial_state=states)
        given = {"route": fwd.route} if route_in_rerun and mod.ROUTE_FEEDS_RERUN else {}
        gx, gs = mod.chunk_backward(x, initial_state=states, do=do, d_final_state=dfinal, d_route=dr, kept=kept,
                                    **given)
    else:
        fwd = mod.chunk_forward(x, initial_state=states, output_final_state=True)
        gx, gs = mod.chunk_backward(x, initial_state=states, do=do, d_final_state=dfinal, d_route=dr)
    ours = {**gx, **{f"S:{k}": v for k, v in gs.items()}}
    errs = {"o": ((fwd.o.double() - out.o).norm() / out.o.norm()).item()}
    if dr is not None:
        errs["r"] = ((fwd.route.double() - out.route).norm() / out.route.norm()).item()
    if train:
        errs.update({f"S:{k}": ((v.double() - out.final_state[k]).norm() / out.final_state[k].norm()).item()
                     for k, v in fwd.final_state.items() if k != "n"})
    for k, want in ref.items():
        if want is not None and want.norm() > 0:
            errs["d" + k] = ((ours[k].double() - want).norm() / want.norm()).item()
    return errs
