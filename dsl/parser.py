"""Text -> AST. Parses with lark (LALR) and turns every parser failure into a located SpecError."""

from __future__ import annotations

import math
from functools import cache
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from . import ast
from .errors import (
    BadCharacter,
    BadNumber,
    EmptySpec,
    Loc,
    MissingEnd,
    SpecError,
    SyntaxErrorInSpec,
    TooDeep,
    UnclosedBracket,
    UnknownStatement,
    UnmatchedBracket,
    did_you_mean,
)

STATEMENT_WORDS = (
    "input", "param", "let", "decay", "gain", "precond", "solve", "read", "route", "normalize", "scale", "end",
)
MAX_DEPTH = 60
ALLOWED_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-*/()=,:.<> \t\r\n\f\\")


@cache
def _lark() -> Lark:
    text = resources.files(__package__).joinpath("grammar.lark").read_text()
    return Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _tok_loc(tok: Token) -> Loc:
    width = max(1, len(str(tok)))
    return Loc(tok.line or 1, tok.column or 1, tok.end_line or tok.line or 1, (tok.end_column or (tok.column or 1) + width))


def _tree_loc(tree: Tree) -> Loc:
    m = tree.meta
    if getattr(m, "empty", True):
        return Loc(1, 1, 1, 2)
    return Loc(m.line, m.column, m.end_line, m.end_column)


# --- pre-scan: errors that read better from the raw text than from the parser ----------------------
def _prescan(text: str) -> None:
    for lineno, line in enumerate(text.splitlines(), start=1):
        code = line.split("#", 1)[0]
        for col, ch in enumerate(code, start=1):
            if ch not in ALLOWED_CHARS:
                raise BadCharacter(Loc.point(lineno, col), char=ch)
        stack: list[int] = []
        for col, ch in enumerate(code, start=1):
            if ch == "(":
                stack.append(col)
                if len(stack) > MAX_DEPTH:
                    raise TooDeep(Loc.point(lineno, col), depth=len(stack))
            elif ch == ")":
                if not stack:
                    raise UnmatchedBracket(Loc.point(lineno, col))
                stack.pop()
        if stack and not code.rstrip().endswith("\\"):
            raise UnclosedBracket(Loc.point(lineno, stack[-1]))


def _readable(term: str) -> str:
    names = {"NAME": "a name", "NUMBER": "a number", "_NL": "end of line", "$END": "end of file"}
    if term in names:
        return names[term]
    for t in _lark().terminals:
        if t.name == term:
            return f"`{t.pattern.value}`"
    return term


def _first_word_col(text: str, line: int) -> int:
    lines = text.splitlines()
    if 1 <= line <= len(lines):
        src = lines[line - 1]
        return len(src) - len(src.lstrip()) + 1
    return 1


def _convert(err: UnexpectedInput, text: str) -> SpecError:
    if isinstance(err, UnexpectedEOF):
        return MissingEnd(Loc.point(max(1, text.count("\n")), 1), name="?")
    line, col = err.line, err.column
    if line is None or line < 1:
        lines = text.splitlines() or [""]
        return MissingEnd(Loc.point(len(lines), 1), name="?")
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        n = len(text.rstrip("\n").splitlines()) or 1
        return MissingEnd(Loc.point(n, 1), name=_spec_name(text))
    src_line = text.splitlines()[line - 1] if line <= len(text.splitlines()) else ""
    word = ""
    rest = src_line[col - 1:]
    for ch in rest:
        if ch.isalnum() or ch == "_":
            word += ch
        else:
            break
    at_start = col == _first_word_col(text, line)
    if at_start and word and word not in STATEMENT_WORDS and (word[0].isalpha() or word[0] == "_"):
        return UnknownStatement(
            Loc.point(line, col, len(word)), hint=did_you_mean(word, STATEMENT_WORDS) or None, word=word
        )
    if isinstance(err, UnexpectedToken):
        tok = err.token
        found = "end of line" if tok.type == "_NL" else f"`{tok}`"
        expected = sorted({_readable(t) for t in err.expected if not t.startswith("__ANON") or True})
        loc = _tok_loc(tok) if tok.type != "_NL" else Loc.point(line, col)
        return SyntaxErrorInSpec(loc, found=found, expected=", ".join(expected[:8]))
    assert isinstance(err, UnexpectedCharacters)
    expected = sorted({_readable(t) for t in (err.allowed or set())})
    found = f"`{word}`" if word else f"`{src_line[col - 1: col]}`"
    return SyntaxErrorInSpec(Loc.point(line, col, max(1, len(word))), found=found, expected=", ".join(expected[:8]))


