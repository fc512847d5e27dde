"""The generated chunked backward kernels against autograd through the float64 reference (TRITON_INTERPRET=1).

Every spec with a chunk form: the gradient of every input, param and initial state matches torch autograd
through `reference` run in float64 — fp32 inputs: relative error ‖ours − ref‖ / ‖ref‖ ≤ 1e-4; bf16 and fp16
inputs: relative RMS ≤ 2e-2. T = 150 is three chunks, the last one ragged; layouts rotate through grouped value heads
(HV = 2H), packed varlen and plain; initial states are random reachable ones and the loss also weights the
final states and the route output, so gradients flow in through all three. Every backward buffer starts as
NaN, so an element a kernel fails to write shows up as a non-finite gradient.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dgps
from dgps.codegen.chunk import render_chunk, supports_chunk, supports_chunk_backward
from dgps.runtime.compile import load_chunk
from dgps.runtime.reference import random_states, state_shapes
from dgps.runtime.tensors import Dims, TensorError

os.environ.setdefault("TRITON_INTERPRET", "1")

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"
ALL_SPECS = sorted(p.stem for p in SPECS_DIR.glob("*.dgps"))
TOL_FP32 = 1e-4
TOL_BF16 = 2e-2


@functools.cache
def load(name: str) -> dgps.Recurrence:
    path = SPECS_DIR / f"{name}.dgps"
    # tests/reductions_everything.dgps: every kind of channel reduction in one spec (also in test_reductions.py)
    return dgps.load(path if path.exists() else Path(__file__).resolve().parent / f"{name}.dgps")


CHUNK_SPECS = [n for n in ALL_SPECS if supports_chunk(load(n).ir)[0]]


def check_gradients(name: str, *, B: int = 2, T: int = 150, H: int = 2, HV: int | None = None, dk: int = 16,
                    dv: int = 16, varlen: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0,
                    gate_shift: float = 0.0, cuts: tuple[int, ...] = (1, 70), forget_channels: int = 0,
                    overrides: dict | None = None) -> float:
    rec = load(name)
    HV = HV or H
    cu = None
    if varlen:
        B = 1
        cu = torch.unique(torch.tensor([0, *(min(c, T - 1) for c in cuts), T]))
    N = len(cu) - 1 if cu is not None else B
    dims = Dims(B, T, H, HV, dk, dv)
    x = rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=seed)
    if gate_shift:
        for d in rec.ir.inputs:
            if d.domain == "log_gate" and not d.is_param:
                x[d.name] = x[d.name] + gate_shift
    if forget_channels:  # per-channel log-gates of −100 on the first key channels: those forget at every token
        for d in rec.ir.inputs:
            if d.domain == "log_gate" and not d.is_param and d.vector == "key":
                x[d.name][..., :forget_channels] = -100.0
    x = {k: v.to(dtype) for k, v in x.items()}  # the reference sees the same (rounded) inputs
    states = random_states(rec.ir, dims, N, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(B, T, HV, dv, generator=gen).to(dtype)
    dfinal = {k: torch.randn(s, generator=gen) for k, s in state_shapes(rec.ir, dims, N).items() if k != "n"}
    droute = torch.randn(B, T, HV, dv, generator=gen).to(dtype) if rec.ir.route != "none" else None

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

    mod = load_chunk(rec.ir)
    mod.DEBUG_NAN_FILL = True
    saved = dict(mod.LAUNCH_OVERRIDES)
    mod.LAUNCH_OVERRIDES.update(overrides or {})
    try:
        gx, gs = mod.chunk_backward(x, initial_state=states, do=do, d_final_state=dfinal, d_route=droute,
                                    cu_seqlens=cu)
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)
    assert set(gx) == set(x), f"{name}: gradients for {sorted(gx)}, inputs {sorted(x)}"
    assert set(gs) == set(dfinal), f"{name}: state gradients for {sorted(gs)}, states {sorted(dfinal)}"
    ours = {**gx, **{f"state {k}": v for k, v in gs.items()}}
    tol = TOL_FP32 if dtype == torch.float32 else TOL_BF16
    # With log-gates near −40 every path to a gate carries a factor e^{g} ≈ 1e-17, so the true gate gradient
    # is ~1e-17 and any fp32 form leaves cancellation noise far above it: gates are then held to the
    # tolerance times the scale of the other gradients, not to their own vanishing norm.
    gates = {d.name for d in rec.ir.inputs if d.domain == "log_gate" and not d.is_param} if gate_shift else set()
    scale_other = max((w.norm().item() for k, w in ref.items() if k not in gates and w is not None), default=1.0)
    # The same holds for what acts only through the decayed state: an untied DPLR's removal key and in-context
    # rate when the erase reads S̄_t = S_{t-1} e^{g_t}, and the initial state (tests/dplr_decayed.dgps, log-gates
    # near −40 and three channels at −100: true gradients ~2e-18 against the others' ~10, fp32 within 1e-20 of
    # them, ~6e-3 relative). Any gradient below 1e-12 of the others' scale is held to that scale.
    if gate_shift:
        gates |= {k for k, w in ref.items() if w is not None and w.norm().item() < 1e-12 * scale_other}
    worst = 0.0
    for k, want in ref.items():
        got = ours[k]
        like = x[k] if k in x else states[k.split()[1]]
        assert got.shape == like.shape and got.dtype == like.dtype, f"{name} d{k}: {got.shape} {got.dtype}"
        assert torch.isfinite(got).all(), f"{name} d{k}: non-finite entries (unwritten gradient?)"
        want = torch.zeros_like(got, dtype=torch.float64) if want is None else want
        if k in gates:
            err = (got.double() - want).norm().item() / scale_other
            assert want.norm().item() < 1e-12 * scale_other, f"{name} d{k}: the gate gradient is not vanishing"
            assert err <= tol, f"{name} d{k}: error {err:.2e} of the other gradients' scale > {tol:g}"
            continue
        err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
        assert err <= tol, f"{name} d{k}: relative error {err:.2e} > {tol:g}"
        worst = max(worst, err)
    return worst


def _layout(i: int) -> dict[str, object]:
    return [{"HV": 4}, {"varlen": True}, {}][i % 3]


CASES = [pytest.param(name, _layout(i), id=f"{name}-{'-'.join(f'{k}{v}' for k, v in _layout(i).items()) or 'plain'}")
         for i, name in enumerate(CHUNK_SPECS)]


@pytest.mark.parametrize(("name", "layout"), CASES)
def test_gradients_fp32(name: str, layout: dict) -> None:
    check_gradients(name, **layout)


@pytest.mark.parametrize("layout", [{"HV": 4}, {"varlen": True}, {}], ids=["gva", "varlen", "plain"])
def test_gradients_through_channel_reductions(layout: dict) -> None:
    """sum / l2norm evaluated on the host as derived per-token inputs, their gradients carried back through the
    reductions' adjoints: nested reductions, a key-head input, a per-head param, a decay, a gain and a value gain."""
    assert supports_chunk_backward(load("reductions_everything").ir)[0]
    check_gradients("reductions_everything", **layout)


