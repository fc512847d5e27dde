"""keep_states (FLA's disable_recompute): a training forward keeps the state pass's H_n and U, and the backward runs
no state pass again. The same kernel stores them either way (the forward's state pass, or the backward's rerun of
it), so every gradient is bitwise the default path's, which tests/test_chunk_backward.py holds against the float64
reference; o comes from the unfused output where the plan fuses it, so it is checked against the reference here."""

from __future__ import annotations

import importlib
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from dgps.runtime.reference import random_states  # noqa: E402
from dgps.runtime.tensors import Dims  # noqa: E402

# the fused state pass + output (gdn), per-channel decay (kda), the additive family without U (la), the PDN statistic
# (pgdn), the exact preconditioner's passes rerun before the state pass (exact_atk), the residual route (cler_h_gdn)
SPECS = ["gdn", "kda", "la", "pgdn", "exact_atk", "cler_h_gdn"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("name", SPECS)
def test_keep_states_gradients_are_the_defaults(name: str) -> None:
    pkg = importlib.import_module(f"dgps.generated.{name}")
    x = pkg.RECURRENCE.random_inputs(2, 90, 2, 16, 16, HV=2, dtype=torch.float32, seed=7)
    s0 = {n: s.float() for n, s in random_states(pkg.IR, Dims(2, 90, 2, 2, 16, 16), 2, seed=7).items()}
    grads = []
    outs = []
    for keep_states in (False, True):
        xs = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        out = pkg.forward(**xs, initial_state=s0, output_final_state=True, keep_states=keep_states)
        loss = (out.o * torch.linspace(-1, 1, out.o.numel()).reshape(out.o.shape)).sum()
        loss = loss + sum((s * 0.5).sum() for s in out.final_state.values())
        loss.backward()
        grads.append({n: t.grad for n, t in xs.items()})
        outs.append(out)
    for n in x:
        assert torch.equal(grads[0][n], grads[1][n]), n
    ref = pkg.reference(**{n: t.double() for n, t in x.items()}, initial_state=s0, output_final_state=True)
    assert _rel(outs[1].o, ref.o) < 1e-4
    for s, v in ref.final_state.items():
        assert _rel(outs[1].final_state[s], v) < 1e-4, s


def test_keep_states_with_cp_group_is_refused() -> None:
    import dgps
    from dgps.generated import gdn

    x = gdn.RECURRENCE.random_inputs(1, 8, 1, 16, 16, dtype=torch.float32, seed=0)
    with pytest.raises(dgps.TensorError, match="keep_states is not supported with cp_group"):
        gdn.forward(**x, cp_group=object(), keep_states=True)
