"""The 16-bit operand pair (CCQ's q̂ = hi + lo, codegen/templates/chunk_module.jinja: _cast_for, _remainder_for).

The matmul consumers of q̂ read hi alone and the others the sum hi + lo, so hi + lo must round back to hi exactly:
then every operand a kernel rounds to 16 bits from the pair is the one the fp32 value gave. With a remainder rounded
to nearest it does not (a remainder at half an ulp of hi makes hi + lo a tie); the check below shows that too.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dgps.generated.ccq_gdn.chunk import _cast_for, _remainder_for  # noqa: E402

_DT_ID = {torch.bfloat16: 3, torch.float16: 4}  # the interpreter's ids: 16-bit operands emulated in fp32


@triton.jit
def _pair_kernel(x_ptr, hi_ptr, lo_ptr, n, DT_ID: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(x_ptr + o, mask=m, other=0.)
    hi = _cast_for(x, hi_ptr, DT_ID)
    tl.store(hi_ptr + o, hi, mask=m)
    tl.store(lo_ptr + o, _remainder_for(x, hi, lo_ptr, DT_ID), mask=m)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_pair_rounds_back_to_its_high_part(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 16, generator=gen) * 0.3
    hi, lo = torch.empty(x.numel(), dtype=dtype), torch.empty(x.numel(), dtype=dtype)
    _pair_kernel[(triton.cdiv(x.numel(), 1024),)](x, hi, lo, x.numel(), DT_ID=_DT_ID[dtype], BLOCK=1024)
    assert torch.equal(hi, x.to(dtype))  # the high part is x rounded to nearest
    assert torch.equal((hi.float() + lo.float()).to(dtype), hi)  # and the pair rounds back to it, for every element
    # ~twice the 16-bit mantissa; fp16's remainder of a small x is subnormal, its step 2^-24 the floor
    err = (hi.float() + lo.float() - x).abs()
    if dtype == torch.bfloat16:
        assert (err <= 2.0 ** -15 * x.abs()).all()
    else:
        assert (err <= torch.maximum(2.0 ** -21 * x.abs(), torch.full_like(x, 2.0 ** -24))).all()
    # the remainder rounded to nearest instead: ties make some pairs round away from the high part
    lo_nearest = (x - hi.float()).to(dtype)
    assert not torch.equal((hi.float() + lo_nearest.float()).to(dtype), hi)