@pytest.mark.parametrize("name", ["gdn", "kda", "gla", "pgdn", "ccq_gdn", "cler_h_gdn", "longhorn", "rwkv7_dplr",
                                  "exact_atk", "exact_atq"])
def test_gradients_bf16(name: str) -> None:
    check_gradients(name, dtype=torch.bfloat16, HV=4)


def test_pdn_partial_sums_in_a_block_count_not_a_power_of_two() -> None:
    """bwd_precond_diag leaves the per-token adjoints of the statistic (its decay's, its gain's and the map's μ share)
    as one partial sum per block of 8 key channels, in [heads, NKP, T] rows; bwd_inputs adds a chunk's NKP runs. At
    dk = 72 that is 9 blocks, the last one padded: every gradient meets the reference (grouped value heads, packed
    sequences cut inside chunks)."""
    check_gradients("pgdn", T=150, H=1, HV=2, dk=72, dv=16, varlen=True, cuts=(45, 100))


@pytest.mark.parametrize(("name", "BK", "BV"), [("ccq_gdn", 32, 16), ("ccq_gla_uncentered", 64, 32)])
def test_curvature_sums_split_over_column_blocks(name: str, BK: int, BV: int) -> None:
    """The curvature passes hold BV columns of the dk × dk sums, their rows in one or two tiles of BK: at dk = 48 that is
    three blocks of 16 columns in two key blocks (the second padded), or two of 32 columns (the second padded) in one.
    dλ arrives as partial sums of bwd_curvature_query's column blocks, and q̂, the per-key-head shares of dq and dk,
    dC_0 and dm_0 meet the reference (grouped value heads, packed sequences cut inside chunks). The sums' state pass
    and their adjoint's carry D hold one [16, BV] tile each: three row blocks; bwd_curvature_key forms E = D + Dᵀ from
    D's tile and its transposed one (a swapped index fails dk)."""
    stages = ("curvature_query", "bwd_curvature_query", "bwd_curvature_key")
    overrides = {st: (BK, BV, 4, 1) for st in stages}
    overrides.update({st: (16, BV, 4, 1) for st in ("curvature_state", "bwd_curvature_carry")})
    check_gradients(name, T=150, H=1, HV=2, dk=48, dv=16, varlen=True, cuts=(45, 100), overrides=overrides)


