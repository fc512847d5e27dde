"""Compiled packages are custom ops: autograd and torch.compile(fullgraph=True) see one node each."""

from __future__ import annotations

import torch

import dgps
from dgps.generated import pgdn


def test_torch_compile_fullgraph_forward_and_backward() -> None:
    x = pgdn.RECURRENCE.random_inputs(1, 12, 1, 16, 16, HV=2, dtype=torch.float32, seed=5)

    def loss(q, k, v, g, beta, gP, betaP, mu):  # noqa: ANN001, ANN202
        out = pgdn.forward(q=q, k=k, v=v, g=g, beta=beta, gP=gP, betaP=betaP, mu=mu, output_final_state=True)
        return (out.o * out.o).sum() + out.final_state["S"].sum() + out.final_state["A"].sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    eager_x = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    comp_x = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    eager = loss(**eager_x)
    eager.backward()
    got = compiled(**comp_x)
    got.backward()
    torch.testing.assert_close(got, eager)
    for name in x:
        torch.testing.assert_close(comp_x[name].grad, eager_x[name].grad)
    assert all(torch.isfinite(comp_x[n].grad).all() for n in x)


def test_custom_op_fake_shapes_match_real() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = dgps.load(pgdn.SPEC_TEXT)
    x = rec.random_inputs(2, 5, 1, 16, 8, HV=2, dtype=torch.float32, seed=1)
    real = pgdn.forward(**x, output_final_state=True)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = pgdn.forward(**{k: mode.from_tensor(v) for k, v in x.items()}, output_final_state=True)
    assert fake.o.shape == real.o.shape and fake.o.dtype == real.o.dtype
    for name, s in real.final_state.items():
        assert fake.final_state[name].shape == s.shape and fake.final_state[name].dtype == s.dtype
