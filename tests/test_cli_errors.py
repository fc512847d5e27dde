"""`dgps check` / `dgps show` on bad input: located one-screen errors, exit status 1, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dgps.cli import main

ROOT = Path(__file__).parent.parent
CATALOGUE = sorted((Path(__file__).parent / "bad_specs").glob("*.dgps"))
SPECS = sorted((ROOT / "specs").glob("*.dgps"))  # absolute paths
EXPECT = re.compile(r"^# expect: (\d+):(\d+): (.+)$")


def dgps(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dgps.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_check_whole_catalogue() -> None:
    r = dgps("check", *CATALOGUE)
    assert r.returncode == 1
    no_traceback(r)
    assert "ok (" not in r.stdout, r.stdout
    heads = [line for line in r.stderr.splitlines() if ": error: " in line]
    assert len(heads) == len(CATALOGUE), "one error per file"
    for path, head in zip(CATALOGUE, heads, strict=True):
        m = EXPECT.match(path.read_text().splitlines()[0])
        assert m is not None
        assert head.startswith(f"{path}:{m[1]}:{m[2]}: error: "), head
        assert m[3] in head
    assert r.stderr.count("\nhint: ") + r.stderr.startswith("hint: ") == len(CATALOGUE)


def test_check_library_is_clean() -> None:
    r = dgps("check", *SPECS)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.count(": ok (") == len(SPECS)


def test_unreadable_files_one_line_each(tmp_path: Path) -> None:
    """Missing file, directory, binary file, a non-UTF-8 byte in a comment, one-line text that looks like a
    path: each gets one line, the good spec after them is still checked, and the exit status is 1."""
    missing = tmp_path / "nope.dgps"
    binary = tmp_path / "image.dgps"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    latin1 = tmp_path / "latin1.dgps"
    latin1.write_bytes((ROOT / "specs" / "la.dgps").read_bytes().replace(
        b"input v    : value", b"input v    : value  # \xe2\x88\x92 caf\xe9"))
    odd = tmp_path / "odd.dgps"
    odd.write_text("specs/la.dgps")
    r = dgps("check", missing, tmp_path, binary, latin1, odd, SPECS[0])
    assert r.returncode == 1
    no_traceback(r)
    assert r.stdout.splitlines() == [f"{SPECS[0]}: ok ({SPECS[0].stem})"]
    err = r.stderr.splitlines()
    assert err[0] == f"{missing}: error: no such file"
    assert err[1] == f"{tmp_path}: error: not a file"
    assert err[2] == f"{binary}:1:1: error: not a UTF-8 text file (byte 0x89); a spec is UTF-8 text"
    # column 30 in characters: the comment's `−` is three bytes but one column
    assert err[3] == f"{latin1}:4:30: error: not a UTF-8 text file (byte 0xe9); a spec is UTF-8 text"
    assert err[4] == f"{odd}:1:1: error: expected `recurrence NAME`, found `specs`"
    assert err[5:] == ["  specs/la.dgps", "  ^^^^^", "hint: a spec starts with `recurrence NAME`, then one statement "
                       "per line, then `end`"]


@pytest.mark.parametrize("stage", ["ast", "ir"])
def test_show_bad_spec(stage: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = next(p for p in CATALOGUE if p.stem == "expr_unknown_function")
    assert main(["show", str(bad), "--stage", stage]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[0] == f"{bad}:9:16: error: unknown function `sigmod`"
    assert err.splitlines()[1:] == ["    let   beta = sigmod(b)", "                 ^^^^^^", "hint: did you mean `sigmoid`?"]


def test_show_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(tmp_path / "nope.dgps")]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"{tmp_path / 'nope.dgps'}: error: no such file"]


def test_check_in_process_matches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(SPECS[0])]) == 0
    assert main(["check", "-q", *map(str, CATALOGUE[:3])]) == 1
    out, err = capsys.readouterr()
    assert out == f"{SPECS[0]}: ok ({SPECS[0].stem})\n"
    assert sum(": error: " in line for line in err.splitlines()) == 3


@pytest.mark.parametrize("args, message", [
    (["verify", "specs/gdn.dgps", "--T", "0"], "argument --T: expected a positive integer, got 0"),
    (["verify", "specs/gdn.dgps", "--dk", "0"], "argument --dk: expected a positive integer, got 0"),
    (["verify", "specs/gdn.dgps", "--B", "two"], "argument --B: expected a positive integer, got 'two'"),
    (["verify", "specs/gdn.dgps", "--HV", "3"], "argument --HV: must be a multiple of --H = 2, got 3"),
    (["fuzz", "--count", "0"], "argument --count: expected a positive integer, got 0"),
    (["show", "specs"], "argument spec: 'specs' is a directory; pass a spec file"),
    (["compile", "specs", "-o", "x"], "argument spec: 'specs' is a directory; pass a spec file"),
    (["verify", "specs"], "argument spec: 'specs' is a directory; pass a spec file"),
    (["fuzz", "--out", "x.dgps"], "argument --out: names a directory for failing specs, got 'x.dgps'"),
    (["compile", "specs/gdn.dgps", "-o", "x", "--report-dims", "-1"],
     "argument --report-dims: expected a positive integer, got -1"),
])
def test_bad_numbers_are_one_line_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    r = dgps(*args, cwd=ROOT)
    assert r.returncode == 2
    no_traceback(r)
    assert r.stdout == ""
    assert r.stderr.splitlines()[-1].endswith(message), r.stderr
    assert not (ROOT / "x.dgps").exists() and not (ROOT / "x").exists()


def test_version_and_defaults_in_help() -> None:
    from dgps import __version__

    r = dgps("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"dgps {__version__}"
    r = dgps("verify", "--help")
    assert r.returncode == 0
    assert "(default: 45)" in r.stdout and "(default: fp32)" in r.stdout


def test_load_a_directory_says_so(tmp_path: Path) -> None:
    import dgps as dg

    for arg in (tmp_path, str(tmp_path), f"{tmp_path}/"):
        with pytest.raises(IsADirectoryError, match="is a directory; pass a spec file or spec text"):
            dg.load(arg)


def test_verify_reports_progress_on_stderr() -> None:
    r = dgps("verify", "specs/la.dgps", "--T", "8", "--dk", "16", "--dv", "16")
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stderr.splitlines() if line.startswith("  [")]
    assert [s.split("] ", 1)[1] for s in steps] == [
        "float64 reference ...", "forward kernels (chunk) ...", "decode kernel (recurrent, in place) ...",
        "backward kernels (chunk) and float64 autograd ..."]


@pytest.mark.parametrize("command", ["check", "show", "compile", "verify", "report", "fuzz"])
def test_help_states_each_default_once(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "(default: None)" not in out.replace("\n", " ").replace("  ", " ")
    assert "(default: H) (default" not in out