def _spec_name(text: str) -> str:
    for line in text.splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) >= 2 and parts[0] == "recurrence":
            return parts[1]
    return "?"


# --- lark tree -> AST ---------------------------------------------------------------------------
def _check_depth(tree: Tree) -> None:
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooDeep(_tree_loc(node), depth=depth)
        for child in node.children:
            if isinstance(child, Tree):
                stack.append((child, depth + 1))


_BINOPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}


def _expr(node: Tree | Token) -> ast.Expr | ast.KwArg:
    if isinstance(node, Token):  # a bare NAME in an arg list position
        return ast.Var(str(node), _tok_loc(node))
    kind = node.data
    loc = _tree_loc(node)
    if kind == "number":
        tok = node.children[0]
        value = float(tok)
        if not math.isfinite(value):
            raise BadNumber(_tok_loc(tok), text=str(tok))
        return ast.Num(value, str(tok), loc)
    if kind == "var":
        return ast.Var(str(node.children[0]), loc)
    if kind == "neg":
        return ast.Neg(_as_expr(node.children[0]), loc)
    if kind in _BINOPS:
        return ast.BinOp(_BINOPS[kind], _as_expr(node.children[0]), _as_expr(node.children[1]), loc)
    if kind == "call":
        name, *args = node.children
        return ast.Call(str(name), tuple(_expr(a) for a in args if a is not None), _tok_loc(name))
    if kind == "kwarg":
        name, value = node.children
        return ast.KwArg(str(name), _as_expr(value), _tok_loc(name))
    raise AssertionError(kind)


def _as_expr(node: Tree | Token) -> ast.Expr:
    e = _expr(node)
    assert not isinstance(e, ast.KwArg)  # the grammar only allows kwargs in arg positions
    return e


def _names(node: Tree) -> tuple[ast.Var, ...]:
    return tuple(ast.Var(str(t), _tok_loc(t)) for t in node.children)


def _statement(node: Tree) -> ast.Statement:
    loc = _tree_loc(node)
    if node.data == "input_decl":
        names, *descs = node.children
        return ast.InputDecl(_names(names), tuple(ast.Var(str(d.children[0]), _tok_loc(d.children[0])) for d in descs), loc)
    if node.data == "param_decl":
        names, *rest = node.children
        default = rest[-1]
        descs = rest[:-1]
        return ast.ParamDecl(
            _names(names),
            tuple(ast.Var(str(d.children[0]), _tok_loc(d.children[0])) for d in descs),
            _as_expr(default) if default is not None else None,
            loc,
        )
    if node.data == "let_decl":
        name, value = node.children
        return ast.LetDecl(ast.Var(str(name), _tok_loc(name)), _as_expr(value), loc)
    if node.data == "slot":
        slot_name, arg_list, mapping, placement = node.children
        kw = slot_name.children[0]
        return ast.Slot(
            str(kw),
            _tok_loc(kw),
            tuple(_expr(a) for a in arg_list.children),
            _as_expr(mapping) if mapping is not None else None,
            ast.Var(str(placement), _tok_loc(placement)) if placement is not None else None,
            loc,
        )
    raise AssertionError(node.data)


def parse(text: str, filename: str = "<spec>") -> ast.Spec:
    """Parse spec text into an AST, or raise a SpecError located in `text`."""
    try:
        return _parse(text, filename)
    except SpecError as e:
        raise e.attach(text, filename) from None


def _parse(text: str, filename: str) -> ast.Spec:
    if not text.split("#")[0].strip() and not any(
        line.split("#", 1)[0].strip() for line in text.splitlines()
    ):
        raise EmptySpec(Loc.point(1, 1))
    _prescan(text)
    try:
        tree = _lark().parse(text if text.endswith("\n") else text + "\n")
    except UnexpectedInput as e:
        raise _convert(e, text) from None
    _check_depth(tree)
    rec = tree.children[0]
    name_tok, *stmts = rec.children
    return ast.Spec(
        name=str(name_tok),
        name_loc=_tok_loc(name_tok),
        statements=tuple(_statement(s) for s in stmts),
        filename=filename,
        source=text,
    )