@pytest.mark.parametrize("name", ["ccq_gdn", "ccq_gla_uncentered"])
def test_curvature_sums_every_other_chunk(name: str) -> None:
    """C_n is stored for every other chunk of a sequence, at slot (first chunk + sequence) // 2 + n // 2, and an odd
    chunk adds its predecessor's KᵀK: packed sequences of 3, 2 and 4 chunks (odd and even counts, odd first chunks:
    a slot shared across two sequences fails it), with an initial state."""
    check_gradients(name, T=400, H=1, HV=2, dk=16, dv=16, varlen=True, cuts=(130, 200))


@pytest.mark.parametrize("name", ["ccq_gdn", "ccq_gla_uncentered"])
def test_curvature_initial_sums_not_symmetric(name: str) -> None:
    """An initial C_0 that is not symmetric (the sums it continues are): the read is C_t q as the reference takes it, not
    C_tᵀ q, and the backward's C_tᵀ S, dC_0 and dλ follow. (The forward had formed C_tᵀ q: o 6.9e-2 and dλ 0.74 off.)"""
    rec = load(name)
    B, T, H, HV, dk, dv = 1, 100, 2, 2, 16, 16
    dims = Dims(B, T, H, HV, dk, dv)
    x = rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=1)
    states = random_states(rec.ir, dims, B, 1)
    gen = torch.Generator().manual_seed(5)
    states["C"] = states["C"] + 0.5 * torch.randn(states["C"].shape, generator=gen)
    assert not torch.allclose(states["C"], states["C"].mT)
    do = torch.randn(B, T, HV, dv, generator=gen)
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    s64 = {k: v.double().requires_grad_(k != "n") for k, v in states.items()}
    ref = rec.reference(**x64, initial_state=s64, output_final_state=True)
    leaves = [*x64.values(), s64["C"], s64["m"]]
    want = torch.autograd.grad((ref.o * do.double()).sum(), leaves, allow_unused=True)
    mod = load_chunk(rec.ir)
    out = mod.chunk_forward(x, initial_state=states, output_final_state=True)
    gx, gs = mod.chunk_backward(x, initial_state=states, do=do)
    got = [*(gx[k] for k in x64), gs["C"], gs["m"]]
    pairs = [("o", out.o, ref.o), ("C_final", out.final_state["C"], ref.final_state["C"])]
    pairs += [(f"d{n}", g, w) for n, g, w in zip([*x64, "C0", "m0"], got, want, strict=True) if w is not None]
    for n, g, w in pairs:
        err = ((g.double() - w.detach()).norm() / w.norm().clamp_min(1e-30)).item()
        assert err <= TOL_FP32, f"{name} {n}: relative error {err:.2e}"


@pytest.mark.parametrize(("name", "beta_scale"), [("cler_h_gdn", 1e-4), ("cler_h_kda", 1e-4),
                                                 ("residual_no_gain", None)])
