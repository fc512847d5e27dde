"""AST -> canonical IR. One rule per slot (SLOT_RULES); each validates its line and returns IR parts.

Lets are inlined, so every IR expression is over input/param symbols only. The slots are lowered in a
fixed order (gain and precond before solve, which needs both), whatever order the spec wrote them in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import sympy as sp

from ..dsl import ast
from ..dsl.check import Kind, Scope, check_declarations
from ..dsl.errors import (
    CurvatureNeedsNormalizedKeys,
    DuplicateArgument,
    DuplicateSlot,
    Loc,
    MissingPlacement,
    MissingSlot,
    NotAnInput,
    NotLogDomain,
    NotReal,
    NotStatic,
    NotUnitInterval,
    PlacementError,
    SpecError,
    UnexpectedMap,
    UnknownKeyword,
    UnknownSlotOption,
    UnsupportedCombination,
    UnusedInput,
    VectorAsScalar,
    WrongArguments,
    WrongKind,
    did_you_mean,
)
from ..dsl.functions import L2NORM_DEFAULT_EPS, REDUCTION_ARITY
from .exprs import FUNCTIONS
from .ir import (
    HEAD_INDEX,
    IR,
    KTILDE,
    STAT,
    Decay,
    DiagPrecond,
    Precond,
    ReadCorrection,
    Reduction,
    Solve,
    TensorDecl,
    analyse,
)

_ASSUMPTIONS = {
    "log_gate": {"nonpositive": True, "real": True},
    "unit": {"positive": True},
    "positive": {"positive": True},
    "free": {"real": True},
}


_BINARY: dict[str, Callable[[sp.Expr, sp.Expr], sp.Expr]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "**": sp.Pow,
}


def symbol(name: str, domain: str = "free") -> sp.Symbol:
    return sp.Symbol(name, **_ASSUMPTIONS[domain])


@dataclass
class Lowering:
    """State threaded through the slot rules."""

    spec: ast.Spec
    scope: Scope
    slots: dict[str, ast.Slot] = field(default_factory=dict)
    parts: dict[str, object] = field(default_factory=dict)
    # channel reductions by (op, arg, eps), in the order they were first met: inner ones first
    reductions: dict[tuple[str, sp.Expr, float], Reduction] = field(default_factory=dict)
    _let_cache: dict[str, sp.Expr] = field(default_factory=dict)

    # --- expressions ---------------------------------------------------------------------------
    def sym(self, e: ast.Expr) -> sp.Expr:
        """AST expression -> sympy, lets inlined. Numbers are Floats: no big-integer towers."""
        match e:
            case ast.Num(value=v):
                out: sp.Expr = sp.Integer(int(v)) if v == int(v) and abs(v) <= 16 else sp.Float(v)
            case ast.Var(name=n):
                if n == "A" and "A" in self.scope.extra:
                    out = STAT
                elif n == "head_index":
                    out = HEAD_INDEX
                elif n in self.scope.lets:
                    if n not in self._let_cache:
                        self._let_cache[n] = self.sym(self.scope.lets[n][0].expr)
                    out = self._let_cache[n]
                else:
                    d = self.scope.decls[n]
                    out = symbol(n, d.domain)
            case ast.Neg(operand=o):
                out = -self.sym(o)
            case ast.BinOp(op=op, left=l, right=r):
                a, b = self.sym(l), self.sym(r)
                if op == "**" and b.is_Integer and int(b) > 16:
                    b = sp.Float(b)
                out = self._node(e, lambda: _BINARY[op](a, b))
            case ast.Call(func=f) if f in REDUCTION_ARITY:
                out = self.reduction(e)
            case ast.Call(func=f, args=args):
                xs = [self.sym(x) for x in args]  # type: ignore[arg-type]
                out = self._node(e, lambda: FUNCTIONS[f][1](*xs))
            case _:
                raise TypeError(type(e))
        if out.has(sp.zoo, sp.nan, sp.oo, -sp.oo, sp.I):
            raise NotReal(e.loc, expr=ast.expr_text(e))
        return _no_huge_rationals(out)

    def reduction(self, call: ast.Call) -> sp.Symbol:
        """The symbol that stands for `sum(x)` or `l2norm(x [, eps])`: the value is derived per token from the
        inputs (compiler/ir.py: Reduction), so every other expression stays elementwise. Its sign facts
        follow x's: a sum of squares is >= 0 (so `-sum(k * k)` is a valid log-gate), l2norm keeps each
        channel's sign."""
        kind = self.scope.kind_of(call)  # arity, roles and mixed sides, located
        arg_e = call.args[0]
        assert not isinstance(arg_e, ast.KwArg)
        side = self.scope.kind_of(arg_e).vec
        assert side is not None
        arg = self.sym(arg_e)
        eps = 0.0
        if call.func == "l2norm":
            eps = L2NORM_DEFAULT_EPS
            if len(call.args) == 2:
                eps_e = call.args[1]
                assert not isinstance(eps_e, ast.KwArg)
                eps = _constant(self, eps_e, "l2norm eps")
                if eps < 0:
                    raise WrongKind(eps_e.loc, what="the l2norm eps", expected="a number >= 0",
                                    expr=ast.expr_text(eps_e), kind=str(eps), fix="use e.g. l2norm(x, 1e-6)")
        # the side is part of the key: l2norm(2 * (pk - pk)) over key channels and l2norm(2 * (pv - pv)) over value
        # channels simplify to the same argument (0) but are different vectors (one was merged into the other's
        # side, and the value gain became a key-channel vector)
        key = (call.func, arg, eps, side)
        if key not in self.reductions:
            taken = set(self.scope.first_loc) | set(self.scope.decls) | set(self.scope.lets) | {
                r.name for r in self.reductions.values()}
            i = 0
            while f"{call.func}_{i}" in taken:
                i += 1
            self.reductions[key] = Reduction(f"{call.func}_{i}", call.func, arg, side, eps)
        assert (kind.vec is None) == (call.func == "sum")
        return sp.Symbol(self.reductions[key].name, **_sign_facts(arg))

    @staticmethod
    def _node(e: ast.Expr, build: Callable[[], sp.Expr]) -> sp.Expr:
        """Build one sympy node. sympy evaluates numeric nodes eagerly in arbitrary precision, and
        mpmath raises OverflowError for results beyond any exponent it can hold (exp(exp(exp(1000))))."""
        try:
            return build()
        except OverflowError:
            raise NotReal(e.loc, expr=ast.expr_text(e)) from None

    def typed(self, e: ast.Expr | ast.KwArg, what: str, *, vec: tuple[str | None, ...],
              fix: str = "") -> tuple[sp.Expr, Kind]:
        if isinstance(e, ast.KwArg):
            e = e.value
        k = self.scope.kind_of(e)
        if k.vec not in vec:
            if None in vec and len(vec) == 1:
                side = {"key": "key-channel", "value": "value-channel"}[k.vec or "key"]
                raise VectorAsScalar(e.loc, what=what, expr=ast.expr_text(e), kind=side,
                                     fix=fix or "declare it per token (`input x : token`) or per head (`param x : head`)")
            expected = " or ".join({None: "a scalar", "key": "a key-channel vector",
                                    "value": "a value-channel vector"}[v] for v in vec)
            raise WrongKind(e.loc, what=what, expected=expected, expr=ast.expr_text(e), kind=k.describe(),
                            fix=fix or f"make {what} {expected}")
        return self.sym(e), k

    def nonpositive(self, e: ast.Expr, x: sp.Expr, what: str) -> None:
        if x.is_nonpositive is not True:
            raise NotLogDomain(e.loc, what=what, expr=ast.expr_text(e))

    def static(self, e: ast.Expr, where: str) -> None:
        for v in self.scope.names_in(e):
            if v.name in self.scope.decls and not self.scope.decls[v.name].is_param:
                raise NotStatic(v.loc, where=where, name=v.name)
            if v.name in self.scope.lets and self.scope.lets[v.name][1].varies == "token":
                raise NotStatic(v.loc, where=where, name=v.name)


