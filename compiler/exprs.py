"""Elementwise expressions: the sympy function library.

Spec expressions (gate maps, the preconditioner's bounded map, gains) become sympy trees over the
spec's input symbols, so later stages can differentiate them symbolically. The functions sympy lacks
(sigmoid, softplus, ...) are defined here with their derivatives and sign facts; runtime/evaluate.py
turns a tree into torch ops.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp

from ..dsl.functions import FUNCTION_ARITY


class sigmoid(sp.Function):  # noqa: N801 - spec-facing name
    nargs = 1

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        # σ(x) σ(−x), not σ(1 − σ): where σ(x) rounds to 1 (x ≳ 17 in fp32) the latter is 0 and the former keeps the
        # derivative's e^{−x} size (tanh below had the same flaw: a fuzzed PDN gain lost 25 % of its gradient)
        x = self.args[0]
        return sigmoid(x) * sigmoid(-x)

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real

    def _eval_is_positive(self):
        return self.args[0].is_extended_real

    def _eval_is_finite(self):
        return True if self.args[0].is_extended_real else None


class tanh(sp.tanh):  # noqa: N801
    """sympy's tanh with the derivative sech²(x) = 4 σ(2x) σ(−2x) instead of 1 − tanh²(x), which is 0 in fp32 wherever
    tanh(x) rounds to ±1 (|x| ≳ 9) while the derivative is still ~4 e^{−2|x|}."""

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        x = self.args[0]
        return 4 * sigmoid(2 * x) * sigmoid(-2 * x)


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
        return sigmoid(x) * (1 + x * sigmoid(-x))  # 1 − σ(x) as σ(−x): see sigmoid.fdiff

    def _eval_is_extended_real(self):
        return self.args[0].is_extended_real


# Spec function name -> (arity, sympy builder): one entry per function of the language (dsl/functions.py).
FUNCTIONS: dict[str, tuple[int, Callable[..., sp.Expr]]] = {
    "exp": (1, sp.exp),
    "log": (1, sp.log),
    "log1p": (1, lambda x: sp.log(1 + x)),
    "sqrt": (1, sp.sqrt),
    "abs": (1, sp.Abs),
    "tanh": (1, tanh),
    "sigmoid": (1, sigmoid),
    "logsigmoid": (1, logsigmoid),
    "softplus": (1, softplus),
    "softsign": (1, softsign),
    "silu": (1, silu),
}


def diff_by_name(expr: sp.Expr, name: str) -> sp.Expr:
    """d expr / d (every free symbol called `name`: symbols may differ only in their assumptions)."""
    out = sp.Integer(0)
    for s in expr.free_symbols:
        if s.name == name:
            out += sp.diff(expr, s)
    return out


assert {k: v[0] for k, v in FUNCTIONS.items()} == FUNCTION_ARITY, "dsl/functions.py and FUNCTIONS disagree"