def test_residual_route_solve_form(name: str, beta_scale: float | None) -> None:
    """The residual route through the solve's form (docs/chunk_forms.md §8a: T = (I + L' Diag(β))⁻¹, R = Ũ − W H_n,
    U = β ⊙ R): no division by β, so gains near zero and exactly zero keep the route and every gradient, dβ included;
    without a gain R is U. Forward (o, the route, S) and the gradients of o, the route and S against float64."""
    rec = load(name)
    B, T, H, HV, dk, dv = 2, 150, 2, 2, 16, 16
    dims = Dims(B, T, H, HV, dk, dv)
    x = rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=2)
    if beta_scale is not None:
        x["beta"] = x["beta"] * beta_scale
        x["beta"][:, 10:20] = 0.0
    states = random_states(rec.ir, dims, B, 2)
    gen = torch.Generator().manual_seed(3)
    do, dr = torch.randn(B, T, HV, dv, generator=gen), torch.randn(B, T, HV, dv, generator=gen)
    ds = torch.randn(states["S"].shape, generator=gen)
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    s64 = {k: v.double().requires_grad_() for k, v in states.items()}
    ref = rec.reference(**x64, initial_state=s64, output_final_state=True)
    loss = (ref.o * do.double()).sum() + (ref.route * dr.double()).sum() + (ref.final_state["S"] * ds.double()).sum()
    want = torch.autograd.grad(loss, [*x64.values(), s64["S"]], allow_unused=True)
    mod = load_chunk(rec.ir)
    out = mod.chunk_forward(x, initial_state=states, output_final_state=True)
    gx, gs = mod.chunk_backward(x, initial_state=states, do=do, d_route=dr, d_final_state={"S": ds})
    pairs = [("o", out.o, ref.o), ("route", out.route, ref.route), ("S", out.final_state["S"], ref.final_state["S"])]
    pairs += [(f"d{n}", g, w) for n, g, w in zip([*x64, "S0"], [*(gx[n] for n in x64), gs["S"]], want, strict=True)]
    for n, g, w in pairs:
        assert torch.isfinite(g).all(), f"{name} {n}: non-finite"
        err = ((g.double() - w.detach()).norm() / w.norm().clamp_min(1e-30)).item()
        assert err <= TOL_FP32, f"{name} {n}: relative error {err:.2e}"


@pytest.mark.parametrize("name", ["simple_gla", "gla", "mamba2"])
def test_additive_state_passes_split_over_key_blocks(name: str) -> None:
    """The additive family's state passes hold one block of key rows per program (compiler/plan.py:
    split_reverse_pass): at dk = 48 with BK = 16 that is three blocks (the third padded), and dU is formed after the
    reverse pass from all of them (bwd_local_values, in blocks of 16 key channels too); grouped value heads, packed
    sequences cut inside chunks, a gain (mamba2's dt) formed on the loads."""
    stages = ("state_pass", "bwd_state", "bwd_local_values")
    check_gradients(name, T=150, H=1, HV=2, dk=48, dv=24, varlen=True, cuts=(45, 100),
                    overrides={st: (16, 16, 4, 1) for st in stages})


@pytest.mark.parametrize("name", ["gdn", "kda"])
def test_gradients_fp16(name: str) -> None:
    check_gradients(name, dtype=torch.float16, HV=4)


@pytest.mark.parametrize("name", ["gdn2", "pkda", "ccq_gla", "cler_h_kda", "rwkv7_dplr"])
def test_gradients_padded_channels_gva_varlen(name: str) -> None:
    # dk, dv not powers of two (padded lanes), two dv blocks in the gradient stage, grouped heads
    check_gradients(name, T=70, H=1, HV=2, dk=12, dv=40, varlen=True)


@pytest.mark.parametrize("name", ["gdn", "kda", "simple_gla"])
def test_gradients_t1(name: str) -> None:
    check_gradients(name, T=1)


@pytest.mark.parametrize("name", ["kda", "gla", "gdn", "rwkv7_dplr"])
def test_strong_gates(name: str) -> None:
    # log-gates around −40 per token: e^b underflows inside a chunk; every factor must stay finite and every
    # gradient but the (vanishing) gate's must meet the fp32 tolerance
    check_gradients(name, T=80, gate_shift=-40.0)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["kda", "gla", "gdn2"]), T=st.integers(1, 140), G=st.sampled_from([1, 2]),
       dk=st.sampled_from([8, 16, 24]), cuts=st.lists(st.integers(1, 139), min_size=0, max_size=3),
       strong=st.booleans(), seed=st.integers(0, 2**16))
