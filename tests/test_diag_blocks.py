"""The per-channel kernels' three forms of their gate-bounded pairs (compiler/plan.py: VECTOR_DIAG_FORM).

"levels" always takes the hierarchical references; "blocks" takes one product per 16-token block (interaction and
bwd_intra) where every channel of a key block decays by at most 2^DIAG_RANGE_LOG2 over it; "chunk" also one product
for the whole chunk where the chunk is within the bound. Against the float64 reference (TRITON_INTERPRET=1), forward
and gradients, and against each other: where every block fails the bound the forms run the same code and agree bit for
bit, where it holds they differ by rounding only (so the bounded products were taken), and without the bound the
strong gates overflow (so the check is what keeps the forms exact).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
from dgps.compiler import plan as plan_module  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (a - b).norm().item() / max(b.norm().item(), 1e-300)


def _inputs(rec: dgps.Recurrence, T: int, gate_scale: tuple[tuple[int, int, float], ...] = (), seed: int = 0) -> dict:
    x = rec.random_inputs(1, T, 1, 32, 32, 2, seed=seed)
    for d in rec.ir.inputs:
        if d.domain == "log_gate" and not d.is_param:
            for start, stop, scale in gate_scale:
                x[d.name][:, start:stop] = x[d.name][:, start:stop] * scale
    return {k: v.float() for k, v in x.items()}


def _run(rec: dgps.Recurrence, x: dict, form: str, monkeypatch: pytest.MonkeyPatch, cu: list[int] | None = None):
    monkeypatch.setattr(plan_module, "VECTOR_DIAG_FORM", form)
    mod = load_chunk(rec.ir)
    cu_t = torch.tensor(cu, dtype=torch.int32) if cu is not None else None
    return mod.chunk_forward(x, output_final_state=True, cu_seqlens=cu_t)


def _reference(rec: dgps.Recurrence, x: dict, cu: list[int] | None = None):
    cu_t = torch.tensor(cu, dtype=torch.int32) if cu is not None else None
    return rec.reference(output_final_state=True, cu_seqlens=cu_t, **{k: v.double() for k, v in x.items()})


def test_the_plan_prints_the_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "VECTOR_DIAG_FORM", "chunk")
    p = plan_module.build_plan(dgps.load(SPECS / "kda.dgps").ir, 64, 16)
    assert p.stage("interaction").attr("diag_blocks") == "chunk"
    assert "diag_blocks=chunk" in plan_module.format_plan(p) and "diag_range_log2=64" in plan_module.format_plan(p)
    bp = plan_module.build_backward_plan(p)
    assert next(st for st in bp.stages if st.kind == "bwd_intra").attr("diag_blocks") == "chunk"


@pytest.mark.parametrize("form", ["blocks", "chunk"])
@pytest.mark.parametrize("scale", [0.05, 1.0])
@pytest.mark.parametrize("name", ["kda", "gla", "gdn2"])
def test_bounded_blocks_match_the_reference_and_were_taken(name: str, scale: float, form: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """GVA, a ragged last chunk; gates logsigmoid(z)·scale: at 0.05 every chunk within the bound (the chunk form's
    one product), at 1 a 64-token chunk mostly not (~−74 in log2) and its 16-token blocks mostly so."""
    rec = dgps.load(SPECS / f"{name}.dgps")
    x = _inputs(rec, 100, ((0, 100, scale),))
    ref = _reference(rec, x)
    bounded, levels = _run(rec, x, form, monkeypatch), _run(rec, x, "levels", monkeypatch)
    assert _rel(bounded.o, ref.o) <= 1e-5 and _rel(bounded.final_state["S"], ref.final_state["S"]) <= 1e-5
    assert not torch.equal(bounded.o, levels.o)  # the bounded products were taken: rounding differs


@pytest.mark.parametrize("name", ["kda", "gla"])
def test_strong_gates_take_the_levels(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Log-gates ~ 20·logsigmoid(z): no 16-token block is within 2^64, so both forms run the levels, bit for bit."""
    rec = dgps.load(SPECS / f"{name}.dgps")
    x = _inputs(rec, 80, ((0, 80, 20.0),))
    ref = _reference(rec, x)
    bounded, levels = _run(rec, x, "chunk", monkeypatch), _run(rec, x, "levels", monkeypatch)
    assert torch.isfinite(bounded.o).all() and _rel(bounded.o, ref.o) <= 1e-5
    assert torch.equal(bounded.o, levels.o)


