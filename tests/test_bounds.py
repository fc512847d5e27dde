"""Every generated kernel's loads and stores stay inside the tensor each pointer was derived from (dgps/runtime/bounds.py),
at head sizes that are not powers of two, grouped heads, ragged packed sequences and launch settings off the table.

The interpreter dereferences unmasked addresses without complaint; on a GPU the same access faults or overwrites a
neighbour. The checker's own tests below show it catching each kind of stray access it claims to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import dgps  # noqa: E402
from dgps.codegen.chunk import supports_chunk_backward  # noqa: E402
from dgps.runtime.bounds import checked_bounds, run_spec  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs Triton's CPU interpreter (TRITON_INTERPRET=1, set on machines without a GPU): "
                                       "the bounds checker instruments it")

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"
CHUNK = [p.stem for p in sorted(SPEC_DIR.glob("*.dgps")) if supports_chunk_backward(dgps.load(p).ir)[0]]


@triton.jit
def _shifted_copy(x, y, n, BLOCK: tl.constexpr, SHIFT: tl.constexpr, MASK_LOAD: tl.constexpr,
                  MASK_STORE: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = (o + SHIFT >= 0) & (o + SHIFT < n)
    b_x = tl.load(x + o + SHIFT, mask=m, other=0.) if MASK_LOAD else tl.load(x + o + SHIFT)
    if MASK_STORE:
        tl.store(y + o - SHIFT, b_x + 1, mask=(o - SHIFT >= 0) & (o - SHIFT < n))
    else:
        tl.store(y + o - SHIFT, b_x + 1)


def _copy(x: torch.Tensor, y: torch.Tensor, shift: int, mask_load: bool, mask_store: bool) -> None:
    _shifted_copy[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16, SHIFT=shift, MASK_LOAD=mask_load,
                                                 MASK_STORE=mask_store)


def test_masked_lanes_are_not_accesses() -> None:
    x, y = torch.arange(30, dtype=torch.float32), torch.zeros(30)
    with checked_bounds() as stats:
        _copy(x, y, 3, True, True)
    assert stats.accesses == 4 and stats.unattributed == 0
    assert torch.equal(y[:-6], x[6:] + 1)


@triton.jit
def _rows_of_head(x, y, T, H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Rows of one head of a [T, H, D] tensor, BD ≥ D lanes per row; programs past the heads load nothing. The mask
    combines a 2-D tile mask with a scalar condition, which the interpreter hands the builder as int32 0/1."""
    i_p = tl.program_id(0)
    o_t = tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    m = ((o_t < T)[:, None] & (o_d < D)[None, :]) & (i_p < H)
    o = (o_t[:, None] * H + i_p) * D + o_d[None, :]
    tl.store(y + o, tl.load(x + o, mask=m, other=0.) + 1, mask=m)


def test_a_mask_with_a_scalar_condition() -> None:
    """Masked lanes of a mask combined with a scalar are not accesses (read as indices, the int32 mask once put lanes
    past each row's D in), and an unmasked overrun through it is still caught."""
    x, y = torch.arange(2 * 2 * 6, dtype=torch.float32), torch.zeros(2 * 2 * 6)
    with checked_bounds() as stats:
        _rows_of_head[(3,)](x, y, 2, H=2, D=6, BT=2, BD=8)
    assert stats.accesses == 6 and torch.equal(y, x + 1)
    # a third row that x does not have: head 0's reaches elements 24-29 of 24
    with pytest.raises(Exception, match=r"_rows_of_head program \(0, 0, 0\): load through x reaches 24 B past"):
        with checked_bounds():
            _rows_of_head[(3,)](x, y, 3, H=2, D=6, BT=4, BD=8)


def test_a_load_past_the_end_is_caught() -> None:
    x, y = torch.arange(30, dtype=torch.float32), torch.zeros(30)
    with pytest.raises(Exception, match=r"_shifted_copy program \(1, 0, 0\): load through x reaches 8 B past its last"):
        with checked_bounds():
            _copy(x, y, 0, False, True)  # 32 lanes over 30 elements


def test_a_store_before_the_start_is_caught() -> None:
    x, y = torch.arange(32, dtype=torch.float32), torch.zeros(32)
    with pytest.raises(Exception, match=r"program \(0, 0, 0\): store through y reaches 8 B before its first"):
        with checked_bounds():
            _copy(x, y, 2, True, False)


def test_a_load_into_the_next_argument_is_caught() -> None:
    """The memory past x is y's, so the address is valid; the pointer came from x, so the access is still wrong."""
    pool = torch.zeros(64)
    x, y = pool[:32], pool[32:]
    with pytest.raises(Exception, match="load through x reaches 8 B past"):
        with checked_bounds():
            _copy(x, y, 2, False, True)


@pytest.mark.parametrize("name", CHUNK)
def test_every_kernel_stays_in_bounds(name: str) -> None:
    """Forward (training path) and backward, T = 130 (a partial last chunk), dk = 48, dv = 40 (masked key and value
    blocks), two value heads per key head."""
    stats = run_spec(str(SPEC_DIR / f"{name}.dgps"), T=130, H=2, HV=4, dk=48, dv=40)
    assert stats.accesses > 0 and stats.unattributed == 0


@pytest.mark.parametrize("name", ["pgdn", "kda", "ccq_gla", "rwkv7_dplr"])
def test_ragged_packed_sequences_stay_in_bounds(name: str) -> None:
    """cu_seqlens with a one-token sequence between two that end mid-chunk."""
    stats = run_spec(str(SPEC_DIR / f"{name}.dgps"), lens=(70, 1, 130), H=2, HV=2, dk=32, dv=24)
    assert stats.accesses > 0 and stats.unattributed == 0


@pytest.mark.parametrize("name", ["ccq_gdn", "ccq_gla"])
def test_curvature_passes_in_column_blocks_stay_in_bounds(name: str) -> None:
    """The curvature passes at BV 32 < dk (two column blocks of C): the setting that faulted on sm_90 under Triton 3.6
    (codegen/launch.py). Its addresses are in bounds here, so that fault is not an access of ours past a buffer."""
    launch = ";".join(f"{s}=32,32,4,1" for s in ("curvature_query", "bwd_curvature_query", "bwd_curvature_key"))
    stats = run_spec(str(SPEC_DIR / f"{name}.dgps"), T=130, H=2, HV=2, dk=64, dv=32, launch=launch)
    assert stats.accesses > 0 and stats.unattributed == 0