# found by this test (CI, 2026-12-03): a 16-token block holding one valid row past a sequence start, strong gates, on
# the bounded diagonal form (the rows past the end loaded b = 0 above the reference: e^{+|r|} times 0 gave NaN)
@example(name="kda", T=18, G=1, dk=8, cuts=[1], strong=True, seed=0)
def test_vector_decay_backward_hypothesis(name: str, T: int, G: int, dk: int, cuts: list[int], strong: bool,
                                          seed: int) -> None:
    """Per-channel decay's backward stages (bwd_scores, bwd_intra's 16-token row blocks, decay_keys): sequence ends
    and varlen boundaries anywhere inside a row block, grouped heads, padded key channels, strong gates."""
    check_gradients(name, T=T, H=1, HV=G, dk=dk, dv=8, varlen=bool(cuts), cuts=tuple(cuts), seed=seed,
                    gate_shift=-40.0 if strong else 0.0)


# untied DPLR: rwkv7_dplr's erase reads the undecayed state (rows decay with b_{t-1}); tests/dplr_decayed.dgps the
# decayed one (b_t); tests/dplr_gained.dgps the decayed one with a write gain (v' = β v), tests/dplr_gain_constant.dgps
# with a constant one (v' = 0.5 v)
UNTIED = ["rwkv7_dplr", "dplr_decayed", "dplr_gained", "dplr_gain_constant", "dplr_tied"]  # and the tied DPLR (f = k)


@pytest.mark.parametrize("layout", [{"HV": 4}, {"varlen": True}, {}], ids=["gva", "varlen", "plain"])
def test_untied_dplr_decayed_erase_gradients(layout: dict) -> None:
    assert supports_chunk_backward(load("dplr_decayed").ir)[0]
    check_gradients("dplr_decayed", **layout)


@pytest.mark.parametrize("name", UNTIED)
def test_untied_dplr_gradients_with_channels_that_forget(name: str) -> None:
    """Log-gates of −100 on a third of the key channels (e^−100 per token) next to ordinary ones: every exponent of the
    chunk backward stays ≤ 0, so the gradients stay finite and meet the fp32 tolerance."""
    check_gradients(name, T=100, H=1, HV=2, dk=12, dv=8, forget_channels=4, varlen=True, cuts=(37,))


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(UNTIED), T=st.integers(1, 140), G=st.sampled_from([1, 2]), dk=st.sampled_from([8, 16, 24]),
       cuts=st.lists(st.integers(1, 139), min_size=0, max_size=3), strong=st.booleans(), forget=st.sampled_from([0, 3]),
       seed=st.integers(0, 2**16))
def test_untied_dplr_backward_hypothesis(name: str, T: int, G: int, dk: int, cuts: list[int], strong: bool, forget: int,
                                         seed: int) -> None:
    """The untied DPLR backward (bwd_scores' four matrices, bwd_intra's row and column operands with the erase rows'
    own decay, both write streams, the exclusive cumsum's dbx): sequence ends and varlen boundaries anywhere inside
    a row block, grouped heads, padded key channels, strong gates and channels at −100."""
    check_gradients(name, T=T, H=1, HV=G, dk=dk, dv=8, varlen=bool(cuts), cuts=tuple(cuts), seed=seed,
                    gate_shift=-40.0 if strong else 0.0, forget_channels=forget)


# the exact preconditioner: ATK, ATQ, and ATK inside a gated delta rule (tests/exact_gated.dgps: L2-normalised keys,
# a scalar decay and a gain around k̃, λ = 0.5)
EXACT = ["exact_atk", "exact_atq", "exact_gated"]


@pytest.mark.parametrize("name", EXACT)
def test_exact_precond_long_sequences(name: str) -> None:
    """T = 330 (six chunks, the last ragged) and packed sequences cut inside chunks, grouped value heads: the Gram
    carry stays definite (every gradient finite, at the fp32 tolerance), P_0's gradient included."""
    check_gradients(name, T=330, H=1, HV=2, dk=32, dv=16, varlen=True, cuts=(45, 200))


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(EXACT), T=st.integers(1, 200), G=st.sampled_from([1, 2]), dk=st.sampled_from([8, 16, 24]),
       cuts=st.lists(st.integers(1, 199), min_size=0, max_size=3), seed=st.integers(0, 2**16))