def _sign_facts(arg: sp.Expr) -> dict[str, bool]:
    """The sympy assumptions a reduction of `arg` inherits: Σ and l2norm keep the sign of every channel."""
    for fact in ("positive", "negative", "nonnegative", "nonpositive"):
        if getattr(arg, f"is_{fact}") is True:
            return {fact: True, "real": True}
    return {"real": True}


def _no_huge_rationals(x: sp.Expr) -> sp.Expr:
    """Exact numbers beyond float range become Floats: `((16 ** 16) ** 16) ** 16` must not grow a
    20,000-digit integer (slow, and unprintable for the later stages)."""
    big = {r: sp.Float(r) for r in x.atoms(sp.Rational) if max(abs(r.p), r.q).bit_length() > 64}
    return x.xreplace(big) if big else x


# --- slot options --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    word: str
    loc: Loc
    args: tuple[ast.Expr, ...]
    kwargs: dict[str, ast.KwArg]


def _unique_kwargs(args: tuple[ast.Expr | ast.KwArg, ...]) -> None:
    seen: dict[str, ast.KwArg] = {}
    for a in args:
        if isinstance(a, ast.KwArg):
            if a.name in seen:
                raise DuplicateArgument(a.loc, name=a.name, first_col=seen[a.name].loc.col)
            seen[a.name] = a


