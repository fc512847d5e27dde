"""Stored scores read by the reverse state pass (compiler/plan.py: scores_in_reverse_pass; on in the shipped plan,
KEEP_SCORES, since run 123 checked and timed it on a GPU): a training forward stores the output's Sc = tril(Q̂ Aᵀ ⊙
e^{b_i − b_j}) (scalar or no decay: _scores_kept), or per-channel decay's interaction has stored Q⋆A already (off in
the shipped plan, QA_IN_REVERSE_PASS: slower in run 123, kept measurable), and the reverse state pass forms dU's
chunk-local share from them, with no bwd_local_values launch. Under the interpreter, with both constants on (and once
off: bwd_local_values again): the plan and the launches say so, and o and every gradient match the float64 reference
whichever kernel stores the scores (the fused state pass + output, the unfused output for few programs or
keep_states, the backward's rerun without kept buffers; the interaction for kda)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
import dgps.compiler.plan as plan_mod  # noqa: E402
from dgps.codegen.buffers import kept_buffers  # noqa: E402
from dgps.compiler.plan import build_backward_plan, build_plan, scores_in_reverse_pass, scores_kept  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402
from dgps.runtime.reference import random_states  # noqa: E402
from dgps.runtime.tensors import Dims  # noqa: E402

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"


@pytest.fixture
def keep_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_mod, "KEEP_SCORES", True)
    monkeypatch.setattr(plan_mod, "QA_IN_REVERSE_PASS", True)
    monkeypatch.setattr(plan_mod, "SCORES_WITH_READ_CORRECTION", True)
    monkeypatch.setattr(plan_mod, "SCORES_WITH_PRECONDITIONER", True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def test_on_in_the_shipped_plan() -> None:
    assert plan_mod.KEEP_SCORES and not plan_mod.QA_IN_REVERSE_PASS and plan_mod.SCORES_WITH_READ_CORRECTION
    assert not plan_mod.SCORES_WITH_PRECONDITIONER
    for name in ("gdn", "ccq_gdn", "ccq_gdn_uncentered", "cler_h_gdn"):
        assert scores_kept(build_plan(dgps.load(SPEC_DIR / f"{name}.dgps").ir, 64, 16)), name
    pgdn = build_plan(dgps.load(SPEC_DIR / "pgdn.dgps").ir, 64, 16)
    assert not scores_kept(pgdn) and "bwd_local_values" in build_backward_plan(pgdn).kinds()
    kda = build_plan(dgps.load(SPEC_DIR / "kda.dgps").ir, 64, 16)
    assert scores_in_reverse_pass(kda) is None and "bwd_local_values" in build_backward_plan(kda).kinds()


# spec -> the scores its reverse pass reads (None: bwd_local_values), every constant on: the output's where it forms
# them (a scalar or no decay: routes, read corrections and preconditioners included); the interaction's Q⋆A with
# per-channel decay (tied family, no route or read correction)
SOURCES = {"gdn": "output.Sc", "deltanet": "output.Sc", "gdn_fused_gate": "output.Sc", "longhorn": "output.Sc",
           "ccq_gdn": "output.Sc", "ccq_gdn_uncentered": "output.Sc", "cler_h_gdn": "output.Sc",
           "clvr_gdn": "output.Sc", "pgdn": "output.Sc", "pdn": "output.Sc", "exact_atk": "output.Sc",
           "exact_atq": None,
           "kda": "interaction.Sqa", "gdn2": "interaction.Sqa", "pkda": "interaction.Sqa", "cler_h_kda": None,
           "clvr_kda": None, "gla": None, "rwkv7_dplr": None}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_plan_keeps_the_scores(name: str, keep_scores: None) -> None:
    p = build_plan(dgps.load(SPEC_DIR / f"{name}.dgps").ir, 64, 16)
    bp = build_backward_plan(p)
    assert bp is not None
    source = SOURCES[name]
    assert scores_in_reverse_pass(p) == source
    assert scores_kept(p) == (source == "output.Sc") == ("output" in bp.kept)
    assert (source is not None and source in bp.reads()) == ("bwd_local_values" not in bp.kinds()) == \
        (source is not None)
    if source == "output.Sc":
        assert [o.name for o in p.stage("output").outputs] == ["o", "Sc"]
        assert kept_buffers(p, ("output",)) == ["s_buf"]
        assert next(m for m in bp.memory if m.kind == "output").kept_bytes == 128
    if source == "interaction.Sqa":  # kept for the chunk gradients already: nothing more held
        assert "s_buf" in kept_buffers(p, ("interaction",))


@pytest.mark.parametrize("name", ["gdn", "deltanet", "kda", "cler_h_gdn", "clvr_gdn", "ccq_gdn", "pgdn", "exact_atk"])
@pytest.mark.parametrize("form", ["fused", "unfused", "keep_states", "no_kept", "varlen", "constant_off"])
def test_gradients_against_the_reference(name: str, form: str, keep_scores: None, launched: Callable,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if form == "constant_off":  # the form before run 123: bwd_local_values forms dU's local share
        monkeypatch.setattr(plan_mod, "KEEP_SCORES", False)
        monkeypatch.setattr(plan_mod, "QA_IN_REVERSE_PASS", False)
        monkeypatch.setattr(plan_mod, "SCORES_WITH_READ_CORRECTION", False)
        monkeypatch.setattr(plan_mod, "SCORES_WITH_PRECONDITIONER", False)
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    assert ("chunk_bwd_local_values_kernel" in mod._KERNEL_ARGS) == (form == "constant_off")
    assert ("s_buf" in mod._KEPT_BUFFERS) == (form != "constant_off" or name == "kda")
    if hasattr(mod, "FUSE_OUTPUT"):  # the fused state pass + output (scalar or no decay)
        monkeypatch.setattr(mod, "FUSE_OUTPUT", form != "unfused")
    B, T, H, D = (1, 150, 2, 16) if form == "varlen" else (2, 90, 2, 16)
    x = rec.random_inputs(B, T, H, D, D, HV=H, dtype=torch.float32, seed=3)
    cu = torch.tensor([0, 37, 101, 150], dtype=torch.int32) if form == "varlen" else None
    N = 3 if cu is not None else B
    s0 = {n: s.float() for n, s in random_states(rec.ir, Dims(B, T, H, H, D, D), N, seed=3).items()}
    do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(4))
    # a route's gradient too (the residual route's dR enters the reverse pass's dH terms)
    dr = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(5)) if rec.ir.route != "none" else None
    if form == "no_kept":
        kept = None
        fwd = mod.chunk_forward(x, initial_state=s0, output_final_state=True)
    else:
        fwd, kept = mod.chunk_forward_train(x, initial_state=s0, cu_seqlens=cu, keep_states=form == "keep_states")
    grads: list = []
    names = launched(mod, lambda: grads.append(mod.chunk_backward(x, initial_state=s0, do=do, kept=kept,
                                                                    cu_seqlens=cu, d_route=dr)[0]))
    gx = grads[0]
    assert ("chunk_bwd_local_values_kernel" in names) == (form == "constant_off") and "chunk_bwd_state_kernel" in names
    if form == "no_kept" and name != "kda":  # the rerun forms the scores again: the output after the state pass
        assert names.index("chunk_output_kernel") == names.index("chunk_state_pass_kernel") + 1
    x64 = {n: t.double().requires_grad_(True) for n, t in x.items()}
    ref = rec.reference(**x64, initial_state={n: s.double() for n, s in s0.items()}, output_final_state=True,
                        cu_seqlens=cu)
    loss = (ref.o * do.double()).sum() + ((ref.route * dr.double()).sum() if dr is not None else 0.)
    loss.backward()
    assert _rel(fwd.o, ref.o) < 1e-4
    for n, t in x64.items():
        assert _rel(gx[n], t.grad) < 1e-4, (n, _rel(gx[n], t.grad))
