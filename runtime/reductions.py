"""Channel reductions (`sum`, `l2norm` in a spec): their values and their explicit adjoints.

A reduction couples the channels of one side (dk or dv), so it is not an elementwise expression and the
kernels' sympy-derived chain rule cannot see through it. The compiler binds each reduction to a symbol
(compiler/ir.py: Reduction); the recurrent modules compute the values on the host before the launch and
pass them to the kernels as derived per-token inputs, and the backward kernel's gradients with respect
to those inputs are carried back to the spec's inputs here, through the reductions' adjoints:

    sum:     y = Σ_c x_c                      dx_c = dy
    l2norm:  y = x / n,  n = sqrt(Σ x² + eps)  dx = (dy − y (y·dy)) / n

and through each reduction's elementwise argument (torch autograd on the same evaluation the reference
uses). The reference (runtime/reference.py) evaluates them with plain torch ops under autograd, so the
kernel gradients are checked against an independent derivation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from ..compiler.ir import HEAD_INDEX, IR, Reduction, kernel_ir
from .tensors import Dims

__all__ = ["derived_input_grads", "derived_inputs", "kernel_ir", "reduce_channels", "reduction_adjoint"]


def reduce_channels(r: Reduction, arg: torch.Tensor) -> torch.Tensor:
    """The reduction of `arg` [..., channels] over its last axis: [..., 1] for sum, [..., channels] for l2norm."""
    if r.op == "sum":
        return arg.sum(-1, keepdim=True)
    return arg * torch.rsqrt((arg * arg).sum(-1, keepdim=True) + r.eps)


def reduction_adjoint(r: Reduction, arg: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """d(loss)/d(arg) from d(loss)/d(y), y = reduce_channels(r, arg); `dy` is [..., 1] (sum) or like `arg`."""
    if r.op == "sum":
        return dy.expand_as(arg)
    inv_norm = torch.rsqrt((arg * arg).sum(-1, keepdim=True) + r.eps)
    y = arg * inv_norm
    return (dy - y * (y * dy).sum(-1, keepdim=True)) * inv_norm


def kernel_shape(r: Reduction, dims: Dims) -> tuple[int, ...]:
    """The derived input's shape, as the kernels take it: [B, T, HV] or [B, T, HV, channels]."""
    width = {"key": dims.dk, "value": dims.dv}[r.side]
    return (dims.B, dims.T, dims.HV) if r.op == "sum" else (dims.B, dims.T, dims.HV, width)


def _env(ir: IR, x: Mapping[str, torch.Tensor], dims: Dims) -> dict[str, torch.Tensor]:
    from .reference import build_env  # reference imports this module

    return build_env(dataclasses.replace(ir, reductions=()), x, dims, torch.float32)


def _full_arg(r: Reduction, env: Mapping[str, torch.Tensor], dims: Dims) -> torch.Tensor:
    from .evaluate import evaluate
    from .reference import _full

    like = env["q"]
    width = {"key": dims.dk, "value": dims.dv}[r.side]
    return _full(evaluate(r.arg, env, like), like).expand(dims.B, dims.T, dims.HV, width)


def derived_inputs(ir: IR, x: Mapping[str, torch.Tensor], dims: Dims) -> dict[str, torch.Tensor]:
    """The value of every reduction of `ir` on the checked inputs `x`, fp32, in its kernel shape."""
    if not ir.reductions:
        return {}
    with torch.no_grad():
        env = _env(ir, x, dims)
        out: dict[str, torch.Tensor] = {}
        for r in ir.reductions:
            y = reduce_channels(r, _full_arg(r, env, dims))
            env[r.name] = y
            out[r.name] = y.reshape(kernel_shape(r, dims)).contiguous()
    return out


def derived_input_grads(ir: IR, x: Mapping[str, torch.Tensor], dims: Dims,
                        d_derived: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The gradients of the spec's inputs through the reductions, given the gradients of the derived inputs
    (`d_derived`, kernel shapes). Only the inputs some reduction reads get an entry (fp32).

    No autograd: this runs inside the package's backward custom op. Reverse dependence order: a
    reduction's adjoint gives d(arg); sympy's derivatives of the elementwise argument carry it to the
    symbols it reads (inputs, earlier reductions); normalised q and k go through the L2 norm's adjoint."""
    if not ir.reductions:
        return {}
    from ..compiler.exprs import diff_by_name
    from .evaluate import evaluate
    from .reference import _full

    with torch.no_grad():
        env = _env(ir, x, dims)
        like = env["q"]
        args: dict[str, torch.Tensor] = {}
        for r in ir.reductions:
            args[r.name] = _full_arg(r, env, dims)
            env[r.name] = reduce_channels(r, args[r.name])
        # adjoints of the environment's tensors, each in its full shape [B, T, HV, channels or 1]
        d_env: dict[str, torch.Tensor] = {
            r.name: d_derived[r.name].float().reshape(env[r.name].expand(dims.B, dims.T, dims.HV, -1).shape).clone()
            for r in ir.reductions}
        for r in reversed(ir.reductions):
            d_arg = reduction_adjoint(r, args[r.name], d_env.pop(r.name))
            for name in sorted({s.name for s in r.arg.free_symbols} - {HEAD_INDEX.name}):
                partial = _full(evaluate(diff_by_name(r.arg, name), env, like), like) * d_arg
                if env[name].shape[-1] == 1:  # a scalar read by every channel: its adjoint sums them
                    partial = partial.sum(-1, keepdim=True)
                d_env[name] = d_env[name] + partial if name in d_env else partial
        return {name: _to_input(ir, name, g, x, dims) for name, g in d_env.items()}


def _to_input(ir: IR, name: str, g: torch.Tensor, x: Mapping[str, torch.Tensor], dims: Dims) -> torch.Tensor:
    """An environment adjoint [B, T, HV, channels or 1] as the gradient of input `name` in its own shape: through
    the in-kernel L2 norm (q, k), summed over grouped value heads (key-head tensors) and over B, T (params)."""
    d = ir.input(name)
    if name in ir.normalize:
        raw = x[name].float()
        raw = raw if dims.G == 1 else raw.repeat_interleave(dims.G, dim=2)
        g = reduction_adjoint(Reduction("", "l2norm", HEAD_INDEX, "key", ir.norm_eps), raw, g)
    if d.vector is None:
        g = g.squeeze(-1)
    if d.is_param:
        g = g.sum((0, 1))
        axis = 0
    else:
        axis = 2
    if d.heads == "key" and dims.G > 1:
        g = g.unflatten(axis, (dims.H, dims.G)).sum(axis + 1)
    return g.reshape(x[name].shape)
