"""The spec's abstract syntax tree: small frozen dataclasses, each carrying its source span."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import Loc


@dataclass(frozen=True)
class Num:
    value: float
    text: str
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class Var:
    name: str
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class KwArg:
    name: str
    value: Expr
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr | KwArg, ...]
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / **
    left: Expr
    right: Expr
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class Neg:
    operand: Expr
    loc: Loc = field(compare=False)


Expr = Num | Var | Call | BinOp | Neg


@dataclass(frozen=True)
class InputDecl:
    names: tuple[Var, ...]
    descriptors: tuple[Var, ...]
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class ParamDecl:
    names: tuple[Var, ...]
    descriptors: tuple[Var, ...]
    default: Expr | None
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class LetDecl:
    name: Var
    expr: Expr
    loc: Loc = field(compare=False)


@dataclass(frozen=True)
class Slot:
    """One slot line: `decay vector(g)`, `precond diag(...) -> map on write_key`, ..."""

    slot: str
    slot_loc: Loc
    args: tuple[Expr | KwArg, ...]
    map: Expr | None
    placement: Var | None
    loc: Loc = field(compare=False)


Statement = InputDecl | ParamDecl | LetDecl | Slot


@dataclass(frozen=True)
class Spec:
    name: str
    name_loc: Loc
    statements: tuple[Statement, ...]
    filename: str = field(default="<spec>", compare=False)
    source: str = field(default="", compare=False, repr=False)


def expr_text(e: Expr | KwArg) -> str:
    """Print an expression back as spec text (fully parenthesised where needed)."""
    match e:
        case Num(text=t):
            return t
        case Var(name=n):
            return n
        case KwArg(name=n, value=v):
            return f"{n} = {expr_text(v)}"
        case Call(func=f, args=a):
            return f"{f}({', '.join(expr_text(x) for x in a)})"
        case Neg(operand=o):
            inner = expr_text(o)
            return f"-{inner}" if isinstance(o, Num | Var | Call) else f"-({inner})"
        case BinOp(op=op, left=l, right=r):
            def wrap(x: Expr) -> str:
                s = expr_text(x)
                return s if isinstance(x, Num | Var | Call) else f"({s})"
            return f"{wrap(l)} {op} {wrap(r)}"
    raise TypeError(type(e))


def format_ast(spec: Spec) -> str:
    """The printable form of the AST stage (`dgps show --stage ast`)."""
    out = [f"Spec {spec.name}  @{spec.name_loc.line}:{spec.name_loc.col}"]
    for st in spec.statements:
        where = f"@{st.loc.line}:{st.loc.col}"
        match st:
            case InputDecl(names=ns, descriptors=ds):
                out.append(f"  Input {', '.join(n.name for n in ns)} : {' '.join(d.name for d in ds)}  {where}")
            case ParamDecl(names=ns, descriptors=ds, default=d):
                dflt = f" = {expr_text(d)}" if d is not None else ""
                out.append(f"  Param {', '.join(n.name for n in ns)} : {' '.join(d.name for d in ds)}{dflt}  {where}")
            case LetDecl(name=n, expr=e):
                out.append(f"  Let {n.name} = {expr_text(e)}  {where}")
            case Slot(slot=s, args=a, map=m, placement=p):
                line = f"  Slot {s} {', '.join(expr_text(x) for x in a)}"
                if m is not None:
                    line += f" -> {expr_text(m)}"
                if p is not None:
                    line += f" on {p.name}"
                out.append(f"{line}  {where}")
    return "\n".join(out)