def test_exact_precond_backward_hypothesis(name: str, T: int, G: int, dk: int, cuts: list[int], seed: int) -> None:
    """The exact preconditioner's chunked backward (bwd_precond_exact's z = P_t dx_t and in-chunk key terms,
    bwd_precond_gram's reverse Gram-adjoint carry and P_0 adjoint): sequence ends and varlen boundaries anywhere in a
    chunk, grouped heads, padded key channels."""
    check_gradients(name, T=T, H=1, HV=G, dk=dk, dv=8, varlen=bool(cuts), cuts=tuple(cuts), seed=seed)


def test_every_chunk_spec_has_a_chunked_backward() -> None:
    assert CHUNK_SPECS, "no spec with a chunk form"
    for name in CHUNK_SPECS:
        ok, why = supports_chunk_backward(load(name).ir)
        assert ok, f"{name}: {why}"
        assert "chunk_bwd_grad_kernel" in render_chunk(load(name).ir)


def test_a_call_past_the_partial_sums_int32_rows_is_refused() -> None:
    """A per-token partial sum's row offset is int32 (codegen/address.py: partial_row): a call whose tokens × heads ×
    key blocks reach 2^31 gets a TensorError before any launch, not offsets that wrap. Meta tensors: no memory; one
    token fewer passes the check (and stops later, at the meta device's first data access)."""
    rec = load("pgdn")
    mod = load_chunk(rec.ir)
    small = rec.random_inputs(1, 8, 16, 16, 16, 16, dtype=torch.bfloat16)

    def meta(T: int) -> dict[str, torch.Tensor]:
        return {k: torch.empty((1, T, *v.shape[2:]) if v.dim() >= 2 and v.shape[1] == 8 else v.shape, dtype=v.dtype,
                               device="meta") for k, v in small.items()}

    # dk = 16 in blocks of 8: two blocks; 16 heads; 2^26 tokens
    with pytest.raises(TensorError, match=r"67108864 tokens × 16 heads × 2 key blocks reach 2\^31"):
        mod.chunk_forward(meta(2**26))
    with pytest.raises(Exception) as info:  # noqa: PT011 - any failure but the guard's
        mod.chunk_forward(meta(2**26 - 1))
    assert "reach 2^31" not in str(info.value)


def test_a_call_past_the_grids_chunk_axis_is_refused() -> None:
    """The chunk kernels hold the chunks on their grid's y axis (CUDA: at most 65535): a call of more chunks gets a
    TensorError before any launch. Meta tensors; 65535 chunks pass the check (and stop later, at the first data
    access)."""
    rec = load("gdn")
    mod = load_chunk(rec.ir)
    small = rec.random_inputs(1, 8, 1, 16, 16, dtype=torch.bfloat16)

    def meta(T: int) -> dict[str, torch.Tensor]:
        return {k: torch.empty((1, T, *v.shape[2:]) if v.dim() >= 2 and v.shape[1] == 8 else v.shape, dtype=v.dtype,
                               device="meta") for k, v in small.items()}

    with pytest.raises(TensorError, match=r"65536 chunks of 64 tokens in one call, past the 65535"):
        mod.chunk_forward(meta(65536 * 64))
    with pytest.raises(Exception) as info:  # noqa: PT011 - any failure but the guard's
        mod.chunk_forward(meta(65535 * 64))
    assert "65535 a kernel grid" not in str(info.value)