def test_chunks_choose_for_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three sequences packed (varlen): gentle gates in the first (the chunk's one product), strong ones in the second
    (the levels), plain ones in the third (per 16-token block, mostly); all match the reference."""
    rec = dgps.load(SPECS / "kda.dgps")
    cu = [0, 70, 150, 200]
    x = _inputs(rec, 200, ((0, 70, 0.05), (70, 150, 20.0)), seed=3)
    ref = _reference(rec, x, cu)
    out = _run(rec, x, "chunk", monkeypatch, cu)
    assert torch.isfinite(out.o).all()
    assert _rel(out.o, ref.o) <= 1e-5 and _rel(out.final_state["S"], ref.final_state["S"]) <= 1e-5


@pytest.mark.parametrize("name", ["kda", "gla", "pkda"])
def test_chunk_form_over_several_key_blocks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk form walks the key channels in blocks of its own width BKF (codegen/launch.py CHUNK_FORM_KEY_BLOCK),
    not the levels' BK: at dk = dv = 40 and BKF 16, three blocks, the last masked to 8 channels. Gentle gates (the
    chunk form taken): the output and final state meet the float64 reference, and the loop's width changes the
    summation order only (so every block was added)."""
    from dgps.codegen import launch
    from dgps.runtime import autotune

    rec = dgps.load(SPECS / f"{name}.dgps")
    x = {k: v.float() for k, v in rec.random_inputs(1, 100, 1, 40, 40, 2, seed=4).items()}
    for d in rec.ir.inputs:
        if d.domain == "log_gate" and not d.is_param:
            x[d.name] = x[d.name] * 0.05
    ref = _reference(rec, x)
    outs = {}
    for width in (16, 64):
        monkeypatch.setattr(launch, "CHUNK_FORM_KEY_BLOCK", width)
        monkeypatch.setattr(plan_module, "VECTOR_DIAG_FORM", "chunk")
        autotune.forget()  # a changed launch setting: the hosts form their call geometries and launch lists again
        mod = load_chunk(rec.ir)
        outs[width] = out = mod.chunk_forward(x, output_final_state=True)
        assert _rel(out.o, ref.o) <= 1e-5 and _rel(out.final_state["S"], ref.final_state["S"]) <= 1e-5, width
    assert not torch.equal(outs[16].o, outs[64].o)


def test_without_the_bound_strong_gates_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is what keeps the bounded form exact: allowed any range, the column factors e^{r − b_j} overflow."""
    rec = dgps.load(SPECS / "kda.dgps")
    x = _inputs(rec, 80, ((0, 80, 20.0),))
    ref = _reference(rec, x)
    monkeypatch.setattr(plan_module, "DIAG_RANGE_LOG2", 10**9)
    out = _run(rec, x, "chunk", monkeypatch)
    assert not (torch.isfinite(out.o).all() and _rel(out.o, ref.o) <= 1e-3)


@pytest.mark.parametrize("form", ["blocks", "chunk"])
@pytest.mark.parametrize("name", ["kda", "gla"])
def test_gradients_through_the_bounded_forms(name: str, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every input gradient (bwd_intra's diagonal blocks as products) against float64 autograd through the reference,
    gates gentle in the first chunk, plain after it."""
    rec = dgps.load(SPECS / f"{name}.dgps")
    x = _inputs(rec, 100, ((0, 64, 0.05),), seed=5)
    do = torch.randn(1, 100, 2, 32, generator=torch.Generator().manual_seed(6))
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    ref = rec.reference(**x64)
    want = torch.autograd.grad((ref.o * do.double()).sum(), list(x64.values()))
    monkeypatch.setattr(plan_module, "VECTOR_DIAG_FORM", form)
    mod = load_chunk(rec.ir)
    _, kept = mod.chunk_forward_train(x)
    got, _ = mod.chunk_backward(x, do=do, kept=kept)
    for (k, _), w in zip(x64.items(), want, strict=True):
        assert _rel(got[k], w) <= 1e-5, (k, _rel(got[k], w))


@pytest.mark.parametrize("name", ["kda", "gla"])
def test_the_cumsum_formed_in_the_interaction(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """compiler/plan.py CUMSUM_IN_INTERACTION (off: run 150 measured it no faster) still builds a correct module: no
    cumsum launch, the interaction's launch forms and stores b, and the output, the final state and every gradient
    (the backward reads the stored b) match float64 autograd through the reference."""
    monkeypatch.setattr(plan_module, "CUMSUM_IN_INTERACTION", True)
    rec = dgps.load(SPECS / f"{name}.dgps")
    assert plan_module.launch_of(plan_module.build_plan(rec.ir, 64, 16).stage("cumsum_g")) == "interaction"
    x = _inputs(rec, 100, ((0, 64, 0.05),), seed=7)
    do = torch.randn(1, 100, 2, 32, generator=torch.Generator().manual_seed(8))
    x64 = {k: v.double().requires_grad_() for k, v in x.items()}
    ref = rec.reference(output_final_state=True, **x64)
    want = torch.autograd.grad((ref.o * do.double()).sum(), list(x64.values()))
    mod = load_chunk(rec.ir)
    assert not hasattr(mod, "chunk_cumsum_kernel")
    out = mod.chunk_forward(x, output_final_state=True)
    assert _rel(out.o, ref.o) <= 1e-5 and _rel(out.final_state["S"], ref.final_state["S"].detach()) <= 1e-5
    _, kept = mod.chunk_forward_train(x)
    got, _ = mod.chunk_backward(x, do=do, kept=kept)
    for (k, _), w in zip(x64.items(), want, strict=True):
        assert _rel(got[k], w) <= 1e-5, (k, _rel(got[k], w))


def _untied(name: str) -> dgps.Recurrence:
    return dgps.load(SPECS / f"{name}.dgps" if name == "rwkv7_dplr" else SPECS.parent / "tests" / f"{name}.dgps")


def _grads(rec: dgps.Recurrence, x: dict, do: torch.Tensor, form: str, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(plan_module, "VECTOR_DIAG_FORM", form)
    mod = load_chunk(rec.ir)
    out, kept = mod.chunk_forward_train(x)
    got, _ = mod.chunk_backward(x, do=do, kept=kept)
    return out, got


@pytest.mark.parametrize("form", ["blocks", "chunk"])
@pytest.mark.parametrize("name", ["rwkv7_dplr", "dplr_decayed"])
def test_untied_bounded_forms(name: str, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The untied family's kernels take the gates-bounded products: bwd_intra's diagonal blocks (chunk_bwd_intra_dplr.jinja,
    both forms) and, in the "chunk" form, the interaction's four matrices through one reference per chunk
    (chunk_interaction_dplr.jinja). Gates logsigmoid(z)·0.05 keep every chunk within the bound: the output and every
    gradient meet float64 autograd through the reference and differ from the levels' by rounding (the products were
    taken; the "blocks" forward is the levels', bit for bit). With strong gates nothing is within the bound and both
    forms run the levels, bit for bit. Both erase readings (rows decayed with b_{t-1} or b_t)."""
    rec = _untied(name)
    monkeypatch.setattr(plan_module, "VECTOR_DIAG_FORM", form)
    bp = plan_module.build_backward_plan(p := plan_module.build_plan(rec.ir, 64, 16))
    assert next(st for st in bp.stages if st.kind == "bwd_intra").attr("diag_blocks") == "blocks"
    assert p.stage("interaction").attr("diag_blocks") == ("chunk" if form == "chunk" else "levels")
    for scale, taken in ((0.05, True), (20.0, False)):
        x = _inputs(rec, 90, ((0, 90, scale),), seed=7)
        do = torch.randn(1, 90, 2, 32, generator=torch.Generator().manual_seed(8))
        (out, got), (out_l, got_l) = _grads(rec, x, do, form, monkeypatch), _grads(rec, x, do, "levels", monkeypatch)
        assert torch.equal(out.o, out_l.o) == (form == "blocks" or not taken)
        assert any(not torch.equal(got[k], got_l[k]) for k in x) == taken
        if taken:  # (strong gates' accuracy, with its gate-scale rule: tests/test_chunk_backward.py::test_strong_gates)
            x64 = {k: v.double().requires_grad_() for k, v in x.items()}
            ref = rec.reference(**x64)
            assert _rel(out.o, ref.o) <= 1e-5
            want = torch.autograd.grad((ref.o * do.double()).sum(), list(x64.values()))
            for k, w in zip(x64, want, strict=True):
                assert _rel(got[k], w) <= 1e-5, (k, _rel(got[k], w))