def _option(slot: ast.Slot, options: tuple[str, ...]) -> Option:
    if len(slot.args) != 1 or isinstance(slot.args[0], ast.KwArg):
        where = slot.args[1].loc if len(slot.args) > 1 else slot.args[0].loc
        raise WrongArguments(where, option=slot.slot, problem=f"takes one option, got {len(slot.args)} arguments",
                             usage=f"one of {', '.join(f'`{slot.slot} {o}`' for o in options)}")
    a = slot.args[0]
    match a:
        case ast.Var(name=w, loc=loc):
            word, args, kwargs = w, (), {}
        case ast.Call(func=w, args=xs, loc=loc):
            _unique_kwargs(xs)
            word = w
            args = tuple(x for x in xs if not isinstance(x, ast.KwArg))
            kwargs = {x.name: x for x in xs if isinstance(x, ast.KwArg)}
        case _:
            raise UnknownSlotOption(a.loc, slot=slot.slot, word=ast.expr_text(a), options=", ".join(options))
    if word not in options:
        raise UnknownSlotOption(loc, hint=did_you_mean(word, options) or f"{slot.slot} options: {', '.join(options)}",
                                slot=slot.slot, word=word, options=", ".join(options))
    return Option(word, loc, args, kwargs)


def _only(opt: Option, positional: int, keywords: tuple[str, ...], usage: str, required: int | None = None) -> None:
    need = positional if required is None else required
    if not need <= len(opt.args) <= positional:
        n = f"{positional}" if need == positional else f"{need} to {positional}"
        raise WrongArguments(opt.loc, option=opt.word, problem=f"takes {n} positional argument(s), got {len(opt.args)}",
                             usage=usage)
    for k, kw in opt.kwargs.items():
        if k not in keywords:
            raise UnknownKeyword(kw.loc, hint=did_you_mean(k, keywords) or f"arguments of {opt.word}: "
                                 f"{', '.join(keywords) or 'none'}", option=opt.word, word=k,
                                 known=", ".join(keywords) or "none")


def _no_extras(slot: ast.Slot, allow_map: bool = False, allow_on: bool = False) -> None:
    if slot.map is not None and not allow_map:
        raise UnexpectedMap(slot.map.loc)
    if slot.placement is not None and not allow_on:
        raise WrongArguments(slot.placement.loc, option=slot.slot, problem="takes no `on` placement",
                             usage=f"`{slot.slot} ...` without `on ...`")


