"""The generated recurrent backward kernel against torch autograd through the float64 reference.

Every spec in specs/, under TRITON_INTERPRET=1 on CPU with fp32 inputs: the gradient of every input,
param and initial state (S, A, P, C, m) matches autograd through `reference` (float64) to a relative
error ‖ours − ref‖ / ‖ref‖ ≤ 1e-4. The loss mixes the output, the final states and (for routes) the
route output with random weights, so gradients flow in through all three. Gradient buffers start as
NaN, so any element the kernel fails to write shows up.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import functools  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
from dgps.codegen.recurrent_bwd import RecurrentBackwardCodegenError, render_recurrent_backward  # noqa: E402
from dgps.runtime.compile import load_recurrent_backward  # noqa: E402
from dgps.runtime.reference import random_states, state_shapes  # noqa: E402
from dgps.runtime.tensors import Dims, TensorError  # noqa: E402

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"
ALL_SPECS = sorted(p.stem for p in SPECS_DIR.glob("*.dgps"))
TOL = 1e-4


@functools.cache
def load(name: str) -> dgps.Recurrence:
    return dgps.load(SPECS_DIR / f"{name}.dgps")


def check_gradients(name: str, *, B: int = 2, T: int = 37, H: int = 2, HV: int | None = None, dk: int = 16,
                    dv: int = 16, varlen: bool = False, checkpoint: int | None = None, block_v: int | None = None,
                    seed: int = 0) -> float:
    rec = load(name)
    HV = HV or H
    cu = None
    if varlen:
        B = 1
        cu = torch.tensor([0, min(15, T - 1), T]) if T > 1 else torch.tensor([0, 1])
        cu = torch.unique(cu)
    N = len(cu) - 1 if cu is not None else B
    dims = Dims(B, T, H, HV, dk, dv)
    x = rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=seed)
    states = random_states(rec.ir, dims, N, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(B, T, HV, dv, generator=gen)
    dfinal = {k: torch.randn(s, generator=gen) for k, s in state_shapes(rec.ir, dims, N).items() if k != "n"}
    droute = torch.randn(B, T, HV, dv, generator=gen) if rec.ir.route != "none" else None

    # autograd through the float64 reference
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    s64 = {k: v.double().requires_grad_(k != "n") for k, v in states.items()}
    out = rec.reference(**x64, initial_state=s64, output_final_state=True, cu_seqlens=cu)
    loss = (out.o * do.double()).sum()
    for k, g in dfinal.items():
        loss = loss + (out.final_state[k] * g.double()).sum()
    if droute is not None:
        loss = loss + (out.route * droute.double()).sum()
    leaves = {**x64, **{f"state {k}": s64[k] for k in dfinal}}
    ref = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()), allow_unused=True), strict=True))

    mod = load_recurrent_backward(rec.ir)
    mod.DEBUG_NAN_FILL = True
    gx, gs = mod.recurrent_backward(x, initial_state=states, do=do, d_final_state=dfinal, d_route=droute,
                                    cu_seqlens=cu, checkpoint=checkpoint, block_v=block_v)
    assert set(gx) == set(x), f"{name}: gradients for {sorted(gx)}, inputs {sorted(x)}"
    assert set(gs) == set(dfinal), f"{name}: state gradients for {sorted(gs)}, states {sorted(dfinal)}"
    ours = {**gx, **{f"state {k}": v for k, v in gs.items()}}
    worst = 0.0
    for k, want in ref.items():
        got = ours[k]
        like = x[k] if k in x else states[k.split()[1]]
        assert got.shape == like.shape and got.dtype == like.dtype, f"{name} d{k}: {got.shape} {got.dtype}"
        assert torch.isfinite(got).all(), f"{name} d{k}: non-finite entries (unwritten gradient?)"
        want = torch.zeros_like(got, dtype=torch.float64) if want is None else want
        err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert err <= TOL, f"{name} d{k}: relative error {err:.2e} > {TOL:g}"
        worst = max(worst, err)
    return worst


# Each spec runs at T = 37 in one of three layouts (plain, grouped value heads, packed varlen), some with
# several checkpoint segments, and at T = 1.
def _layout(i: int) -> dict[str, object]:
    return [{}, {"HV": 4}, {"varlen": True}][i % 3] | ({"checkpoint": 16} if i % 2 == 0 else {})


CASES = [pytest.param(name, _layout(i), id=f"{name}-{'-'.join(f'{k}{v}' for k, v in _layout(i).items()) or 'plain'}")
         for i, name in enumerate(ALL_SPECS)]


@pytest.mark.parametrize(("name", "layout"), CASES)
def test_gradients_T37(name: str, layout: dict) -> None:
    check_gradients(name, T=37, **layout)


@pytest.mark.parametrize("name", ALL_SPECS)
def test_gradients_T1(name: str) -> None:
    # two BV blocks of dv: the host sums their partial key-channel gradients
    check_gradients(name, T=1, HV=4 if len(name) % 2 else None, block_v=8)


@pytest.mark.parametrize("name", ["pgdn", "ccq_gdn", "exact_atq", "rwkv7_dplr", "gdn2"])
def test_gradients_padded_blocks(name: str) -> None:
    # dk, dv not powers of two (padded lanes), two BV blocks, grouped heads, several segments
    check_gradients(name, T=9, HV=4, dk=12, dv=10, block_v=8, checkpoint=4)


@pytest.mark.parametrize("name", ["pgdn", "exact_atk", "ccq_gla"])
def test_default_states_and_no_state_gradients(name: str) -> None:
    """initial_state=None (zeros, P_0 = I/λ) and no final-state gradient: only o carries gradient."""
    rec = load(name)
    x = rec.random_inputs(2, 5, 2, 16, 16, dtype=torch.float32, seed=3)
    do = torch.randn(2, 5, 2, 16, generator=torch.Generator().manual_seed(5))
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    (rec.reference(**x64).o * do.double()).sum().backward()
    mod = load_recurrent_backward(rec.ir)
    gx, gs = mod.recurrent_backward(x, do=do, checkpoint=3)
    assert set(gs) == {n for n in rec.ir.state_names if n != "n"}
    for k, v in x64.items():
        err = ((gx[k].double() - v.grad).norm() / v.grad.norm().clamp_min(1e-30)).item()
        assert err <= TOL, f"{name} d{k}: relative error {err:.2e}"


def test_bad_route_gradient() -> None:
    rec = load("gla")
    x = rec.random_inputs(1, 2, 1, 16, 16, dtype=torch.float32)
    with pytest.raises(TensorError, match="no route"):
        load_recurrent_backward(rec.ir).recurrent_backward(x, do=torch.zeros(1, 2, 1, 16), d_route=torch.zeros(1, 2, 1, 16))


def test_render_deterministic() -> None:
    ir = load("pkda").ir
    assert render_recurrent_backward(ir) == render_recurrent_backward(ir)


def test_matrix_state_dk_limit() -> None:
    rec = load("exact_atq")
    mod = load_recurrent_backward(rec.ir)
    x = rec.random_inputs(1, 2, 1, 160, 16, dtype=torch.float32)
    with pytest.raises(TensorError, match="dk <= 128"):
        mod.recurrent_backward(x, do=torch.zeros(1, 2, 1, 16))


def test_unsupported_is_clear() -> None:
    import dataclasses

    ir = load("gla").ir
    with pytest.raises(RecurrentBackwardCodegenError, match="route"):
        render_recurrent_backward(dataclasses.replace(ir, route="bogus"))
