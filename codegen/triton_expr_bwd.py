"""sympy -> Triton for the backward pass: the forward printer plus the nodes that derivatives bring in.

Differentiating spec expressions produces `sign` (from |x|), integer powers beyond ±4 and half-integer
powers (d/dx x**(-1/2) = −x**(-3/2)/2). Everything else goes through `triton_expr`'s rule table: a node
this printer does not know is printed by `triton_expr` with its argument pre-printed here.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from .triton_expr import triton_expr

_ARG = "__arg__"


def _num(x: sp.Expr) -> str:
    return repr(float(x))


def _int_pow(b: str, n: int) -> str:
    if n == 0:
        return "1.0"
    prod = "(" + " * ".join([b] * abs(n)) + ")"
    return prod if n > 0 else f"(1.0 / {prod})"


def triton_expr_bwd(expr: sp.Expr, names: Mapping[str, str], fast_log: bool = False) -> str:
    """Print `expr` as a Triton expression; every free symbol must be in `names` (`fast_log`: as triton_expr's)."""
    if expr.is_Symbol:
        return names[expr.name]
    if expr.is_Number:
        return _num(expr)
    if expr.is_Add:
        return "(" + " + ".join(triton_expr_bwd(a, names, fast_log) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(triton_expr_bwd(a, names, fast_log) for a in expr.args) + ")"
    if expr.is_Pow:
        base, ex = expr.args
        if base.is_Number and not ex.is_Number:
            return f"tl.exp({triton_expr_bwd(ex, names, fast_log)} * {_num(sp.log(base))})"
        b = triton_expr_bwd(base, names, fast_log)
        if ex.is_Integer and abs(int(ex)) <= 8:
            return _int_pow(b, int(ex))
        if ex.is_Rational and ex.q == 2 and abs(ex.p) <= 9:
            return _int_pow(f"tl.sqrt({b})", int(ex.p))
        return f"tl.exp({triton_expr_bwd(ex, names, fast_log)} * tl.log({b}))"
    if isinstance(expr, sp.sign):
        a = triton_expr_bwd(expr.args[0], names, fast_log)
        return f"tl.where({a} > 0.0, 1.0, tl.where({a} < 0.0, -1.0, 0.0))"
    if isinstance(expr, sp.Function) and len(expr.args) == 1:
        placeholder = sp.Symbol(_ARG, real=True)
        return triton_expr(expr.func(placeholder), {_ARG: triton_expr_bwd(expr.args[0], names, fast_log)}, fast_log)
    raise NotImplementedError(f"no Triton rule for {type(expr).__name__}: {expr}")