def _constant(low: Lowering, e: ast.Expr, what: str) -> float:
    low.scope.kind_of(e)  # undefined names, unknown functions and arities first, located
    low.static(e, what)
    x = low.sym(e)
    if x.free_symbols:
        names = ", ".join(sorted(s.name for s in x.free_symbols))
        raise WrongKind(e.loc, what=what, expected="a number", expr=ast.expr_text(e), kind=f"not a constant (it reads {names})",
                        fix="write a number")
    value = _numeric(x)()
    if not math.isfinite(value):
        raise NotReal(e.loc, expr=ast.expr_text(e))
    return value


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


# The spec's activations for float evaluation of constant expressions (sympy's math printer lacks them).
_MATH = {
    "sigmoid": _sigmoid,
    "softplus": _softplus,
    "logsigmoid": lambda x: -_softplus(-x),
    "softsign": lambda x: x / (1.0 + abs(x)),
    "silu": lambda x: x * _sigmoid(x),
}
# What float arithmetic raises for a value that is not a finite real: sqrt/log of a negative number
# (ValueError), 1/0, exp overflow, a complex power (TypeError from float()).
_NUMERIC_ERRORS = (ValueError, ZeroDivisionError, OverflowError, TypeError)


def _numeric(x: sp.Expr, *args: sp.Symbol) -> Callable[..., float]:
    """`x` as a float function of `args`, returning NaN where it is not a finite real number."""
    f = sp.lambdify(args, x, modules=[_MATH, "math"])

    def value(*vals: float) -> float:
        try:
            out = float(f(*vals))
        except _NUMERIC_ERRORS:
            return math.nan
        return out if math.isfinite(out) else math.nan

    return value


