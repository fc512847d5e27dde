"""Text -> AST. Parses with lark (LALR) and turns every parser failure into a located SpecError."""

from __future__ import annotations

import math
import re
from functools import cache
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken

from . import ast
from .errors import (
    BadCharacter,
    BadNumber,
    DefaultOnInput,
    EmptySpec,
    IncompleteExpression,
    Loc,
    MissingColon,
    MissingEnd,
    MissingEquals,
    MissingName,
    MissingOption,
    MissingRecurrence,
    SpecError,
    StatementNotAtLineStart,
    SyntaxErrorInSpec,
    TextAfterEnd,
    TooDeep,
    UnclosedBracket,
    UnknownStatement,
    UnmatchedBracket,
    did_you_mean,
    source_lines,
)

STATEMENT_WORDS = (
    "input", "param", "let", "decay", "gain", "precond", "solve", "read", "route", "normalize", "scale", "end",
)
MAX_DEPTH = 60
# Outside comments; a `\r` may only end a line (source_lines drops it there).
ALLOWED_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-*/()=,:.<> \t\f\\")


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
_CONTINUED = re.compile(r"\\[\t \f]*$")  # the grammar's line continuation: `\` at the end of a line


def _prescan(text: str) -> None:
    open_parens: list[tuple[int, int]] = []  # (line, col); carried across continued lines only
    for lineno, line in enumerate(source_lines(text), start=1):
        code = line.split("#", 1)[0]
        for col, ch in enumerate(code, start=1):
            if ch not in ALLOWED_CHARS:
                raise BadCharacter(Loc.point(lineno, col), char=ch)
        for col, ch in enumerate(code, start=1):
            if ch == "(":
                open_parens.append((lineno, col))
                if len(open_parens) > MAX_DEPTH:
                    raise TooDeep(Loc.point(lineno, col), limit=MAX_DEPTH)
            elif ch == ")":
                if not open_parens:
                    raise UnmatchedBracket(Loc.point(lineno, col))
                open_parens.pop()
        if open_parens and not _CONTINUED.search(line):
            raise UnclosedBracket(Loc.point(*open_parens[-1]))
    if open_parens:
        raise UnclosedBracket(Loc.point(*open_parens[-1]))


def _readable(term: str) -> str:
    names = {"NAME": "a name", "NUMBER": "a number", "_NL": "end of line", "$END": "end of file"}
    if term in names:
        return names[term]
    for t in _lark().terminals:
        if t.name == term:
            return f"`{t.pattern.value}`"
    return term


def _code(line: str) -> str:
    """A source line without its comment."""
    return line.split("#", 1)[0]


def _first_word_col(text: str, line: int) -> int:
    lines = source_lines(text)
    if 1 <= line <= len(lines):
        src = lines[line - 1]
        return len(src) - len(src.lstrip(" \t\f")) + 1
    return 1


def _first_code_line(lines: list[str]) -> int:
    for i, line in enumerate(lines, start=1):
        if _code(line).strip():
            return i
    return 1


def _end_loc(lines: list[str]) -> Loc:
    """Just after the last statement: where the missing `end` belongs."""
    for i in range(len(lines), 0, -1):
        code = _code(lines[i - 1]).rstrip()
        if code.strip():
            return Loc.point(i, len(code) + 1)
    return Loc.point(1, 1)


_SLOT_EXAMPLES = {
    "decay": "decay scalar(g)",
    "gain": "gain beta",
    "precond": "precond diag(k * k, decay = gP, gain = betaP) -> exp(-log(1.5) * softsign(log(A + 1e-6) - mu)) on write_key",
    "solve": "solve delta",
    "read": "read curvature(lam, centered)",
    "route": "route value",
    "normalize": "normalize q, k",
    "scale": "scale 0.125",
}
_TRAILING_OPS = ("->", "**", "+", "-", "*", "/", "(", "=", ",")


