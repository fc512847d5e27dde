"""Ladder rung 4: every kernel of every spec compiles ahead of time for Hopper (sm_90) without a GPU.

The package's host code runs with Triton's launcher replaced by a recorder, so the kernels compiled are
exactly those the forward, decode and backward paths launch, with the specialisations they launch with
(runtime/report.py). ptxas reports registers and spills; a failure to compile fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dgps
from dgps.runtime.report import aot_report, format_report

SPECS = sorted((Path(__file__).resolve().parent.parent / "specs").glob("*.dgps"))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_kernel_compiles_for_hopper(path: Path) -> None:
    rec = dgps.load(path)
    reports = aot_report(rec, dims=(64, 128), T=128)
    text = format_report(reports)
    print(text)
    assert reports, "no kernel was launched"
    assert all(r.ok for r in reports), text
    assert {r.dk for r in reports} == {64, 128}
    assert "recurrent" in {r.module for r in reports}
    # the backward is the chunked one where the spec has it, else the recurrent backward kernel
    chunk_bwd = any(r.kernel == "chunk_bwd_grad_kernel" for r in reports)
    assert chunk_bwd or "backward" in {r.module for r in reports}
    assert chunk_bwd == (dgps.compile(rec).METADATA["backward"] == "chunk")
