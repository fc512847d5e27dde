"""Evaluation of the compiler's sympy expression trees on torch tensors, through one rule table, using the
numerically stable torch forms (the sequential reference and the layers evaluate gates with it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy as sp
import torch
import torch.nn.functional as F

from ..compiler.exprs import logsigmoid, sigmoid, silu, softplus, softsign, tanh

# --- evaluation on torch ----------------------------------------------------------------------------
Value = torch.Tensor | float

_UNARY: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    sp.exp: torch.exp,
    sp.log: torch.log,
    sp.Abs: torch.abs,
    sp.sign: torch.sign,  # from derivatives of |x| (runtime/reductions.py)
    tanh: torch.tanh,
    sigmoid: torch.sigmoid,
    logsigmoid: F.logsigmoid,
    softplus: F.softplus,
    softsign: lambda x: x / (1 + x.abs()),
    silu: F.silu,
}


def _as_tensor(x: Value, like: torch.Tensor | None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    dtype = like.dtype if like is not None else torch.float64
    device = like.device if like is not None else None
    return torch.tensor(x, dtype=dtype, device=device)


def evaluate(expr: sp.Expr, env: Mapping[str, Value], like: torch.Tensor | None = None) -> Value:
    """Evaluate `expr` with symbols bound by name in `env` (tensors broadcast together)."""
    if expr.is_Symbol:
        return env[expr.name]
    if expr.is_Number:
        return float(expr)
    if expr.is_Add:
        out: Value = 0.0
        for a in expr.args:
            out = out + evaluate(a, env, like)
        return out
    if expr.is_Mul:
        out = 1.0
        for a in expr.args:
            out = out * evaluate(a, env, like)
        return out
    if expr.is_Pow:
        base, ex = expr.args
        b = evaluate(base, env, like)
        if ex == sp.Rational(1, 2):
            return torch.sqrt(_as_tensor(b, like))
        if ex == -1:
            return 1.0 / b
        if ex.is_Integer and isinstance(b, torch.Tensor):
            return b ** int(ex)
        e = evaluate(ex, env, like)
        if isinstance(b, float) and isinstance(e, float):
            return b ** e
        return _as_tensor(b, like) ** e
    fn = _UNARY.get(type(expr))
    if fn is not None:
        return fn(_as_tensor(evaluate(expr.args[0], env, like), like))
    raise NotImplementedError(f"cannot evaluate {expr!r} ({type(expr).__name__})")