def test_bad_gradient_shapes() -> None:
    rec = load("gdn")
    mod = load_chunk(rec.ir)
    x = rec.random_inputs(1, 4, 1, 16, 16, dtype=torch.float32)
    with pytest.raises(TensorError, match=r"do has shape \[1, 4, 1, 8\], expected \[1, 4, 1, 16\]"):
        mod.chunk_backward(x, do=torch.zeros(1, 4, 1, 8))
    with pytest.raises(TensorError, match="no route"):
        mod.chunk_backward(x, do=torch.zeros(1, 4, 1, 16), d_route=torch.zeros(1, 4, 1, 16))
    with pytest.raises(TensorError, match="final-state gradient `S`"):
        mod.chunk_backward(x, do=torch.zeros(1, 4, 1, 16), d_final_state={"S": torch.zeros(1, 1, 16, 8)})
    with pytest.raises(TensorError, match="unknown final-state"):
        mod.chunk_backward(x, do=torch.zeros(1, 4, 1, 16), d_final_state={"P": torch.zeros(1)})


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _check_training_path(name: str, D: int, seed: int, overrides: dict | None = None) -> None:
    """The training path (forward keeps its buffers, the backward reuses them) at dk = dv = D, T = 70, grouped
    value heads, every backward buffer starting as NaN, against float64 autograd; `overrides`: launch settings."""
    rec = load(name)
    mod = load_chunk(rec.ir)
    T = 70
    x = rec.random_inputs(B=1, T=T, H=1, dk=D, dv=D, HV=2, dtype=torch.float32, seed=seed)
    do = torch.randn(1, T, 2, D, generator=torch.Generator().manual_seed(seed + 1))
    saved = dict(mod.LAUNCH_OVERRIDES)
    mod.LAUNCH_OVERRIDES.update(overrides or {})
    old, mod.DEBUG_NAN_FILL = mod.DEBUG_NAN_FILL, True
    try:
        out, kept = mod.chunk_forward_train(x)
        grads, _ = mod.chunk_backward(x, do=do, kept=kept)
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)
        mod.DEBUG_NAN_FILL = old
    x64 = {k: v.double().requires_grad_(True) for k, v in x.items()}
    ref = rec.reference(**x64)
    assert _rel(out.o, ref.o) <= TOL_FP32
    (ref.o * do.double()).sum().backward()
    for n, g in grads.items():
        assert torch.isfinite(g).all(), f"{name}: gradient of {n} has unwritten (NaN) elements"
        assert _rel(g, x64[n].grad) <= TOL_FP32, (name, n, _rel(g, x64[n].grad))


@pytest.mark.parametrize("name", ["gdn", "simple_gla", "kda", "rwkv7_dplr", "pkda", "cler_h_kda"])
def test_training_path_at_the_reference_head_size(name: str) -> None:
    """dk = dv = 128, where the launch table's blocks are narrower than a head (BK = 64, BV ≤ dv). At the other
    tests' dv = 16 every block covers the whole head, which once hid a stage that left half of dv's gradient
    unwritten."""
    _check_training_path(name, 128, seed=3)


@pytest.mark.parametrize("name", ["gdn", "deltanet", "simple_gla", "la", "kda", "ccq_gdn", "cler_h_gdn", "pgdn",
                                  "rwkv7_dplr"])
def test_chunk_gradients_split_over_key_channel_blocks(name: str) -> None:
    """bwd_grads runs one program per block of key channels: with BK = 8 at dk = 32 (four blocks) the per-token
    sums over key channels (dβ, the scalar decay's db) arrive as partial sums, the full-width terms and the
    target's adjoint come from block 0 only (the delta family's: from bwd_solve, whose L' and Q̂ ⋆ A sum four key
    blocks and whose c×c products two dv blocks of 16), and the gradients equal the unsplit ones' reference."""
    blocks = (8, 16, 4, 1)
    _check_training_path(name, 32, seed=7, overrides={"bwd_grads": blocks, "bwd_key_grads": blocks, "bwd_solve": blocks})


@pytest.mark.parametrize("name", ["pgdn", "pkda"])
def test_pdn_statistic_split_over_key_channel_blocks(name: str) -> None:
    """The PDN statistic is elementwise per key channel: with BK below dk its forward and backward run one
    program per block of channels (the decay adjoint as per-block partial sums) and give the same gradients."""
    blocks = (8, 16, 4, 1)  # BK = 8 at dk = 32: four channel blocks
    _check_training_path(name, 32, seed=5, overrides={"precond_diag": blocks, "bwd_precond_diag": blocks})