def _convert(err: UnexpectedInput, text: str) -> SpecError:
    lines = source_lines(text)
    name = _spec_name(text)
    if (isinstance(err, UnexpectedEOF) or err.line is None or err.line < 1 or err.line > len(lines)
            or (isinstance(err, UnexpectedToken) and err.token.type == "$END")):
        return MissingEnd(_end_loc(lines), name=name)
    line, col = err.line, err.column
    src_line = lines[line - 1]
    word = ""
    for ch in src_line[col - 1:]:
        if ch.isalnum() or ch == "_":
            word += ch
        else:
            break
    found_text = word or src_line[col - 1: col] or "end of line"
    at_start = col == _first_word_col(text, line)
    tok = err.token if isinstance(err, UnexpectedToken) else None
    expected = set(err.expected) if isinstance(err, UnexpectedToken) else set(getattr(err, "allowed", None) or ())
    before = _code(src_line[: col - 1]).rstrip()
    words_before = before.split()

    if line == _first_code_line(lines) and at_start and word != "recurrence":
        close = did_you_mean(word, ("recurrence",)) if word else ""
        return MissingRecurrence(Loc.point(line, col, len(word)), hint=close or None, word=found_text)
    if words_before == ["recurrence"] and "NAME" in expected:
        return MissingName(Loc.point(line, before.index("recurrence") + 1, len("recurrence")))
    if tok is not None and tok.type != "_NL" and "$END" in expected and expected <= {"$END", "_NL"}:
        return TextAfterEnd(_tok_loc(tok), word=str(tok), name=name)
    if at_start and word and word not in STATEMENT_WORDS and (word[0].isalpha() or word[0] == "_"):
        return UnknownStatement(
            Loc.point(line, col, len(word)), hint=did_you_mean(word, STATEMENT_WORDS) or None, word=word
        )
    if tok is not None and not at_start and str(tok) in STATEMENT_WORDS and tok.type == str(tok).upper():
        return StatementNotAtLineStart(_tok_loc(tok), word=str(tok))
    if tok is not None and tok.type == "NAME" and "COLON" in expected and words_before[:1] in (["input"], ["param"]):
        names = " ".join(words_before[1:])
        return MissingColon(_tok_loc(tok), word=str(tok), keyword=words_before[0], names=names)
    if tok is not None and expected == {"EQUAL"} and words_before[:1] == ["let"] and len(words_before) == 2:
        return MissingEquals(_tok_loc(tok), name=words_before[1])
    readable = ", ".join(sorted({_readable(t) for t in expected})[:8])
    if tok is not None and tok.type == "NAME" and words_before[-1:] == ["on"] and before[:-2].rstrip().endswith("->"):
        # `-> on write_key`: the map is missing, so `on` was read as the map
        arrow = before[:-2].rstrip()
        return IncompleteExpression(Loc.point(line, len(arrow) - 1, 2), after="->",
                                    expected="the map from the statistic A, e.g. `-> exp(-log(1.5) * softsign(log(A + 1e-6)))`")
    if tok is not None and tok.type == "_NL" and "NUMBER" in expected:
        if len(words_before) == 1 and words_before[0] in _SLOT_EXAMPLES:
            first = _first_word_col(text, line)
            return MissingOption(Loc.point(line, first, len(words_before[0])), slot=words_before[0],
                                 example=_SLOT_EXAMPLES[words_before[0]])
        for op in _TRAILING_OPS:
            if before.endswith(op):
                return IncompleteExpression(Loc.point(line, len(before) - len(op) + 1, len(op)), after=op,
                                            expected=readable)
    if tok is not None:
        found = "end of line" if tok.type == "_NL" else f"`{tok}`"
        loc = _tok_loc(tok) if tok.type != "_NL" else Loc.point(line, col)
        return SyntaxErrorInSpec(loc, found=found, expected=readable)
    return SyntaxErrorInSpec(Loc.point(line, col, max(1, len(word))), found=f"`{found_text}`", expected=readable)


def _spec_name(text: str) -> str:
    for line in source_lines(text):
        parts = _code(line).split()
        if len(parts) >= 2 and parts[0] == "recurrence":
            return parts[1]
    return "?"


# --- lark tree -> AST ---------------------------------------------------------------------------
def _check_depth(tree: Tree) -> None:
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooDeep(_tree_loc(node), limit=MAX_DEPTH)
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
        names, *descs, default = node.children
        if default is not None:
            raise DefaultOnInput(_tree_loc(default) if isinstance(default, Tree) else _tok_loc(default))
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
        line.split("#", 1)[0].strip() for line in source_lines(text)
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
