"""A bounded run of the spec fuzzer (what `dgps fuzz` does): random valid specs compiled, their forward,
decode and generated backward kernels checked against the reference derived from the same spec."""

from __future__ import annotations

from pathlib import Path

from dgps.runtime.fuzz import fuzz


def test_bounded_spec_fuzz(tmp_path: Path) -> None:
    result = fuzz(count=12, seed=0, out_dir=tmp_path, T=12, log=lambda _line: None)
    assert result.failure_error == "", f"{result.failure_text}\n{result.failure_error}"
    assert result.count == 12
