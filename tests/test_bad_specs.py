"""The bad-spec catalogue: every file in tests/bad_specs/ has exactly one mistake, and its first line says
where the error must point and what it must say:

    # expect: LINE:COL: message fragment

Each must render as `FILE:LINE:COL: error: <message>`, then the source line, a caret under the
column, and a `hint:` line; never anything but a dgps.SpecError.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dgps
from dgps.dsl.errors import SpecError, printable_line, source_lines

CATALOGUE = Path(__file__).parent / "bad_specs"
FILES = sorted(CATALOGUE.glob("*.dgps"))
EXPECT = re.compile(r"^# expect: (\d+):(\d+): (.+)$")


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # not read_text(): that would turn a lone \r into \n


def expectation(path: Path) -> tuple[int, int, str]:
    m = EXPECT.match(read(path).split("\n")[0])
    assert m, f"{path.name}: first line must be `# expect: LINE:COL: message fragment`"
    return int(m[1]), int(m[2]), m[3].strip()


def check_rendering(rendered: str, source: str, filename: str, line: int, col: int, fragment: str) -> None:
    out = rendered.splitlines()
    prefix = f"{filename}:{line}:{col}: error: "
    assert out[0].startswith(prefix), f"first line {out[0]!r} does not start with {prefix!r}"
    message = out[0][len(prefix):]
    assert fragment in message, f"{message!r} does not contain {fragment!r}"
    assert "\n" not in message and message.strip() == message and message
    # the source line, then a caret line whose first ^ is under the column
    src = printable_line(source_lines(source)[line - 1])
    assert out[1] == f"  {src}", f"second line should quote source line {line}: {out[1]!r}"
    caret = out[2]
    assert re.fullmatch(r"  ( *)\^+", caret), f"third line is not a caret line: {caret!r}"
    assert caret.index("^") - 2 == col - 1, "caret is not under the reported column"
    hints = [x for x in out[3:] if x.startswith("hint: ")]
    assert len(hints) == 1 and len(hints[0]) > len("hint: ") + 3, f"no useful hint in {out[3:]!r}"
    assert "Traceback" not in rendered


def test_catalogue_is_large_and_each_file_has_a_header() -> None:
    assert len(FILES) >= 40
    for p in FILES:
        expectation(p)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_spec(path: Path) -> None:
    line, col, fragment = expectation(path)
    text = read(path)
    with pytest.raises(SpecError) as info:
        dgps.load(text, filename=path.name)
    err = info.value
    assert (err.loc.line, err.loc.col) == (line, col)
    check_rendering(err.render(), text, path.name, line, col, fragment)
    assert str(err) == err.render()


@pytest.mark.parametrize("path", FILES[:5], ids=[p.stem for p in FILES[:5]])
def test_load_from_path_names_the_file(path: Path) -> None:
    line, col, fragment = expectation(path)
    with pytest.raises(SpecError) as info:
        dgps.load(path)
    check_rendering(info.value.render(), read(path), str(path), line, col, fragment)


def test_one_error_class_per_mistake() -> None:
    """Distinct mistakes should not all collapse into the generic syntax error."""
    kinds = {}
    for p in FILES:
        try:
            dgps.load(read(p), filename=p.name)
        except SpecError as e:
            kinds.setdefault(type(e).__name__, []).append(p.stem)
    assert len(kinds) >= 35, sorted(kinds)
    assert len(kinds.get("SyntaxErrorInSpec", [])) <= 3, kinds.get("SyntaxErrorInSpec")


@pytest.mark.parametrize("text", ["", "   \n\t\n", "# only a comment\n"])
def test_empty_text(text: str) -> None:
    with pytest.raises(SpecError) as info:
        dgps.load(text + "\n")
    first = info.value.render().splitlines()[0]
    assert first == "<spec>:1:1: error: no recurrence found"


def test_missing_end_on_a_single_line_spec() -> None:
    with pytest.raises(SpecError) as info:
        dgps.load("recurrence la\n")
    assert info.value.render().splitlines()[0] == "<spec>:1:14: error: recurrence `la` is not closed"


def test_param_default_accepts_constant_arithmetic() -> None:
    base = Path(__file__).parent.parent / "specs" / "pgdn.dgps"
    text = base.read_text().replace("= -0.2", "= -0.1 * 2")
    assert "-0.1 * 2" in text
    rec = dgps.load(text)
    mu = next(d for d in rec.ir.inputs if d.name == "mu")
    assert mu.default == pytest.approx(-0.2)


def test_line_continuation_carries_brackets() -> None:
    text = (Path(__file__).parent.parent / "specs" / "mamba2.dgps").read_text()
    text = text.replace("decay scalar(-exp(A_log) * dt)", "decay scalar(-exp(A_log) \\\n               * dt)")
    assert "\\\n" in text
    assert dgps.load(text).ir.decay.kind == "scalar"


def test_every_valid_spec_still_loads() -> None:
    for p in sorted((Path(__file__).parent.parent / "specs").glob("*.dgps")):
        dgps.load(p)
