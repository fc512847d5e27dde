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


def test_torch_compile_keep_states() -> None:
    """keep_states through the custom ops: the gradients are the eager default's, and the fake kept list (kept_like:
    H_n sized by the chunk count's bound) is what the real forward returns, sequences of uneven length included."""
    from dgps.generated import gdn

    x = gdn.RECURRENCE.random_inputs(2, 75, 2, 16, 16, dtype=torch.float32, seed=3)

    def loss(keep_states, q, k, v, g, beta):  # noqa: ANN001, ANN202
        out = gdn.forward(q=q, k=k, v=v, g=g, beta=beta, output_final_state=True, keep_states=keep_states)
        return (out.o * out.o).sum() + out.final_state["S"].sum()

    compiled = torch.compile(lambda **kw: loss(True, **kw), fullgraph=True, backend="aot_eager")
    eager_x = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    comp_x = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    loss(False, **eager_x).backward()
    compiled(**comp_x).backward()
    for name in x:
        torch.testing.assert_close(comp_x[name].grad, eager_x[name].grad)
    packed = {n: t.reshape(1, 150, *t.shape[2:]) for n, t in x.items()}
    cu = torch.tensor([0, 70, 150], dtype=torch.int64)
    real = gdn._forward_op(*(packed[n] for n in gdn.INPUTS), torch.zeros(2, 2, 16, 16), cu, 0.25, True, True)
    assert len(real) == gdn._N_OUT + len(gdn.chunk._KEPT_BUFFERS) + len(gdn.chunk._KEPT_STATES)
    fake = gdn.chunk.kept_like(1, 150, 2, 2, 16, 16, torch.float32, "cpu", N=2, states=True)
    assert [(t.shape, t.dtype) for t in real[gdn._N_OUT:]] == [(t.shape, t.dtype) for t in fake]


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


def test_custom_op_backward_builds_no_gradients_for_kept_buffers() -> None:
    """The buffers a training forward keeps are outputs of the custom op; autograd must not hand the backward a
    materialized zero gradient for each (it did: 225 MiB more than the eager path at gdn's H200 peak, run 32)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dgps.generated import gdn

    x = gdn.RECURRENCE.random_inputs(1, 70, 2, 16, 16, dtype=torch.float32, seed=0)
    tensors = [x[n].clone().requires_grad_(True) for n in gdn.INPUTS]
    outs = gdn._forward_op(*tensors, torch.zeros(1, 2, 16, 16), None, 0.25, True, False)
    kept = outs[gdn._N_OUT:]
    assert kept, "a training forward of gdn keeps buffers for the backward"

    class Zeros(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            if func.__name__.startswith(("zeros", "new_zeros", "zeros_like")) and isinstance(out, torch.Tensor):
                self.shapes.append(tuple(out.shape))
            return out

    with Zeros() as mode:
        outs[0].sum().backward()
    assert not {tuple(t.shape) for t in kept} & set(mode.shapes), mode.shapes
    assert all(t.grad is not None for t in tensors)
