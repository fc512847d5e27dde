"""Element offsets of token tiles in the [T, heads, dim] buffers the chunk kernels read and write.

A tile's rows are given as Triton source: either a variable of absolute token indices (`rows`), or the
split form `"t0 + o_t"`: a scalar first token (int64) plus int32 offsets within the chunk. The split form
puts the 64-bit part in one scalar and leaves the per-element arithmetic 32-bit and loop-invariant, which
Triton hoists out of a loop over chunks (the state passes: half as many integer instructions per chunk).
"""

from __future__ import annotations

import re

ROWS = "t0 + o_t"  # the chunk kernels' rows: first token of the chunk + offsets 0..BT-1
_SPLIT = re.compile(r"^(?P<base>[A-Za-z_]\w*) \+ (?P<local>.+)$")


def row_offset(rows: str, heads: str, head: str, dim: str | None = None, cols: str | None = None,
               transposed: bool = False) -> str:
    """Offset of rows × (one head) [× cols] in a [T, heads(, dim)] buffer; [R] when `dim` is None, else [R, C]
    ([C, R] when `transposed`: the tile's transpose, loaded as such).

    Written so that `ptr + row_offset(...)` adds the scalar part to the pointer first.
    """
    m = _SPLIT.match(rows)
    if dim is None:
        if m:
            return f"{m['base']} * {heads} + (({m['local']}) * {heads} + {head})"
        return f"{rows} * {heads} + {head}"
    r, c = ("[None, :]", "[:, None]") if transposed else ("[:, None]", "[None, :]")
    if m:
        return (f"{m['base']} * ({heads} * {dim}) + ((({m['local']}){r} * {heads} + {head}) * {dim} "
                f"+ {cols}{c})")
    return f"({rows}{r} * {heads} + {head}) * {dim} + {cols}{c}"


def partial_row(head: str, block: str, count: str) -> str:
    """Where one block of key channels leaves its partial sums of a per-token adjoint (the sum over the key channels
    that a stage holds in `count` blocks: bwd_grads' dβ and db, NKG; bwd_curvature_query's dλ, NKC; bwd_precond_diag's
    per-token shares, NKP): a [heads, count, T] buffer, each block's tokens one contiguous run. This is the scalar
    part (the head's and block's row in int32 — the host refuses heads × count × T ≥ 2³¹ — plus the chunk's or step's
    first token t0, int64); the writer adds o_t, its tokens' offsets, and stores one contiguous run; the reader adds
    the block's runs in a fixed order (no atomics). (The row's product in int64 cost clvr_kda's bwd_grads the last
    registers: 255 + 8 B spill against 254, none.)
    (Token-major partials, [T, heads, count], gave the reader contiguous rows but spread each writer's stores 1 KB
    apart: pgdn's bwd_precond_diag 0.397 → 0.503 ms, H100 run 97; this layout 0.378, run 98.)"""
    return f"(({head} * {count} + {block}) * TT + t0)"
