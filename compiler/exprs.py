"""Elementwise expressions: the sympy function library, and evaluation of sympy trees on torch.

Spec expressions (gate maps, the preconditioner's bounded map, gains) become sympy trees over the
spec's input symbols, so later stages can differentiate them symbolically. The functions sympy lacks
(sigmoid, softplus, ...) are defined here with their derivatives and sign facts; `evaluate` turns a
tree into torch ops through one rule table, using the numerically stable torch forms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy as sp
import torch
import torch.nn.functional as F


class sigmoid(sp.Function):  # noqa: N801 - spec-facing name
    nargs = 1

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        s = sigmoid(self.args[0])
        return s * (1 - s)

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real

    def _eval_is_positive(self):
        return self.args[0].is_extended_real

    def _eval_is_finite(self):
        return True if self.args[0].is_extended_real else None


class softplus(sp.Function):  # noqa: N801
    nargs = 1

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return sigmoid(self.args[0])

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real

    def _eval_is_positive(self):
        return self.args[0].is_extended_real

    def _eval_is_finite(self):
        return self.args[0].is_finite


class logsigmoid(sp.Function):  # noqa: N801
    nargs = 1

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return sigmoid(-self.args[0])

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real

    def _eval_is_negative(self):
        return self.args[0].is_real

    def _eval_is_finite(self):
        return self.args[0].is_finite


class softsign(sp.Function):  # noqa: N801
    nargs = 1

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return 1 / (1 + sp.Abs(self.args[0])) ** 2

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real

    def _eval_is_finite(self):
        return True if self.args[0].is_extended_real else None


class silu(sp.Function):  # noqa: N801
    nargs = 1

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        x = self.args[0]
        s = sigmoid(x)
        return s * (1 + x * (1 - s))

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real


# Spec function name -> (arity, sympy builder). The checker uses the keys for "unknown function".
FUNCTIONS: dict[str, tuple[int, Callable[..., sp.Expr]]] = {
    "exp": (1, sp.exp),
    "log": (1, sp.log),
    "log1p": (1, lambda x: sp.log(1 + x)),
    "sqrt": (1, sp.sqrt),
    "abs": (1, sp.Abs),
    "tanh": (1, sp.tanh),
    "sigmoid": (1, sigmoid),
    "logsigmoid": (1, logsigmoid),
    "softplus": (1, softplus),
    "softsign": (1, softsign),
    "silu": (1, silu),
}


# --- evaluation on torch ----------------------------------------------------------------------------
Value = torch.Tensor | float

_UNARY: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    sp.exp: torch.exp,
    sp.log: torch.log,
    sp.Abs: torch.abs,
    sp.tanh: torch.tanh,
    sigmoid: torch.sigmoid,
    logsigmoid: F.logsigmoid,
    softplus: F.softplus,
    softsign: lambda x: x / (1 + x.abs()),
    silu: F.silu,
}


def diff_by_name(expr: sp.Expr, name: str) -> sp.Expr:
    """d expr / d (every free symbol called `name`: symbols may differ only in their assumptions)."""
    out = sp.Integer(0)
    for s in expr.free_symbols:
        if s.name == name:
            out += sp.diff(expr, s)
    return out


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
