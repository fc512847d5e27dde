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
