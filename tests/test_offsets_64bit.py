"""Token offsets in 64 bits in every generated chunk kernel: tokens × heads × dk passes 2³¹ at about a million tokens
of 16 heads × 128 channels (B 16, T 65536), and an int32 product of a program id there wraps to a negative address.
The kernels take each tile's token base as a 64-bit scalar (`bos` loaded from cu_seqlens `.to(tl.int64)`, or a
program id `.to(tl.int64)`) and keep the tile's own offsets in 32 bits. The l2norm kernel formed its rows from an
int32 program id until the twenty-ninth session; a source check, since a call that large does not fit the
interpreter's memory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GENERATED = sorted((Path(__file__).resolve().parents[1] / "generated").glob("*/chunk.py"))


def _kernels(src: str) -> dict[str, str]:
    parts = re.split(r"^@triton\.jit\ndef (\w+)\(", src, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n# ----")[0] for i in range(1, len(parts), 2)}


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: p.parent.name)
def test_token_bases_are_64_bit(path: Path) -> None:
    for name, body in _kernels(path.read_text()).items():
        # a token row formed by multiplying a 32-bit program id by the chunk size
        assert not re.search(r"=\s*i_\w+ \* BT\b", body.split("t0 = ")[0] if "t0 = " in body else body), name
        if "rows = t0" in body or "t0 * (" in body:
            t0 = re.search(r"t0 = ([^\n]+)", body)
            assert t0 and ("bos" in t0.group(1) or "to(tl.int64)" in t0.group(1)), (name, t0 and t0.group(0))


def test_the_l2norm_kernel() -> None:
    src = (Path(__file__).resolve().parents[1] / "generated" / "gdn" / "chunk.py").read_text()
    body = _kernels(src)["chunk_l2norm_kernel"]
    assert "t0 = i_t.to(tl.int64) * BT" in body and "p_q + t0 * (H * DK) + " in body
