"""Semantic checks on the AST: declarations, name resolution and the kind of every expression.

A kind says how an elementwise expression varies: `vec` is None (one number), 'key' (per key
channel, dk) or 'value' (per value channel, dv); `varies` is 'const', 'head' or 'token'; `heads` is
'key' when everything it reads is per key head (and so shared by grouped value heads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import ast
from .errors import (
    BadDefault,
    ConflictingDescriptor,
    DuplicateDefinition,
    KeywordInExpression,
    Loc,
    MissingCoreInput,
    MissingRole,
    MixedVectors,
    ReductionMixesRoles,
    ReductionOverScalar,
    ReductionOverStatistic,
    ReservedName,
    UndefinedName,
    UnknownDescriptor,
    UnknownFunction,
    UnknownRole,
    UsedBeforeDefinition,
    WrongArity,
    WrongCoreRole,
    did_you_mean,
)
from .functions import FUNCTION_ARITY, REDUCTION_ARITY

ROLES_INPUT = ("key", "value", "token", "key_channel", "value_channel")
ROLES_PARAM = ("head", "key_channel", "value_channel")
DOMAINS = ("log_gate", "unit", "positive", "free")
RESERVED = {
    "head_index": "head_index is the built-in value-head index (for const decays)",
    "A": "A names the diagonal preconditioner's statistic inside its map",
    "ktilde": "ktilde is the preconditioned write key",
}
_VARIES = ("const", "head", "token")


@dataclass(frozen=True)
class Kind:
    vec: str | None = None
    varies: str = "const"
    heads: str = "key"

    def join(self, other: Kind, loc: Loc, names: tuple[str, str] = ("?", "?")) -> Kind:
        if self.vec and other.vec and self.vec != other.vec:
            key, value = names if self.vec == "key" else names[::-1]
            raise MixedVectors(loc, key=key, value=value)
        return Kind(
            self.vec or other.vec,
            max(self.varies, other.varies, key=_VARIES.index),
            "value" if "value" in (self.heads, other.heads) else "key",
        )

    def describe(self) -> str:
        side = {None: "scalar", "key": "key-channel vector", "value": "value-channel vector"}[self.vec]
        return f"a per-{self.varies} {side}" if self.varies != "const" else f"a constant {side}"


@dataclass(frozen=True)
class Decl:
    name: str
    role: str
    is_param: bool
    heads: str
    domain: str
    default: float | None
    loc: Loc

    @property
    def kind(self) -> Kind:
        vec = {"key": "key", "key_channel": "key", "value": "value", "value_channel": "value"}.get(self.role)
        return Kind(vec, "head" if self.is_param else "token", self.heads)


@dataclass
class Scope:
    """The resolved declarations of a spec: inputs/params in order, lets with their kinds."""

    decls: dict[str, Decl] = field(default_factory=dict)
    lets: dict[str, tuple[ast.LetDecl, Kind]] = field(default_factory=dict)
    first_loc: dict[str, Loc] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    extra: dict[str, Kind] = field(default_factory=dict)  # slot-local names such as A
    defined_at: dict[str, Loc] = field(default_factory=dict)  # all names the spec defines, anywhere

    def kind_of(self, e: ast.Expr | ast.KwArg) -> Kind:
        """The kind of an expression, raising located errors for bad names and calls."""
        return _kind(e, self, FUNCTION_ARITY)

    def names_in(self, e: ast.Expr) -> list[ast.Var]:
        out: list[ast.Var] = []
        stack: list[ast.Expr | ast.KwArg] = [e]
        while stack:
            x = stack.pop()
            match x:
                case ast.Var():
                    out.append(x)
                case ast.Call(args=a):
                    stack.extend(a)
                case ast.BinOp(left=l, right=r):
                    stack += [l, r]
                case ast.Neg(operand=o):
                    stack.append(o)
                case ast.KwArg(value=v):
                    stack.append(v)
        return out


def _kind(e: ast.Expr | ast.KwArg, scope: Scope, functions: dict[str, int]) -> Kind:
    match e:
        case ast.Num():
            return Kind()
        case ast.Var(name=n, loc=loc):
            if n in scope.extra:
                return scope.extra[n]
            if n == "head_index":
                return Kind(None, "head", "value")
            if n in scope.lets:
                scope.used.add(n)
                return scope.lets[n][1]
            if n in scope.decls:
                scope.used.add(n)
                return scope.decls[n].kind
            if n in scope.defined_at and scope.defined_at[n].line != loc.line:
                raise UsedBeforeDefinition(loc, name=n, line=scope.defined_at[n].line)
            if n in scope.defined_at:
                raise UndefinedName(loc, hint=f"`{n}` is being defined on this line; a let cannot use itself", name=n)
            known = list(scope.decls) + list(scope.lets) + list(scope.extra)
            raise UndefinedName(loc, hint=did_you_mean(n, known) or None, name=n)
        case ast.KwArg(name=n, loc=loc):
            raise KeywordInExpression(loc, name=n)
        case ast.Call(func=f, args=args, loc=loc) if f in REDUCTION_ARITY:
            return _reduction_kind(e, scope, functions)
        case ast.Call(func=f, args=args, loc=loc):
            if f not in functions:
                known = sorted([*functions, *REDUCTION_ARITY])
                raise UnknownFunction(loc, hint=did_you_mean(f, known) or None, name=f, known=", ".join(known))
            arity = functions[f]
            for a in args:
                if isinstance(a, ast.KwArg):
                    raise KeywordInExpression(a.loc, name=a.name)
            if len(args) != arity:
                raise WrongArity(loc, name=f, expected=arity, got=len(args))
            return _kind(args[0], scope, functions)
        case ast.Neg(operand=o):
            return _kind(o, scope, functions)
        case ast.BinOp(left=l, right=r, loc=loc):
            kl, kr = _kind(l, scope, functions), _kind(r, scope, functions)
            return kl.join(kr, loc, (_first_vec_name(l, kl, scope), _first_vec_name(r, kr, scope)))
    raise TypeError(type(e))


def _reduction_kind(call: ast.Call, scope: Scope, functions: dict[str, int]) -> Kind:
    """sum(x) is a scalar and l2norm(x [, eps]) a vector of x's side; x must be one side's channel vector."""
    fewest, most = REDUCTION_ARITY[call.func]
    for a in call.args:
        if isinstance(a, ast.KwArg):
            raise KeywordInExpression(a.loc, name=a.name)
    if not fewest <= len(call.args) <= most:
        usage = "sum(k * k)" if call.func == "sum" else "l2norm(x) or l2norm(x, 1e-6)"
        expected = f"{fewest}" if fewest == most else f"{fewest} or {most}"
        raise WrongArity(call.loc, hint=f"call it as {usage}", name=call.func, expected=expected, got=len(call.args))
    arg = call.args[0]
    assert not isinstance(arg, ast.KwArg)
    if "A" in scope.extra and any(v.name == "A" for v in scope.names_in(arg)):
        raise ReductionOverStatistic(call.loc, name=call.func)
    try:
        k = _kind(arg, scope, functions)
    except MixedVectors as mixed:
        raise ReductionMixesRoles(call.loc, name=call.func, key=mixed.fields["key"],
                                  value=mixed.fields["value"]) from None
    if k.vec is None:
        raise ReductionOverScalar(arg.loc, name=call.func, expr=ast.expr_text(arg), kind=k.describe())
    if len(call.args) == 2:
        _kind(call.args[1], scope, functions)  # names in eps resolve; lower.py checks it is a constant
    return Kind(None if call.func == "sum" else k.vec, k.varies, k.heads)


def _first_vec_name(e: ast.Expr, k: Kind, scope: Scope) -> str:
    for v in scope.names_in(e):
        kk = scope.extra.get(v.name) or (scope.lets[v.name][1] if v.name in scope.lets else None)
        if kk is None and v.name in scope.decls:
            kk = scope.decls[v.name].kind
        if kk is not None and kk.vec == k.vec and k.vec:
            return v.name
    return ast.expr_text(e)


def _declare(scope: Scope, name: ast.Var) -> None:
    if name.name in RESERVED:
        raise ReservedName(name.loc, name=name.name, why=RESERVED[name.name])
    if name.name in scope.first_loc:
        raise DuplicateDefinition(name.loc, name=name.name, first_line=scope.first_loc[name.name].line)
    scope.first_loc[name.name] = name.loc


def _descriptors(st: ast.InputDecl | ast.ParamDecl) -> tuple[str, str, str]:
    roles = ROLES_PARAM if isinstance(st, ast.ParamDecl) else ROLES_INPUT
    role = domain = None
    role_word: ast.Var | None = None
    heads = None
    for d in st.descriptors:
        w = d.name
        if w in roles:
            if role is not None:
                raise ConflictingDescriptor(d.loc, word=w, other=role)
            role, role_word = w, d
        elif w in DOMAINS:
            if domain is not None:
                raise ConflictingDescriptor(d.loc, word=w, other=domain)
            domain = w
        elif w == "key_head":
            heads = "key"
        elif role is None and w in ROLES_INPUT + ROLES_PARAM:
            kind = "param" if isinstance(st, ast.ParamDecl) else "input"
            article = "an" if kind == "input" else "a"
            raise UnknownRole(d.loc, hint=f"`{w}` is not a role for {article} {kind}; {kind} roles: {', '.join(roles)}",
                              word=w)
        elif role is None:
            raise UnknownRole(d.loc, hint=did_you_mean(w, roles) or None, word=w)
        else:
            raise UnknownDescriptor(d.loc, hint=did_you_mean(w, DOMAINS + ("key_head",)) or None, word=w)
    if role is None:
        keyword = "param" if isinstance(st, ast.ParamDecl) else "input"
        first = st.descriptors[0]
        raise MissingRole(first.loc, names=", ".join(n.name for n in st.names), keyword=keyword,
                          example="head" if keyword == "param" else "token", word=first.name)
    assert role_word is not None
    if role == "key":
        heads = "key"
    return role, domain or "free", heads or "value"


def _const_value(e: ast.Expr) -> float | None:
    """The value of a constant arithmetic expression (numbers, + - * / **), or None."""
    match e:
        case ast.Num(value=v):
            return v
        case ast.Neg(operand=o):
            v = _const_value(o)
            return None if v is None else -v
        case ast.BinOp(op=op, left=l, right=r):
            a, b = _const_value(l), _const_value(r)
            if a is None or b is None:
                return None
            try:
                out = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                       "**": lambda: a**b}[op]()
            except (ZeroDivisionError, OverflowError):
                return None
            if isinstance(out, complex) or not math.isfinite(out):
                return None
            return out
    return None


def check_declarations(spec: ast.Spec) -> Scope:
    """Resolve inputs, params and lets (in order: a let may use what is declared above it)."""
    scope = Scope()
    for st in spec.statements:  # every name the spec defines, for "used before its definition"
        match st:
            case ast.InputDecl(names=names) | ast.ParamDecl(names=names):
                for n in names:
                    scope.defined_at.setdefault(n.name, n.loc)
            case ast.LetDecl(name=n):
                scope.defined_at.setdefault(n.name, n.loc)
    for st in spec.statements:
        match st:
            case ast.InputDecl(names=names):
                role, domain, heads = _descriptors(st)
                for n in names:
                    _declare(scope, n)
                    scope.decls[n.name] = Decl(n.name, role, False, heads, domain, None, n.loc)
            case ast.ParamDecl(names=names, default=default):
                role, domain, heads = _descriptors(st)
                value = None
                if default is not None:
                    value = _const_value(default)
                    if value is None:
                        reads = [v.name for v in scope.names_in(default)]
                        raise BadDefault(default.loc, name=names[0].name,
                                         reads=reads[0] if reads else ast.expr_text(default))
                for n in names:
                    _declare(scope, n)
                    scope.decls[n.name] = Decl(n.name, role, True, heads, domain, value, n.loc)
            case ast.LetDecl(name=n, expr=e):
                kind = scope.kind_of(e)
                _declare(scope, n)
                scope.lets[n.name] = (st, kind)
    _check_core(spec, scope)
    return scope


_CORE = {
    "q": ("key", "the query", "input q, k : key"),
    "k": ("key", "the key", "input q, k : key"),
    "v": ("value", "the value", "input v : value"),
}


def _check_core(spec: ast.Spec, scope: Scope) -> None:
    for name, (role, what, example) in _CORE.items():
        d = scope.decls.get(name)
        if d is None:
            raise MissingCoreInput(spec.name_loc, name=name, what=what, example=example)
        if d.role != role or d.is_param:
            raise WrongCoreRole(d.loc, name=name, role=role, got=("param " if d.is_param else "") + d.role)
        scope.used.add(name)  # q, k and v are read by every recurrence
