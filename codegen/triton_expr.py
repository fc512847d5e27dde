"""sympy -> Triton source for elementwise expressions, through one rule table.

Names are mapped by the caller (a spec symbol `g` may live in a register called `b_g`). The stable
forms matter: softplus and logsigmoid never exponentiate a positive number, so large gate
pre-activations cannot overflow in fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy as sp

from ..compiler.exprs import logsigmoid, sigmoid, silu, softplus, softsign, tanh


def _num(x: sp.Expr) -> str:
    v = float(x)
    return repr(v)


_FUNCS: dict[type, Callable[[str], str]] = {
    sp.exp: lambda a: f"tl.exp({a})",
    sp.log: lambda a: f"tl.log({a})",
    sp.Abs: lambda a: f"tl.abs({a})",
    tanh: lambda a: f"(2.0 / (1.0 + tl.exp(-2.0 * ({a}))) - 1.0)",
    sigmoid: lambda a: f"(1.0 / (1.0 + tl.exp(-({a}))))",
    softplus: lambda a: f"(tl.maximum({a}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({a}))))",
    logsigmoid: lambda a: f"(tl.minimum({a}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({a}))))",
    softsign: lambda a: f"(({a}) / (1.0 + tl.abs({a})))",
    silu: lambda a: f"(({a}) / (1.0 + tl.exp(-({a}))))",
}


def triton_expr(expr: sp.Expr, names: Mapping[str, str], fast_log: bool = False) -> str:
    """Print `expr` as a Triton expression; every free symbol must be in `names`.

    `fast_log`: the spec's log nodes go through the kernel module's `_fast_log` (the SFU's lg2.approx, 7 instructions
    against libdevice logf's ~32; absolute error ≤ 2^-22.6 · ln 2). For maps whose output only feeds smooth functions
    (the PDN preconditioner's), where the log dominated the per-element instructions; the log-gates keep the exact
    form (their errors sum along the sequence)."""
    if expr.is_Symbol:
        return names[expr.name]
    if expr.is_Number:
        return _num(expr)
    if expr.is_Add:
        return "(" + " + ".join(triton_expr(a, names, fast_log) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(triton_expr(a, names, fast_log) for a in expr.args) + ")"
    if fast_log and isinstance(expr, sp.log):
        return f"_fast_log({triton_expr(expr.args[0], names, fast_log)}, INTERPRET)"
    if expr.is_Pow:
        base, ex = expr.args
        b = triton_expr(base, names, fast_log)
        if ex.is_Integer and 1 <= int(ex) <= 4:
            return "(" + " * ".join([b] * int(ex)) + ")"
        if ex.is_Integer and -4 <= int(ex) <= -1:
            return "(1.0 / (" + " * ".join([b] * -int(ex)) + "))"
        if ex == sp.Rational(1, 2):
            return f"tl.sqrt({b})"
        if ex == sp.Rational(-1, 2):
            return f"(1.0 / tl.sqrt({b}))"
        if base.is_Number:  # c ** x = exp(x log c), c > 0 checked by the spec's domain rules
            return f"tl.exp({triton_expr(ex, names, fast_log)} * {_num(sp.log(base))})"
        return f"tl.exp({triton_expr(ex, names, fast_log)} * tl.log({b}))"
    fn = _FUNCS.get(type(expr))
    if fn is not None:
        return fn(triton_expr(expr.args[0], names, fast_log))
    raise NotImplementedError(f"no Triton rule for {type(expr).__name__}: {expr}")
