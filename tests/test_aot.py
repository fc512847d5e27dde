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
# issue 9: no kernel of the vector-decay family's chunk modules spills at dk = 128 (rwkv7_dplr, the untied family,
# keeps spills at its measured-fastest settings: codegen/launch.py)
NO_SPILL_AT_128 = ("kda", "gla", "gdn2", "pkda", "ccq_gla", "ccq_gla_uncentered", "clvr_kda", "cler_h_kda")


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
    if path.stem in NO_SPILL_AT_128:
        spills = [r for r in reports if r.module == "chunk" and r.dk == 128 and r.spill_bytes]
        assert not spills, format_report(spills)


def test_sass_counts_parse_cuobjdump() -> None:
    from dgps.runtime.report import sass_counts

    sass = """
        /*0040*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;          /* 0x000000000c04723c */
        /*0050*/               @!P0 FFMA R2, R3, R4, R2 ;                         /* 0x0000000403020223 */
        /*0060*/                   LDS.128 R8, [R2] ;                              /* 0x0000000002087984 */
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                   /* 0x0000000000007b1d */
        /*0080*/                   EXIT ;                                          /* 0x000000000000794d */
    """
    assert sass_counts(sass) == {"instructions": 5, "mma": 1, "ffma": 1, "shared": 1, "barriers": 1}


def test_no_decay_block_merges_run_on_tensor_cores() -> None:
    """delta_rule's solve merges its 16×16 blocks as tf32x3 products (chunk_interaction.jinja): on sm_90 an IEEE fp32
    dot runs as FMA loops through shared memory (1048 FFMA in the interaction's SASS at dk = 128 with IEEE merges)."""
    rec = dgps.load(next(p for p in SPECS if p.stem == "deltanet"))
    inter = [r for r in aot_report(rec, dims=(128,), T=128) if r.kernel == "chunk_interaction_kernel"]
    assert inter and all(r.sass["mma"] >= 64 and r.sass["ffma"] < 300 for r in inter), format_report(inter)
