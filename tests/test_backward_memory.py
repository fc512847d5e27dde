"""The training step's memory: the backward frees each buffer after the last kernel that reads it (the kept ones too,
on the eager path), and handing the kept buffers to the backward outside save_for_backward changes no gradient —
nor do saved-tensor hooks (activation checkpointing), which take the save_for_backward path, or a second backward
(retain_graph), which recomputes the forward.

Launches are recorded at the host's one launch point (`_Run.launch`) and not run where only the buffers matter.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import weakref  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import dgps  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"


def _live_at_launches(mod, fn) -> list[tuple[list[str], set[str]]]:  # noqa: ANN001
    """(kernels, names of the run's buffers that hold real tensors) at each launch of `fn`, launches not run."""
    seen: list[tuple[list[str], set[str]]] = []
    launch = mod._Run.launch

    def record(self, kernels):  # noqa: ANN001, ANN202
        live = {n for n, t in self.bufs.items() if isinstance(t, torch.Tensor) and t.numel() > 1}
        seen.append(([k[1].__name__ for k in kernels], live))

    mod._Run.launch = record
    try:
        fn()
    finally:
        mod._Run.launch = launch
    return seen


@pytest.mark.parametrize("name", ["gdn", "pgdn", "pkda"])
def test_backward_frees_each_buffer_after_its_last_reader(name: str) -> None:
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.float32, seed=0)
    out, kept = mod.chunk_forward_train(x)
    refs = {n: weakref.ref(t) for n, t in zip(mod._KEPT_BUFFERS, kept, strict=True)}
    do = torch.randn_like(out.o)
    dead_at: dict[str, set[str]] = {}

    def backward() -> None:
        # the launch recorder sees which kept tensors are already gone when bwd_grads launches
        launch = mod._Run.launch

        def record(self, kernels):  # noqa: ANN001, ANN202
            if any(k[1].__name__ == "chunk_bwd_grad_kernel" for k in kernels):
                dead_at["bwd_grads"] = {n for n, r in refs.items() if r() is None}
            return launch(self, kernels)

        mod._Run.launch = record
        try:
            mod.chunk_backward(x, do=do, kept=kept)
        finally:
            mod._Run.launch = launch

    seen = _live_at_launches(mod, backward)
    assert kept == []  # consumed: the backward owns the kept buffers
    at = {k: live for kernels, live in seen for k in kernels}
    grads = at["chunk_bwd_grad_kernel"]
    # dU_local is dead after the reverse state pass; W after it, Ũ after the rerun of the forward's state pass
    assert not grads & {"dul_buf", "w_buf", "u_buf", "o_buf"}
    assert {"w_buf", "u_buf"} <= dead_at["bwd_grads"]
    assert {"h_buf", "dh_buf", "vn_buf"} <= grads
    # dU: the last input of bwd_solve (scalar decay) or bwd_scores (per-channel decay); bwd_grads reads dY = Aiᵀ dU
    # from them instead (compiler/plan.py: value_side_once), so dU is gone before it
    assert "du_buf" not in grads and {"dy_buf", "dbc_buf"} <= grads
    last = at[seen[-1][0][-1]]
    # bwd_solve's adjoints (scalar-decay delta family) live through bwd_grads, which reads them
    solve = {"dy_buf", "dsg_buf", "dlg_buf", "dbc_buf", "dgs_buf", "dgl_buf"}
    assert (solve <= grads) == (name != "pkda")
    # after bwd_grads: H_n, dH, dU, U, the pair shares and bwd_solve's adjoints are gone; what the chain rule reads stays
    assert not last & ({"h_buf", "dh_buf", "du_buf", "vn_buf", "pq_buf", "pa_buf", "pe_buf", "t_buf"} | solve)
    if name.startswith("p"):
        # the statistic's chain-rule shares are formed after the chunk gradients, from the chunk-start carries
        assert not any(n.startswith("apre_") for n in grads)
        assert "apre_k_buf" in last and "an_buf" not in last


def _grads(pkg, x: dict, do: torch.Tensor, wrap=None, twice: bool = False) -> dict:  # noqa: ANN001
    leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}

    def run(*tensors: torch.Tensor) -> torch.Tensor:
        return pkg.forward(**dict(zip(leaves, tensors, strict=True))).o

    o = wrap(run, *leaves.values()) if wrap is not None else run(*leaves.values())
    o.backward(do, retain_graph=twice)
    if twice:
        o.backward(do)
    return {k: t.grad for k, t in leaves.items()}


@pytest.mark.parametrize("name", ["pgdn", "pkda"])
def test_the_kept_buffers_path_changes_no_gradient(name: str) -> None:
    pkg = dgps.compile(SPEC_DIR / f"{name}.dgps")
    x = pkg.RECURRENCE.random_inputs(B=1, T=80, H=1, dk=16, dv=16, HV=2, dtype=torch.float32, seed=4)
    do = torch.randn(1, 80, 2, 16, generator=torch.Generator().manual_seed(5))
    eager = _grads(pkg, x, do)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):  # save_for_backward path
        hooked = _grads(pkg, x, do)
    ckpt = _grads(pkg, x, do, wrap=lambda f, *t: checkpoint(f, *t, use_reentrant=False))
    twice = _grads(pkg, x, do, twice=True)  # the second backward recomputes the whole forward
    for n, g in eager.items():
        assert torch.equal(hooked[n], g), n
        assert torch.equal(ckpt[n], g), n
        torch.testing.assert_close(twice[n], 2 * g, rtol=1e-6, atol=0), n
