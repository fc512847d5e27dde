"""A bounded run of the spec fuzzer (what `dgps fuzz` does): random valid specs compiled, their forward,
decode and generated backward kernels checked against the reference derived from the same spec.

Thirty specs in three independent draws (so pytest-xdist can spread them); the last draw uses T = 70,
two chunks, so the chunk kernels' cross-chunk passes are exercised too."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgps.runtime.fuzz import fuzz


@pytest.mark.parametrize(("seed", "T"), [(0, 12), (1, 12), (2, 70)])
def test_bounded_spec_fuzz(tmp_path: Path, seed: int, T: int) -> None:
    result = fuzz(count=10, seed=seed, out_dir=tmp_path, T=T, log=lambda _line: None)
    assert result.failure_error == "", f"{result.failure_text}\n{result.failure_error}"
    assert result.count == 10


def test_a_failure_file_says_how_to_repeat_it(tmp_path: Path) -> None:
    """The minimal failing spec is written with the layout and input seed of its draw and the `dgps verify` command
    that runs the same checks again; the file is a valid spec."""
    import shlex

    import dgps
    from dgps.cli import build_parser
    from dgps.runtime.fuzz import write_failure

    spec = (Path(__file__).resolve().parents[1] / "specs" / "gdn.dgps").read_text()
    path = write_failure(spec, 7, "AssertionError: o 1e-1", tmp_path, {"dk": 24, "dv": 20, "HV": 2, "varlen": True}, T=70)
    text = path.read_text()
    assert dgps.load(path).name == "gdn"
    repeat = next(line for line in text.splitlines() if "to repeat it:" in line).split("to repeat it: ")[1]
    args = build_parser().parse_args(shlex.split(repeat)[1:])
    assert (args.command, args.T, args.B, args.H, args.HV, args.dk, args.dv, args.seed, args.varlen) == \
        ("verify", 70, 1, 1, 2, 24, 20, 7, True)
