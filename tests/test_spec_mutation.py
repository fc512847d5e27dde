"""Mutation fuzzing of the front end: any text either loads or raises a located dgps.SpecError.

Valid specs from specs/ are mutated (characters deleted, inserted or replaced; lines deleted,
duplicated, swapped or replaced by a line of another spec; a token replaced by a random word or number;
truncation), and random text is fed in as well. `dgps.load(text)` must return a Recurrence or raise
SpecError whose rendering starts with `<spec>:L:C: error:` with L, C inside the text and ends with a
hint — never another exception.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dgps
from dgps.dsl.errors import SpecError, printable_line, source_lines

SPECS = [p.read_text() for p in sorted((Path(__file__).parent.parent / "specs").glob("*.dgps"))]
HEAD = re.compile(r"<spec>:(\d+):(\d+): error: \S")

# The words and numbers a mutation splices in: the language's own vocabulary, near misses, edge numbers.
WORDS = [
    "recurrence", "end", "input", "param", "let", "decay", "gain", "precond", "solve", "read", "route",
    "normalize", "scale", "on", "key", "value", "token", "key_channel", "value_channel", "head", "key_head",
    "log_gate", "unit", "positive", "free", "none", "scalar", "vector", "const", "diag", "exact", "additive",
    "delta", "erase_write", "dplr", "plain", "curvature", "centered", "uncentered", "residual", "write_key",
    "query", "lambda", "e", "f", "reads", "undecayed", "decayed", "eps", "A", "head_index", "ktilde", "q", "k",
    "v", "g", "beta", "mu", "exp", "log", "sqrt", "abs", "sigmoid", "softplus", "logsigmoid", "tanh", "silu",
    "x", "_", "solv", "inptu", "->", "**", "(", ")", "=", ",", ":", "-", "+", "*", "/", "#", "\\",
]
NUMBERS = ["0", "1", "-1", "2", "0.5", "1e-6", "1e308", "1e309", "1e999", "1e-400", "0.0", ".5", "7.",
           "99999999999999999999999999", "1e-320", "16", "17", "-0"]
ALL_LINES = sorted({line for text in SPECS for line in text.split("\n") if line.strip()})
CHARS = "abcxyz_AZ019 ()=,:.-+*/<>#\n\t\r\f\\@[]é\x00\u2028"
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|->|\*\*|[-+*/(),=:]")


@st.composite
def mutation(draw: st.DrawFn, text: str) -> str:
    lines = text.split("\n")
    op = draw(st.sampled_from(["del_char", "ins_char", "rep_char", "del_line", "dup_line", "swap_lines",
                               "splice_line", "rep_word", "rep_number", "truncate"]))
    if op in ("del_char", "rep_char") and text:
        i = draw(st.integers(0, len(text) - 1))
        new = "" if op == "del_char" else draw(st.sampled_from(CHARS))
        return text[:i] + new + text[i + 1:]
    if op == "ins_char":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.sampled_from(CHARS)) + text[i:]
    if op in ("del_line", "dup_line", "swap_lines", "splice_line"):
        i = draw(st.integers(0, len(lines) - 1))
        if op == "del_line":
            del lines[i]
        elif op == "splice_line":  # a line of another spec: well-formed, but maybe not here
            lines[i] = draw(st.sampled_from(ALL_LINES))
        elif op == "dup_line":
            lines.insert(i, lines[i])
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    if op in ("rep_word", "rep_number"):
        tokens = list(TOKEN.finditer(text))
        if not tokens:
            return text
        m = draw(st.sampled_from(tokens))
        new = draw(st.sampled_from(WORDS if op == "rep_word" else NUMBERS))
        return text[: m.start()] + new + text[m.end():]
    return text[: draw(st.integers(0, len(text)))]


@st.composite
def mutated_spec(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SPECS))
    for _ in range(draw(st.integers(1, 3))):
        text = draw(mutation(text))
    return text


vocabulary_text = st.lists(
    st.sampled_from(WORDS + NUMBERS + [" ", " ", "\n", "\n  "]), max_size=40
).map(lambda ws: " ".join(ws))
random_text = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=CHARS, max_size=200),
    vocabulary_text,
    vocabulary_text.map(lambda t: "recurrence r\n  " + t + "\nend\n"),
)


def assert_loads_or_located_error(text: str) -> None:
    # `dgps.load("x.dgps")` reads a file: a one-line text ending in .dgps is a path, not spec text.
    assume(not ("\n" not in text and text.endswith(".dgps")))
    try:
        rec = dgps.load(text)
    except SpecError as e:
        rendered = e.render()
        m = HEAD.match(rendered)
        assert m, f"bad error head: {rendered.splitlines()[0]!r}"
        line, col = int(m[1]), int(m[2])
        lines = source_lines(text)
        assert 1 <= line <= len(lines), f"line {line} outside the text ({len(lines)} lines)"
        assert 1 <= col <= len(lines[line - 1]) + 1, f"column {col} outside line {line!r}"
        out = rendered.split("\n")
        assert out[1] == "  " + printable_line(lines[line - 1]), "source line not quoted"
        assert out[2].strip(" ").startswith("^") and set(out[2].strip()) == {"^"}, "no caret line"
        assert out[-1].startswith("hint: ") and len(out[-1]) > len("hint: "), "no hint"
        assert (e.loc.line, e.loc.col) == (line, col)
    else:
        assert isinstance(rec, dgps.Recurrence)
        assert rec.ir.solve is not None


COMMON = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=220, **COMMON)
@given(mutated_spec())
def test_mutated_specs_load_or_give_located_errors(text: str) -> None:
    assert_loads_or_located_error(text)


@settings(max_examples=80, **COMMON)
@given(random_text)
def test_random_text_gives_located_errors(text: str) -> None:
    assert_loads_or_located_error(text)


def test_the_checker_catches_a_mutation() -> None:
    """The property is not vacuous: a known mutation is an error, the unmutated spec is not."""
    text = next(t for t in SPECS if "solve delta" in t)
    assert isinstance(dgps.load(text), dgps.Recurrence)
    try:
        dgps.load(text.replace("solve delta", "solve delt"))
    except SpecError as e:
        assert "did you mean `delta`?" in e.render()
    else:
        raise AssertionError("a misspelled solve option loaded")
