"""The PDN statistic's passes (compiler/plan.py: rule_precond_diag, _bwd_precond_diag, _bwd_precond_carry): its
carries A_n sequential over chunks (precond_state), every chunk's statistic, map and k̃ in parallel from them
(precond_diag); in the backward every chunk's adjoint from a zero carry (bwd_precond_diag), the carries over the chunks
(bwd_precond_carry), completed per token by bwd_inputs. Under TRITON_INTERPRET=1, with a varlen pack whose sequences
start and end inside chunks, initial statistics and a final-state adjoint: the stored carries against a float64
statistic, and the forward, final states and every gradient (initial states' included) against the float64 reference.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dgps  # noqa: E402
from dgps.compiler import plan as plan_module  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402
from dgps.runtime.reference import random_states  # noqa: E402
from dgps.runtime.tensors import Dims  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
CU = [0, 70, 200, 290]  # chunk boundaries of 64 fall inside every sequence; the second spans three chunks


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (a - b).norm().item() / max(b.norm().item(), 1e-300)


def test_the_plan_splits_the_statistic() -> None:
    p = plan_module.build_plan(dgps.load(SPECS / "pgdn.dgps").ir, 64, 16)
    state, diag = p.stage("precond_state"), p.stage("precond_diag")
    assert state.attr("sequential") == "chunks" and diag.attr("sequential") is None
    assert "An" in state.output_names and "An" in diag.inputs and "A_final" in state.output_names
    assert p.stage("cumsum_gP").attr("fused") == "precond_state"
    bp = plan_module.build_backward_plan(p)
    assert bp is not None
    kinds = bp.kinds()
    assert kinds.index("bwd_precond_diag") < kinds.index("bwd_precond_carry") < kinds.index("bwd_inputs")
    assert "dA_n" in next(st for st in bp.stages if st.kind == "bwd_inputs").inputs


def _statistic64(x: dict, cu: list[int]) -> list[torch.Tensor]:
    """pgdn's statistic at every chunk's start, float64 from its definition: A_t = e^{gP_t} A_{t-1} + βP_t k̂_t²
    (k̂ the L2-normalised key), per sequence from its initial A."""
    k = F.normalize(x["k"].double(), dim=-1)
    out = []
    for n, (a, b) in enumerate(zip(cu, cu[1:], strict=False)):
        A = x["A0"][n].double()
        for t in range(a, b):
            if (t - a) % 64 == 0:
                out.append(A.clone())
            A = torch.exp(x["gP"][0, t].double())[:, None] * A + x["betaP"][0, t].double()[:, None] * k[0, t] ** 2
    return out


@pytest.mark.parametrize("bk", [16, 4])
def test_carries_match_the_statistic(bk: int) -> None:
    """The carries a training forward keeps are the statistic at each chunk's start (bk = 4: four blocks of key
    channels per head, each its own program)."""
    rec = dgps.load(SPECS / "pgdn.dgps")
    x = {k: v.float() for k, v in rec.random_inputs(1, CU[-1], 2, 16, 16, 2, seed=4).items()}
    states = random_states(rec.ir, Dims(1, CU[-1], 2, 2, 16, 16), 3, seed=4)
    cu = torch.tensor(CU, dtype=torch.int32)
    mod = load_chunk(rec.ir)
    saved = dict(mod.LAUNCH_OVERRIDES)
    mod.LAUNCH_OVERRIDES.update(precond_state=(bk, 16, 1, 1))
    try:
        _, kept = mod.chunk_forward_train(x, initial_state={n: s.float() for n, s in states.items()}, cu_seqlens=cu)
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)
    want = torch.stack(_statistic64({**x, "A0": states["A"]}, CU))  # [chunks, H, dk]
    got = dict(zip(mod._KEPT_BUFFERS, kept, strict=True))["an_buf"].reshape(-1, 2, 16)[:len(want)]
    assert want.abs().min() > 0 and _rel(got, want) <= 1e-6


@pytest.mark.parametrize("name,blocks", [("pdn", None), ("pgdn", (4, 16, 1, 1)), ("pkda", (8, 16, 1, 1))])
def test_passes_match_the_reference(name: str, blocks: tuple | None) -> None:
    """Forward, final states and every gradient, the initial statistic's and S's included, from a final-state adjoint
    too (it enters the statistic's carries at each sequence's last row); `blocks`: the statistic's four passes at
    narrower key-channel blocks. Strong decays on a few tokens (gP = −30: the carry across them all but vanishes)."""
    rec = dgps.load(SPECS / f"{name}.dgps")
    T, H, HV, D = CU[-1], 1, 2, 16
    x = {k: v.float() for k, v in rec.random_inputs(1, T, H, D, D, HV, seed=3).items()}
    x["gP"][0, 100:103] = -30.0
    states = {n: s.float() for n, s in random_states(rec.ir, Dims(1, T, H, HV, D, D), 3, seed=3).items()}
    cu = torch.tensor(CU, dtype=torch.int32)
    gen = torch.Generator().manual_seed(9)
    do = torch.randn(1, T, HV, D, generator=gen)
    dfin = {"S": torch.randn(3, HV, D, D, generator=gen), "A": torch.randn(3, H, D, generator=gen)}

    x64 = {k: v.double().requires_grad_(True) for k, v in x.items()}
    s64 = {k: v.double().requires_grad_(True) for k, v in states.items()}
    ref = rec.reference(**x64, initial_state=s64, output_final_state=True, cu_seqlens=cu)
    loss = (ref.o * do.double()).sum() + sum((ref.final_state[k] * g.double()).sum() for k, g in dfin.items())
    loss.backward()

    mod = load_chunk(rec.ir)
    saved = dict(mod.LAUNCH_OVERRIDES)
    if blocks is not None:
        mod.LAUNCH_OVERRIDES.update({s: blocks for s in ("precond_state", "precond_diag", "bwd_precond_diag",
                                                           "bwd_precond_carry")})
    old, mod.DEBUG_NAN_FILL = mod.DEBUG_NAN_FILL, True
    try:
        out = mod.chunk_forward(x, initial_state=states, output_final_state=True, cu_seqlens=cu)
        _, kept = mod.chunk_forward_train(x, initial_state=states, cu_seqlens=cu)
        grads, dstates = mod.chunk_backward(x, initial_state=states, do=do, d_final_state=dfin, kept=kept,
                                            cu_seqlens=cu)
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)
        mod.DEBUG_NAN_FILL = old
    assert _rel(out.o, ref.o) <= 1e-5
    for s in ("S", "A"):
        assert _rel(out.final_state[s], ref.final_state[s]) <= 1e-5, s
    for n, t in x64.items():
        assert torch.isfinite(grads[n]).all() and _rel(grads[n], t.grad) <= 1e-4, (n, _rel(grads[n], t.grad))
    for n, t in s64.items():
        assert _rel(dstates[n], t.grad) <= 1e-4, (n, _rel(dstates[n], t.grad))


def test_fast_log_only_in_the_pdn_map() -> None:
    """The PDN map's log goes through `_fast_log` (the SFU's lg2.approx on the GPU, the exact log under the
    interpreter), in the forward, the statistic's backward and the chain rule's derivatives of map(A) k; every other
    log of a generated module — the gates' logsigmoid, softplus — keeps the exact form."""
    import re

    import sympy as sp

    from dgps.codegen.chunk import render_chunk
    from dgps.codegen.triton_expr import triton_expr

    x = sp.Symbol("x", real=True)
    assert triton_expr(sp.log(x + 1), {"x": "b_x"}, fast_log=True) == "_fast_log((1.0 + b_x), INTERPRET)"
    assert triton_expr(sp.log(x + 1), {"x": "b_x"}) == "tl.log((1.0 + b_x))"
    for name in ("pgdn", "pkda", "pdn"):
        src = render_chunk(dgps.load(SPECS / f"{name}.dgps").ir)
        kernels = re.split(r"\n@triton\.jit\n", src)
        uses = {k.split("(", 1)[0].removeprefix("def ") for k in kernels if "_fast_log(" in k.split(":", 1)[-1]}
        assert uses == {"chunk_precond_diag_kernel", "chunk_bwd_precond_diag_kernel", "chunk_bwd_inputs_kernel"}, \
            (name, uses)
    # in the chain rule only the map's terms: gdn_fused_gate's gates keep the exact log
    src = render_chunk(dgps.load(SPECS / "gdn_fused_gate.dgps").ir)
    assert "_fast_log(" not in src and "tl.log(" in src


def test_carry_and_chunk_passes_must_share_key_blocks() -> None:
    """bwd_precond_carry adds the carry's share of the decay adjoint to bwd_precond_diag's partial sums, one per block
    of key channels: launch settings that give the two different blocks are refused with a clear error."""
    rec = dgps.load(SPECS / "pgdn.dgps")
    x = {k: v.float() for k, v in rec.random_inputs(1, 70, 1, 16, 16, 1, seed=1).items()}
    mod = load_chunk(rec.ir)
    saved = dict(mod.LAUNCH_OVERRIDES)
    mod.LAUNCH_OVERRIDES.update(bwd_precond_carry=(8, 16, 1, 1), bwd_precond_diag=(16, 16, 4, 1))
    try:
        with pytest.raises(ValueError, match="must share BK"):
            _, kept = mod.chunk_forward_train(x)
            mod.chunk_backward(x, do=torch.ones(1, 70, 1, 16), kept=kept)
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)