@pytest.mark.parametrize("name", ["kda", "gla"])
def test_vector_decay_gate_gradient_as_accurate_as_the_others_in_bf16(name: str) -> None:
    """The per-channel log-gate gradient is q ⊙ dq − a ⊙ da summed in reverse over the chunk; each score pair adds
    to both terms, so bf16-rounded operands in the pair products left it 3× less accurate than the other gradients
    (kda, T = 256: g 9.3e-3 against q, k, v at ~3e-3). With fp32-level operands there it is at their level."""
    rec = load(name)
    mod = load_chunk(rec.ir)
    T, D = 256, 64
    x = rec.random_inputs(B=1, T=T, H=1, dk=D, dv=D, HV=2, dtype=torch.float32, seed=11)
    x = {k: v.to(torch.bfloat16) for k, v in x.items()}
    do = torch.randn(1, T, 2, D, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    out, kept = mod.chunk_forward_train(x)
    grads, _ = mod.chunk_backward(x, do=do, kept=kept)
    x64 = {k: v.double().requires_grad_(True) for k, v in x.items()}
    (rec.reference(**x64).o * do.double()).sum().backward()
    err = {n: _rel(g, x64[n].grad) for n, g in grads.items()}
    assert err["g"] <= 1.25 * max(err["q"], err["k"], err["v"]), err


@pytest.mark.parametrize("name", ["gdn", "simple_gla"])
def test_training_path_with_the_output_unfused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The training forward with the output in a launch of its own (the plan's `unfused_when`, forced: the
    interpreter keeps the fused form), the backward rerunning the state pass: o and every gradient against float64
    autograd."""
    mod = load_chunk(load(name).ir)
    monkeypatch.setattr(mod, "FUSE_OUTPUT", False)
    _check_training_path(name, 32, seed=5)


@pytest.mark.parametrize("name", ["vector_decay_constant", "scalar_decay_constant", "gain_constant"])
def test_constant_operands(name: str) -> None:
    # tests/{vector,scalar}_decay_constant.dgps, tests/gain_constant.dgps: a decay or gain whose expression is (or
    # simplifies to) a constant still plans, lowers and differentiates as its kind says (vector(c): the plan's gate
    # operand ends in dk; scalar(c) and gain 0.5: operands with no dims); three chunks, grouped value heads
    assert supports_chunk_backward(load(name).ir)[0]
    check_gradients(name, HV=4)


@pytest.mark.parametrize("name", ["gdn", "kda", "pgdn"])
def test_a_step_without_states_forms_no_zero_states(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step with no initial state and no final-state gradient forms no [N, HV, dk, dv] zeros: the package
    passes a zero_state (one element, expanded) and the kernels start from zero without reading (S0_GIVEN and
    DS_FIN_GIVEN false). Its output and every gradient equal, bit for bit, those of the same step given explicit zero
    states, which the kernels read. (pgdn: its statistic's zero A_0 is made real; only S is never formed.)"""
    from dgps.runtime.reference import is_zero_state, zero_state

    rec = dgps.load(SPECS_DIR / f"{name}.dgps")
    pkg = dgps.compile(str(SPECS_DIR / f"{name}.dgps"))
    B, T, H, D = 2, 70, 2, 16
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.float32, seed=3)
    do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(4))
    s_shape = (B, H, D, D)

    def step(**kw) -> tuple[torch.Tensor, ...]:  # noqa: ANN003
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        o = pkg.forward(**leaves, **kw).o
        o.backward(do)
        return (o.detach(), *(leaves[n].grad for n in sorted(leaves)))

    zeros_made = []
    real_zeros = torch.zeros

    def counting_zeros(*shape, **kw):  # noqa: ANN002, ANN003, ANN202
        zeros_made.append(tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size))
                          else shape)
        return real_zeros(*shape, **kw)

    monkeypatch.setattr(torch, "zeros", counting_zeros)
    lazy = step()
    monkeypatch.setattr(torch, "zeros", real_zeros)
    assert s_shape not in zeros_made, zeros_made
    given = {n: torch.zeros(s) for n, s in state_shapes(rec.ir, Dims(B, T, H, H, D, D), B).items()}
    if "P" in given:
        del given["P"]
    explicit = step(initial_state=given)
    for a, b in zip(lazy, explicit, strict=True):
        assert torch.equal(a, b)
    z = zero_state(s_shape, torch.float32, torch.device("cpu"))
    assert is_zero_state(z) and z.shape == s_shape and z.untyped_storage().nbytes() == 4
    assert not is_zero_state(z.contiguous()) and not is_zero_state(torch.zeros(1).expand(s_shape))
    assert torch.equal(z.contiguous(), torch.zeros(s_shape))