# --- rules ---------------------------------------------------------------------------------------
def rule_normalize(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    names: list[str] = []
    eps = 1e-6
    _unique_kwargs(slot.args)
    for a in slot.args:
        if isinstance(a, ast.KwArg):
            if a.name != "eps":
                raise UnknownKeyword(a.loc, option="normalize", word=a.name, known="eps")
            eps = _constant(low, a.value, "normalize eps")
            if eps < 0:
                raise WrongKind(a.value.loc, what="eps", expected="a number >= 0", expr=ast.expr_text(a.value),
                                kind=str(eps), fix="use e.g. eps = 1e-6")
            continue
        if not isinstance(a, ast.Var) or a.name not in ("q", "k"):
            raise NotAnInput(a.loc, name=ast.expr_text(a), slot="normalize", what="query or key (q, k)",
                             fix="write `normalize q, k`")
        low.scope.used.add(a.name)
        names.append(a.name)
    low.parts["normalize"] = tuple(sorted(set(names), key=("q", "k").index))
    low.parts["norm_eps"] = eps


def rule_scale(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    if len(slot.args) != 1 or isinstance(slot.args[0], ast.KwArg):
        raise WrongArguments(slot.slot_loc, option="scale", problem="takes one number", usage="`scale 0.125`")
    value = _constant(low, slot.args[0], "scale")
    if value <= 0:
        raise WrongKind(slot.args[0].loc, what="scale", expected="positive", expr=ast.expr_text(slot.args[0]),
                        kind=str(value), fix="the read is o = scale · S q; leave it out for dk ** -0.5")
    low.parts["scale"] = value


DECAY_OPTIONS = ("none", "scalar", "vector", "const")


def rule_decay(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    opt = _option(slot, DECAY_OPTIONS)
    usage = {"none": "`decay none`", "scalar": "`decay scalar(g)`", "vector": "`decay vector(g)`",
             "const": "`decay const(1 - 2 ** (-5 - head_index))`"}[opt.word]
    if opt.word == "none":
        _only(opt, 0, (), usage)
        low.parts["decay"] = Decay("none")
        return
    _only(opt, 1, (), usage)
    arg = opt.args[0]
    if opt.word == "scalar":
        g, _ = low.typed(arg, "a scalar decay", vec=(None,),
                         fix="use `decay vector(...)` for a per-key-channel decay, or a `token` log-gate here")
        low.nonpositive(arg, g, "scalar decay")
        low.parts["decay"] = Decay("scalar", g)
    elif opt.word == "vector":
        g, k = low.typed(arg, "a vector decay", vec=("key",),
                         fix="vector decay acts on key channels; use scalar(...) for one number per token")
        low.nonpositive(arg, g, "vector decay")
        low.parts["decay"] = Decay("vector", g)
    else:
        low.typed(arg, "a const decay", vec=(None,))
        low.static(arg, "const decay")
        gamma = low.sym(arg)
        free = gamma.free_symbols - {HEAD_INDEX}
        if free:
            raise NotStatic(arg.loc, where="const decay", name=sorted(s.name for s in free)[0],
                            hint="const(...) is fixed per head: use head_index and numbers; "
                                 "a learned per-head decay is scalar(param)")
        f = _numeric(gamma, HEAD_INDEX)
        for h in range(256):
            val = f(h)
            if not (0.0 < val <= 1.0):
                raise NotUnitInterval(arg.loc, expr=ast.expr_text(arg), head=h)
        low.parts["decay"] = Decay("const", sp.log(gamma))


def rule_gain(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    beta: sp.Expr = sp.Integer(1)
    gk: sp.Expr = sp.Integer(1)
    gv: sp.Expr = sp.Integer(1)
    _unique_kwargs(slot.args)
    positional = [a for a in slot.args if not isinstance(a, ast.KwArg)]
    if len(positional) > 1:
        raise WrongArguments(positional[1].loc, option="gain", problem="takes one scalar gain",
                             usage="`gain beta` or `gain key = b, value = w`")
    if positional:
        beta, _ = low.typed(positional[0], "the gain", vec=(None,),
                            fix="per-channel gains are keyword arguments: `gain key = b, value = w`")
    for a in slot.args:
        if not isinstance(a, ast.KwArg):
            continue
        if a.name == "key":
            gk, _ = low.typed(a, "the key gain", vec=("key", None))
        elif a.name == "value":
            gv, _ = low.typed(a, "the value gain", vec=("value", None))
        else:
            raise UnknownKeyword(a.loc, hint=did_you_mean(a.name, ("key", "value")) or None,
                                 option="gain", word=a.name, known="key, value")
    low.parts["gain"] = (beta, gk, gv)


PRECOND_OPTIONS = ("none", "diag", "exact")


def rule_precond(low: Lowering, slot: ast.Slot) -> None:
    opt = _option(slot, PRECOND_OPTIONS)
    if opt.word == "none":
        _no_extras(slot)
        _only(opt, 0, (), "`precond none`")
        low.parts["precond"] = Precond("none")
        return
    _no_extras(slot, allow_map=opt.word == "diag", allow_on=True)
    if slot.placement is None:
        raise MissingPlacement(Loc.point(slot.loc.end_line, slot.loc.end_col), option=opt.word)
    if slot.placement.name not in ("write_key", "query"):
        raise PlacementError(slot.placement.loc, hint=did_you_mean(slot.placement.name, ("write_key", "query")) or None,
                             option=opt.word, got=f"`{slot.placement.name}`")
    placement = slot.placement.name
    if opt.word == "exact":
        _only(opt, 1, ("lambda",), "`precond exact(lambda = 1.0) on query`", required=0)
        if opt.args and "lambda" in opt.kwargs:
            raise DuplicateArgument(opt.kwargs["lambda"].loc, name="lambda", first_col=opt.args[0].loc.col)
        lam_e = opt.kwargs["lambda"].value if "lambda" in opt.kwargs else (opt.args[0] if opt.args else None)
        lam = 1.0 if lam_e is None else _constant(low, lam_e, "exact lambda")
        if lam <= 0:
            assert lam_e is not None
            raise WrongKind(lam_e.loc, what="lambda", expected="positive", expr=ast.expr_text(lam_e),
                            kind=str(lam), fix="the ridge term λI must be positive definite")
        low.parts["precond"] = Precond("exact", placement, lam=lam)
        return
    usage = "`precond diag(k * k, decay = gP, gain = betaP) -> exp(-log(1.5) * softsign(log(A + 1e-6) - mu)) on write_key`"
    _only(opt, 1, ("decay", "gain"), usage)
    stat, ks = low.typed(opt.args[0], "the diag statistic", vec=("key",))
    kinds = [ks]
    decay = gain = None
    if "decay" in opt.kwargs:
        d = opt.kwargs["decay"].value
        kd = low.scope.kind_of(d)
        if kd.vec is not None:
            raise UnsupportedCombination(
                d.loc, what="a per-channel decay of the diag statistic",
                reason="the chunk form needs one decay per token (a vector makes the decay matrix c×c×dk)",
                fix="use a per-token log-gate, e.g. `input gP : token log_gate key_head`")
        decay = low.sym(d)
        low.nonpositive(d, decay, "diag statistic decay")
        kinds.append(kd)
    if "gain" in opt.kwargs:
        gain, kg = low.typed(opt.kwargs["gain"], "the diag statistic gain", vec=(None,))
        kinds.append(kg)
    if slot.map is None:
        raise WrongArguments(slot.slot_loc, option="diag", problem="needs a map from the statistic A to a scale",
                             usage=usage)
    low.scope.extra["A"] = Kind("key", "token", ks.heads)
    try:
        mapping, km = low.typed(slot.map, "the diag map", vec=("key", None))
    finally:
        low.scope.extra.pop("A", None)
    if STAT not in mapping.free_symbols:
        raise WrongKind(slot.map.loc, what="the diag map", expected="a function of the statistic A",
                        expr=ast.expr_text(slot.map), kind="independent of A",
                        fix="write the scale as a function of A, e.g. exp(-log(1.5) * softsign(log(A + 1e-6) - mu))")
    kinds.append(km)
    heads = "key" if all(k.heads == "key" for k in kinds) else "value"
    low.parts["precond"] = Precond("diag", placement, diag=DiagPrecond(stat, decay, gain, mapping, heads))


SOLVE_OPTIONS = ("additive", "delta", "erase_write", "dplr")


def rule_solve(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    opt = _option(slot, SOLVE_OPTIONS)
    beta, gk, gv = low.parts.get("gain", (sp.Integer(1), sp.Integer(1), sp.Integer(1)))  # type: ignore[misc]
    precond: Precond = low.parts.get("precond", Precond("none"))  # type: ignore[assignment]
    k, v = symbol("k"), symbol("v")
    key = KTILDE if precond.placement == "write_key" else k
    target = gv * v
    if opt.word == "additive":
        _only(opt, 0, (), "`solve additive`")
        low.parts["solve"] = Solve("additive", "additive", beta, target, gk * key)
    elif opt.word in ("delta", "erase_write"):
        _only(opt, 0, (), f"`solve {opt.word}`")
        if opt.word == "erase_write" and gk == 1 and gv == 1:
            raise UnsupportedCombination(
                opt.loc, what="erase_write without vector gains",
                reason="erase_write is GDN2's solve, S̄ + (w⊙v − S̄(b⊙k)) kᵀ, and needs `gain key = b, value = w`",
                fix="add `gain key = b, value = w`, or write `solve delta`")
        low.parts["solve"] = Solve("delta", opt.word, beta, target, key, erase_key=gk * k)
    else:
        _only(opt, 0, ("e", "f", "reads"), "`solve dplr(e = a, f = b, reads = undecayed)`")
        for need in ("e", "f"):
            if need not in opt.kwargs:
                raise WrongArguments(opt.loc, option="dplr", problem=f"needs `{need} = ...`",
                                     usage="`solve dplr(e = a, f = b)`")
        e, _ = low.typed(opt.kwargs["e"], "the dplr erase vector e", vec=("key",))
        f, _ = low.typed(opt.kwargs["f"], "the dplr erase vector f", vec=("key",))
        reads = "decayed"
        if "reads" in opt.kwargs:
            r = opt.kwargs["reads"].value
            if not isinstance(r, ast.Var) or r.name not in ("decayed", "undecayed"):
                raise WrongArguments(r.loc, option="dplr", problem="`reads` is `decayed` or `undecayed`",
                                     usage="`solve dplr(e = a, f = b, reads = undecayed)`")
            reads = r.name
        low.parts["solve"] = Solve("dplr", "dplr", beta, target, gk * key, e=e, f=f, erase_reads=reads)


READ_OPTIONS = ("plain", "curvature")


def rule_read(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    opt = _option(slot, READ_OPTIONS)
    if opt.word == "plain":
        _only(opt, 0, (), "`read plain`")
        low.parts["read"] = ReadCorrection("none")
        return
    usage = "`read curvature(lam, centered)` or `read curvature(lam, uncentered)`"
    _only(opt, 2, (), usage, required=1)
    lam, _ = low.typed(opt.args[0], "the curvature strength λ", vec=(None,))
    centered = True
    if len(opt.args) == 2:
        mode = opt.args[1]
        if not isinstance(mode, ast.Var) or mode.name not in ("centered", "uncentered"):
            raise WrongArguments(mode.loc, option="curvature", problem="mode is `centered` or `uncentered`",
                                 usage=usage)
        centered = mode.name == "centered"
    low.parts["read"] = ReadCorrection("curvature", lam, centered)


ROUTE_OPTIONS = ("none", "value", "residual")


def rule_route(low: Lowering, slot: ast.Slot) -> None:
    _no_extras(slot)
    opt = _option(slot, ROUTE_OPTIONS)
    _only(opt, 0, (), f"`route {opt.word}`")
    low.parts["route"] = opt.word


# The order is the data dependence: solve reads gain and precond.
SLOT_RULES: dict[str, Callable[[Lowering, ast.Slot], None]] = {
    "normalize": rule_normalize,
    "scale": rule_scale,
    "decay": rule_decay,
    "gain": rule_gain,
    "precond": rule_precond,
    "solve": rule_solve,
    "read": rule_read,
    "route": rule_route,
}


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


# --- combination rules: (predicate over the IR parts, located slot, what, reason, fix) -------------
def _combination_checks(low: Lowering) -> None:
    solve: Solve = low.parts["solve"]  # type: ignore[assignment]
    precond: Precond = low.parts.get("precond", Precond("none"))  # type: ignore[assignment]
    read: ReadCorrection = low.parts.get("read", ReadCorrection())  # type: ignore[assignment]
    route = low.parts.get("route", "none")

    def at(name: str) -> Loc:
        return low.slots[name].loc

    if precond.placement == "query" and solve.kind != "additive":
        raise UnsupportedCombination(
            at("precond"), what=f"a query preconditioner (ATQ) with {_a(solve.spelled)} solve",
            reason="ATQ reads P_t q_t from an accumulated state; with an erase the preconditioner no longer "
                   "commutes with the write (ATQ ≡ ATK holds for additive-ATQ vs delta-ATK)",
            fix="use `on write_key` (ATK) with this solve, or `solve additive`")
    if precond.placement == "query" and read.kind != "none":
        raise UnsupportedCombination(
            at("read"), what="a curvature read correction together with a query preconditioner",
            reason="both rewrite the query", fix="keep one of them")
    if route == "residual" and solve.kind != "delta":
        raise UnsupportedCombination(
            at("route"), what=f"route residual with {_a(solve.spelled)} solve",
            reason="the residual r = v − S̄k is the delta family's erase target",
            fix="use `route value`, or a delta/erase_write solve")
    if read.kind == "curvature" and "k" not in low.parts.get("normalize", ()):  # type: ignore[operator]
        # CCQ's statistics C̄ = (1/t) Σ k kᵀ and μ are defined on unit keys; on raw keys the correction's
        # size scales with ‖k‖² and it is no longer the paper's read
        raise CurvatureNeedsNormalizedKeys(at("read"), missing="k")
    if solve.kind == "dplr" and precond.kind != "none":
        raise UnsupportedCombination(
            at("precond"), what="a preconditioner with a dplr solve",
            reason="the dplr chunk form takes its write key as given", fix="drop the preconditioner")
    if solve.kind == "dplr" and read.kind != "none":
        raise UnsupportedCombination(
            at("read"), what="a curvature read with a dplr solve",
            reason="not derived for untied erase vectors yet", fix="use a delta or additive solve")


def _ir_exprs(low: Lowering) -> list[sp.Expr]:
    """Every expression the recurrence evaluates (lets only through the slots that use them)."""
    decay: Decay = low.parts.get("decay", Decay("none"))  # type: ignore[assignment]
    precond: Precond = low.parts.get("precond", Precond("none"))  # type: ignore[assignment]
    read: ReadCorrection = low.parts.get("read", ReadCorrection())  # type: ignore[assignment]
    solve: Solve = low.parts["solve"]  # type: ignore[assignment]
    out = [solve.beta, solve.target, solve.write_key, solve.erase_key, solve.e, solve.f, decay.log_gate, read.lam]
    if precond.diag is not None:
        out += [precond.diag.stat, precond.diag.decay, precond.diag.gain, precond.diag.map]
    return [x for x in out if x is not None]


def _used_reductions(reductions: tuple[Reduction, ...], exprs: list[sp.Expr]) -> tuple[Reduction, ...]:
    """The reductions the recurrence reads, directly or through another reduction (an unused let's are dropped)."""
    names = {s.name for x in exprs for s in x.free_symbols}
    for r in reversed(reductions):  # a reduction reads only earlier ones
        if r.name in names:
            names |= {s.name for s in r.arg.free_symbols}
    return tuple(r for r in reductions if r.name in names)


def lower(spec: ast.Spec) -> IR:
    """Check the AST and build the canonical IR, or raise a located SpecError."""
    try:
        return _lower(spec)
    except SpecError as e:
        raise e.attach(spec.source, spec.filename) from None


def _lower(spec: ast.Spec) -> IR:
    scope = check_declarations(spec)
    low = Lowering(spec, scope)
    for st in spec.statements:
        if isinstance(st, ast.Slot):
            if st.slot in low.slots:
                raise DuplicateSlot(st.slot_loc, slot=st.slot, first_line=low.slots[st.slot].loc.line)
            low.slots[st.slot] = st
    if "solve" not in low.slots:
        raise MissingSlot(spec.name_loc, name=spec.name, slot="solve",
                          example="add e.g. `solve delta` or `solve additive`")
    for name, rule in SLOT_RULES.items():
        if name in low.slots:
            rule(low, low.slots[name])
    _combination_checks(low)
    for name, d in scope.decls.items():
        if name not in scope.used:
            raise UnusedInput(d.loc, name=name, what="param" if d.is_param else "input")
    inputs = tuple(
        TensorDecl(d.name, d.role, d.is_param, d.heads, d.domain, d.default) for d in scope.decls.values()
    )
    ir = IR(
        name=spec.name,
        inputs=inputs,
        normalize=low.parts.get("normalize", ()),  # type: ignore[arg-type]
        norm_eps=low.parts.get("norm_eps", 1e-6),  # type: ignore[arg-type]
        scale=low.parts.get("scale"),  # type: ignore[arg-type]
        decay=low.parts.get("decay", Decay("none")),  # type: ignore[arg-type]
        precond=low.parts.get("precond", Precond("none")),  # type: ignore[arg-type]
        solve=low.parts["solve"],  # type: ignore[arg-type]
        read=low.parts.get("read", ReadCorrection()),  # type: ignore[arg-type]
        route=low.parts.get("route", "none"),  # type: ignore[arg-type]
        lets=tuple((n, low.sym(ast.Var(n, Loc.point(1, 1)))) for n in scope.lets),
        reductions=_used_reductions(tuple(low.reductions.values()), _ir_exprs(low)),
    )
    return replace(ir, structure=analyse(ir))
