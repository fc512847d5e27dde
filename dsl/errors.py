"""Located spec errors.

Every problem with a spec is one `SpecError` subclass: a one-line message template, a hint template
and the source span it points at. `render()` gives `file:line:col: error: ...`, the source line with
a caret under the span, and the hint, the way lark and compilers report errors.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Loc:
    """A 1-based source span; `end_col` is exclusive."""

    line: int
    col: int
    end_line: int
    end_col: int

    @staticmethod
    def point(line: int, col: int, width: int = 1) -> Loc:
        return Loc(line, col, line, col + max(width, 1))


NOWHERE = Loc(1, 1, 1, 2)


def printable_line(line: str) -> str:
    """A source line as quoted under an error: one column per character, control characters as spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in line)


def source_lines(text: str) -> list[str]:
    """The lines of a spec as the parser counts them: split at `\n` only (a `\r` before it is dropped).

    `str.splitlines` would also split at form feeds, `\x1c`, `\u2028`, ..., and so disagree with the
    parser's line numbers."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else ""


class SpecError(Exception):
    """Base class: subclasses set `template` (and usually `hint`), formatted with their fields."""

    template: ClassVar[str] = "{message}"
    hint: ClassVar[str] = ""

    def __init__(self, loc: Loc, hint: str | None = None, **fields: object) -> None:
        self.loc = loc
        self.fields = fields
        self.message = self.template.format(**fields)
        self.hint_text = hint if hint is not None else self.hint.format(**fields)
        self.filename = "<spec>"
        self.source = ""
        super().__init__(self.message)

    def attach(self, source: str, filename: str) -> SpecError:
        self.source, self.filename = source, filename
        return self

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        head = f"{self.filename}:{self.loc.line}:{self.loc.col}: error: {self.message}"
        lines = source_lines(self.source)
        out = [head]
        if 1 <= self.loc.line <= len(lines):
            text = printable_line(lines[self.loc.line - 1])
            width = self.loc.end_col - self.loc.col if self.loc.end_line == self.loc.line else 1
            width = max(1, min(width, max(1, len(text) - self.loc.col + 1)))
            out += [f"  {text}", "  " + " " * (self.loc.col - 1) + "^" * width]
        if self.hint_text:
            out.append(f"hint: {self.hint_text}")
        return "\n".join(out)


# --- syntax ---------------------------------------------------------------------------------------
class SyntaxErrorInSpec(SpecError):
    template = "unexpected {found}"
    hint = "expected {expected}"


class UnclosedBracket(SpecError):
    template = "unclosed `(`"
    hint = "add the matching `)` before the end of the line"


class UnmatchedBracket(SpecError):
    template = "unmatched `)`"
    hint = "remove it or add the opening `(`"


class UnknownStatement(SpecError):
    template = "unknown statement `{word}`"
    hint = "a line starts with input, param, let, decay, gain, precond, solve, read, route, normalize, scale or end"


class MissingEnd(SpecError):
    template = "recurrence `{name}` is not closed"
    hint = "add a line `end` after the last statement"


class MissingRecurrence(SpecError):
    template = "expected `recurrence NAME`, found `{word}`"
    hint = "a spec starts with `recurrence NAME`, then one statement per line, then `end`"


class MissingName(SpecError):
    template = "`recurrence` needs a name"
    hint = "e.g. `recurrence gdn`"


class TextAfterEnd(SpecError):
    template = "unexpected `{word}` after the `end` of recurrence `{name}`"
    hint = "a spec file holds one recurrence; move this line above `end`"


class MissingColon(SpecError):
    template = "missing `:` before `{word}`"
    hint = "write the names, a colon, then the role, e.g. `{keyword} {names} : {word}`"


class MissingEquals(SpecError):
    template = "missing `=` after `let {name}`"
    hint = "write `let {name} = <expression>`"


class IncompleteExpression(SpecError):
    template = "expression is incomplete after `{after}`"
    hint = "expected {expected}"


class MissingOption(SpecError):
    template = "`{slot}` needs an option"
    hint = "e.g. `{example}`"


class StatementNotAtLineStart(SpecError):
    template = "`{word}` must start its own line"
    hint = "one statement per line: break the line before `{word}`"


class BadCharacter(SpecError):
    template = "unexpected character {char!r}"
    hint = "names are letters, digits and `_`; operators are + - * / ** ( ) , = : ->"


class EmptySpec(SpecError):
    template = "no recurrence found"
    hint = "a spec is `recurrence NAME`, one statement per line, then `end`"


class TooDeep(SpecError):
    template = "expression nested too deeply (more than {limit} levels)"
    hint = "split it into several `let` lines"


class BadNumber(SpecError):
    template = "number `{text}` is not a finite float"
    hint = "use a number between -1e308 and 1e308"


# --- declarations ---------------------------------------------------------------------------------
class DuplicateDefinition(SpecError):
    template = "`{name}` is defined twice"
    hint = "its first definition is on line {first_line}; rename one of them"


class UnknownRole(SpecError):
    template = "unknown role `{word}`"
    hint = "roles: key, value, token, key_channel, value_channel (inputs); head, key_channel, value_channel (params)"


class UnknownDescriptor(SpecError):
    template = "unknown descriptor `{word}`"
    hint = "after the role: a domain (log_gate, unit, positive, free) and optionally key_head"


class MissingRole(SpecError):
    template = "`{names}` has no role"
    hint = "write a role before the domain, e.g. `{keyword} {names} : {example} {word}`"


class ConflictingDescriptor(SpecError):
    template = "`{word}` conflicts with `{other}` on the same declaration"
    hint = "a declaration has one role and at most one domain"


class BadDefault(SpecError):
    template = "default of `{name}` must be a constant, but it reads `{reads}`"
    hint = "write a number, e.g. `param {name} : head = -0.2`"


class DefaultOnInput(SpecError):
    template = "inputs have no defaults"
    hint = "declare a per-head `param` to give a default"


class MissingCoreInput(SpecError):
    template = "missing input `{name}` ({what})"
    hint = "declare it, e.g. `{example}`"


class WrongCoreRole(SpecError):
    template = "`{name}` must have role `{role}`, not `{got}`"
    hint = "declare `input {name} : {role}`"


class ReservedName(SpecError):
    template = "`{name}` is reserved"
    hint = "{why}"


# --- expressions ----------------------------------------------------------------------------------
class UndefinedName(SpecError):
    template = "undefined name `{name}`"
    hint = "declare it with input/param/let before use"


class UsedBeforeDefinition(SpecError):
    template = "`{name}` is used before its definition"
    hint = "`{name}` is defined on line {line}; move that line above this one"


class UnknownFunction(SpecError):
    template = "unknown function `{name}`"
    hint = "functions: {known}"


class WrongArity(SpecError):
    template = "`{name}` takes {expected} argument(s), got {got}"
    hint = "call it as {name}(x)"


class KeywordInExpression(SpecError):
    template = "keyword argument `{name} =` is not allowed inside an expression"
    hint = "keyword arguments only go in a slot option, e.g. diag(k * k, decay = gP)"


class MixedVectors(SpecError):
    template = "expression mixes a key-channel vector (`{key}`) with a value-channel vector (`{value}`)"
    hint = "elementwise expressions live on one side of the state: dk or dv"


class ReductionOverScalar(SpecError):
    template = "`{name}` reduces over channels, but `{expr}` is {kind}"
    hint = ("sum and l2norm take a key-channel or value-channel vector, e.g. `sum(k * k)` or `l2norm(kappa)`; "
            "a token-level or per-head value has no channels to reduce")


class ReductionMixesRoles(SpecError):
    template = "`{name}` mixes a key-channel vector (`{key}`) with a value-channel vector (`{value}`)"
    hint = "a reduction runs over one side of the state (dk or dv): reduce each side on its own, e.g. sum(k * k) * sum(v * v)"


class ReductionOverStatistic(SpecError):
    template = "`{name}` cannot reduce over the preconditioner statistic `A`"
    hint = "reductions are computed per token from the inputs; the diag map acts on A elementwise"


class NotStatic(SpecError):
    template = "{where} must not depend on per-token inputs (`{name}` is per token)"
    hint = "use params, head_index and numbers only"


# --- slots ----------------------------------------------------------------------------------------
class UnknownSlotOption(SpecError):
    template = "unknown {slot} option `{word}`"
    hint = "{slot} options: {options}"


class DuplicateSlot(SpecError):
    template = "slot `{slot}` is given twice"
    hint = "its first line is {first_line}; a recurrence has one line per slot"


class MissingSlot(SpecError):
    template = "recurrence `{name}` has no `{slot}` line"
    hint = "{example}"


class WrongArguments(SpecError):
    template = "`{option}` {problem}"
    hint = "write it as {usage}"


class DuplicateArgument(SpecError):
    template = "argument `{name}` is given twice"
    hint = "it is first given at column {first_col}; keep one of them"


class UnknownKeyword(SpecError):
    template = "`{option}` has no argument `{word}`"
    hint = "arguments of {option}: {known}"


class VectorAsScalar(SpecError):
    template = "{what} must be one number per token, but `{expr}` is a {kind} vector"
    hint = "{fix}"


class WrongKind(SpecError):
    template = "{what} must be {expected}, but `{expr}` is {kind}"
    hint = "{fix}"


class NotLogDomain(SpecError):
    template = "{what} `{expr}` is not provably <= 0"
    hint = (
        "decays are log-gates: declare the input `log_gate`, or map it with "
        "-exp(...) * softplus(...) or logsigmoid(...)"
    )


class NotUnitInterval(SpecError):
    template = "const decay `{expr}` is outside (0, 1] at head_index = {head}"
    hint = "const(...) takes the decay factor itself (RetNet: 1 - 2 ** (-5 - head_index))"


class UnsupportedCombination(SpecError):
    template = "{what} is not supported: {reason}"
    hint = "{fix}"


class CurvatureNeedsNormalizedKeys(SpecError):
    template = "a curvature read needs L2-normalised keys, but `{missing}` is not normalised"
    hint = ("add `normalize q, k`: the curvature statistics C = Σ k kᵀ and μ = Σ k / t are defined on "
            "L2-normalised keys (and q' on a normalised query)")


class UnusedInput(SpecError):
    template = "{what} `{name}` is declared but never used"
    hint = "remove it, or use it in a let or slot"


class PlacementError(SpecError):
    template = "`{option}` placement must be `on write_key` or `on query`, got {got}"
    hint = "e.g. `precond exact(lambda = 1.0) on query`"


class MissingPlacement(SpecError):
    template = "`{option}` needs a placement: `on write_key` (ATK) or `on query` (ATQ)"
    hint = "end the line with `on write_key` or `on query`"


class UnexpectedMap(SpecError):
    template = "`->` map is only allowed on a diag preconditioner"
    hint = "remove `-> ...` from this line"


class NotAnInput(SpecError):
    template = "`{name}` in {slot} must be a declared {what}"
    hint = "{fix}"


class NotReal(SpecError):
    template = "`{expr}` does not evaluate to a finite real number"
    hint = "it is infinite, undefined or complex: check for division by zero, signs under sqrt/log, overflowing exp/powers"
