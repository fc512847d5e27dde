"""The PDN statistic's scan steps (compiler/plan.py: PDN_SCAN_ROWS, plan attribute scan_rows): precond_diag and its
backward walk each sequence in steps of several chunks, store one chunk-start carry per chunk, and the backward
re-forms the statistic per step from the step's first carry. Under TRITON_INTERPRET=1, with a varlen pack whose
sequences start and end inside steps and chunks: forward, final states and every gradient against the float64
reference at one-, two- and four-chunk steps, and the carries the training forward keeps equal across step heights (a
carry is the statistic at its chunk's start, whatever step it falls in).
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
CU = [0, 70, 200, 290]  # step boundaries at 64 / 128 / 256 rows fall inside every sequence


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return (a - b).norm().item() / max(b.norm().item(), 1e-300)


def test_the_plan_prints_the_step_height(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "PDN_SCAN_ROWS", 256)
    p = plan_module.build_plan(dgps.load(SPECS / "pgdn.dgps").ir, 64, 16)
    assert p.stage("precond_diag").attr("scan_rows") == 256 and "scan_rows=256" in plan_module.format_plan(p)
    monkeypatch.setattr(plan_module, "PDN_SCAN_ROWS", 100)  # whole chunks only: rounded down to 64
    assert plan_module.build_plan(dgps.load(SPECS / "pgdn.dgps").ir, 64, 16).stage("precond_diag").attr("scan_rows") == 64


@pytest.mark.parametrize("rows", [64, 128, 256])
def test_steps_match_the_reference(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = dgps.load(SPECS / "pdn.dgps")
    x = {k: v.float() for k, v in rec.random_inputs(1, CU[-1], 1, 16, 16, 2, seed=3).items()}
    cu = torch.tensor(CU, dtype=torch.int32)
    ref_x = {k: v.double().requires_grad_(True) for k, v in x.items()}
    ref = rec.reference(output_final_state=True, cu_seqlens=cu, **ref_x)
    do = torch.randn_like(ref.o)
    (ref.o * do).sum().backward()

    monkeypatch.setattr(plan_module, "PDN_SCAN_ROWS", rows)
    mod = load_chunk(rec.ir)
    out = mod.chunk_forward(x, output_final_state=True, cu_seqlens=cu)
    assert _rel(out.o, ref.o) <= 1e-5
    for s in ("S", "A"):
        assert _rel(out.final_state[s], ref.final_state[s]) <= 1e-5, s
    _, kept = mod.chunk_forward_train(x, cu_seqlens=cu)
    grads, _ = mod.chunk_backward(x, do=do.float(), kept=kept, cu_seqlens=cu)
    for n, t in ref_x.items():
        assert _rel(grads[n], t.grad) <= 1e-4, n


def test_chunk_start_carries_do_not_depend_on_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = dgps.load(SPECS / "pdn.dgps")
    x = {k: v.float() for k, v in rec.random_inputs(1, CU[-1], 1, 16, 16, 2, seed=4).items()}
    cu = torch.tensor(CU, dtype=torch.int32)
    carries = {}
    for rows in (64, 256):
        monkeypatch.setattr(plan_module, "PDN_SCAN_ROWS", rows)
        mod = load_chunk(rec.ir)
        _, kept = mod.chunk_forward_train(x, cu_seqlens=cu)
        carries[rows] = dict(zip(mod._KEPT_BUFFERS, kept, strict=True))["an_buf"]
    n_chunks = sum((b - a + 63) // 64 for a, b in zip(CU, CU[1:], strict=False))  # the chunks written, in order
    heads = carries[64].numel() // (16 * ((CU[-1] + 63) // 64 + len(CU) - 1))  # the buffer's bound on the chunk count
    a64, a256 = (carries[r].reshape(-1, heads * 16)[:n_chunks] for r in (64, 256))
    assert a64.abs().sum() > 0 and _rel(a256, a64) <= 1e-6


def test_fast_log_only_in_the_pdn_map() -> None:
    """The PDN map's log goes through `_fast_log` (the SFU's lg2.approx on the GPU, the exact log under the
    interpreter), in the forward and the statistic's backward, which also forms the chain rule's derivatives of
    map(A) k (bwd_inputs no longer evaluates the map); every other log of a generated module — the gates'
    logsigmoid, softplus — keeps the exact form."""
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
        assert uses == {"chunk_precond_diag_kernel", "chunk_bwd_precond_diag_kernel"}, (name, uses)
    # in the chain rule only the map's terms: gdn_fused_gate's gates keep the exact log
    src = render_chunk(dgps.load(SPECS / "gdn_fused_gate.dgps").ir)
    assert "_fast_log(" not in src and "tl.log(" in src
