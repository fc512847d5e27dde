"""The launch table: per chunk stage, the tile sizes and launch settings (BK, BV, num_warps, num_stages).

Generated chunk modules read it at launch time (`launch_config` there applies DGPS_LAUNCH overrides first), and
`dgps show --stage plan` prints it for a head size. The settings were tuned on an H200 for the scalar-decay
stages with benchmarks/tune.py; each comment says what was measured, and which faster settings are not used
because Triton 3.6 built them wrong for sm_90. No autotuning at run time unless asked for: a first call only
compiles. `dgps tune` (runtime/autotune.py) sweeps `tuning_candidates` on the machine's own GPU and records the
fastest checked settings, which generated modules then prefer to this table (DGPS_AUTOTUNE=1: at a first call).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

# stages whose programs hold whole value rows (one program per chunk and head): BV must cover dv
WHOLE_VALUE_ROWS = ("bwd_inputs",)
# stages whose programs hold whole key rows, in two tiles of BK, next to a block of BV key channels (the curvature
# sums): two BK must cover dk
WHOLE_KEY_ROWS = ("curvature_query", "bwd_curvature_query", "bwd_curvature_key")


# Whether the wy stage runs one program per block of columns (of W's key columns or Ũ's value columns) of a chunk and
# head, rather than one per chunk and head walking them all: the grid kind chunk_columns, the template's
# split_columns hook (codegen/chunk.py WY_SPLIT_RULES). A program's work is a chain of dependent steps (load T and a
# tile, one product, one store), and one per chunk and head chained three or four of them (gdn at dk = dv = 128:
# 0.113 ms for ~75 MB, a fifth of HBM's rate, H100 run 130). Off until timed: the thirtieth session got no device
# time (run 132, `bash benchmarks/runs/2026-12-06_run132.sh wy`, is ready; benchmarks/NOTES.md).
WY_COLUMN_PROGRAMS = False


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


# The per-channel interaction's chunk form (one reference for the whole chunk, where the gates bound it: compiler/plan.py
# VECTOR_DIAG_FORM) forms its two [BT, BT] products over key blocks of its own width BKF; the levels form next to it in
# the same kernel keeps the table's BK = 16 (its batched per-level tiles spill wider). H100 (run 146,
# benchmarks/chunk_form_block.py, bench_fla's inputs, forward ms at BKF 16 / 32 / 64): kda 1.004 / 0.927 / 0.903, gla
# 0.616 / 0.557 / 0.555, gdn2 1.042 / 0.955 / 0.968, precond_kda 1.315 / 1.227 / 1.266 (training steps alike). 32 for
# every spec: no spill at 32 in any of them (compile report, sm_90, dk = 128, once the solve's block indices were
# formed where they are stored rather than kept live across the forms), while 64 spills in each (kda 24 B, pkda
# 8-16, gdn2 40-56, gla 72) and was faster for kda alone (by 0.024 ms of 0.93).
CHUNK_FORM_KEY_BLOCK: int | None = None  # a fixed BKF for sweeps (benchmarks/chunk_form_block.py); None: 32


def chunk_form_key_block(DK: int) -> int:
    """BKF: the key block of the per-channel interaction's chunk form at key width DK (and of W's columns in the wy
    stage where it runs at the interaction's end: compiler/plan.py _wy_in_interaction)."""
    width = CHUNK_FORM_KEY_BLOCK or 32
    return min(width, max(16, _next_pow2(DK)))


# a sequential state pass's programs (sequences × heads × value blocks) from which the wider value block pays: fewer
# leave SMs of the H200's 132 idle while each program walks its sequence chunk by chunk
STATE_WAVE = 96


def few_state_programs(n_state: int | None, DV: int, BV: int = 32) -> bool:
    """Whether a call's sequences × value heads (`n_state`; None: not known, taken as enough) give the sequential state
    passes fewer than STATE_WAVE programs at value blocks of BV (B = 1, H = 16 at BV 32: 64): at BV 32, narrower value
    blocks then, and the output in a launch of its own rather than inside the state pass (the generated host's
    _fuse_output)."""
    return n_state is not None and n_state * -(-DV // BV) < STATE_WAVE


def table_launch(name: str, DK: int, DV: int, decay: str, family: str, route: str,
                 n_state: int | None = None, precond: str = "none") -> tuple[int, int, int, int]:
    """(BK, BV, num_warps, num_stages) of one stage at head sizes DK, DV, for a decay kind, a family (additive,
    tied, untied: compiler/plan.py) and a route (none, residual), which pick the stage's template and its tiles.
    n_state: the sequences × value heads of the call (the state passes' programs per value block), None where the
    call is not known (the printed table): taken as enough to fill the GPU. precond: the preconditioner's kind
    (none, diag, exact: a diagonal one's k̃ is an fp32 write-key stream of the state passes).

    Stages that loop over the key channels in blocks (l2norm excepted, every forward stage but the
    state pass) take BK = 64; the others hold whole key rows (BK = the padded key width). Fixed
    settings, no autotuning: a first call compiles each kernel once.
    """
    BK = max(16, _next_pow2(DK))
    bk_block = min(64, BK)
    few_states = few_state_programs(n_state, DV)
    wide_v = not few_state_programs(n_state, DV, 64)  # programs enough for the state passes at BV 64
    bv_full = max(16, min(64, _next_pow2(DV)))
    wide = BK >= 128
    if name == "l2norm":
        return BK, bv_full, 4, 1
    if name == "interaction":
        if family == "untied":
            # chunk_interaction_dplr.jinja (four decayed matrices, the solve on one): H200, RWKV-7 (dplr) 1.70 ms at
            # BK 32 / 2 warps (run 32), 2.27 at the tied form's BK 16 / 4 warps (run 71; compile report 255 registers
            # + 144 B spill at dk = 128)
            return min(32, BK), bv_full, 2, 1
        if decay == "vector":
            # one batched product per level of hierarchical references (chunk_interaction_vector.jinja). Compile report
            # (kda, dk = 128, sm_90): BK 16 / 4 warps 202 registers, no spill (2 programs per SM), 47.4 K warp
            # instructions per program; BK 32 / 4 warps 255 + 40 B spill (46.7 K); 8 warps put every warp on the
            # batched products' batch dimension (255 registers, 79 K: replicated products); 2 warps spill 144-816 B.
            # The row-block form before it: BK 32 / 2 warps, 255 + 64 B spill, 55.8 K; H200, kda 0.665 ms (run 32).
            # H200 (run 50, profiler): kda 0.678 ms (row blocks 0.671), gla 0.308 (0.345), gdn2 0.662 (0.686), pkda
            # 0.725 (0.704): occupancy unchanged, the per-element work of each level now what costs. Run 53
            # (benchmarks/kernel_sections.py, kda 0.695 ms whole): BK 32 +0.11, BK 64 +0.17, 8 warps +0.61, maxnreg 168
            # −0.06 (88 B spill), 128 +0.09; the ≤ 16 levels cost 0.31, level 64 0.15, the solve 0.17. With the
            # gates-bounded forms (compiler/plan.py VECTOR_DIAG_FORM; run 57): kda 0.461 ms on the chunk form
            return min(16, BK), bv_full, 4, 1
        # H200 (benchmarks/tune.py, gdn, run 25): 1 warp 0.094 ms, 2 warps 0.185, BK 32 / 2 warps 0.229, 4 warps
        # ~0.39: the 16×16 blocks and the forward substitution's row extractions need no cross-warp exchange at 1 warp
        # (compile report: 255 registers + 40 B spill, against 252 and none at 2 warps, and still twice as fast)
        # Without a decay the block merges are tf32x3 products (codegen/templates/chunk_interaction.jinja; tf32 ones
        # raised delta_rule's o above FLA's): as IEEE fp32 dots they spilled 856 B at 1 warp and ran at 2 (run 17:
        # 0.195 ms for delta_rule); as tf32x3 the compile report has deltanet at 255 registers / no spill at 1 warp, 240
        # at 2. Not yet timed on the H200 (run 87 sweeps 1, 2 and 4 warps)
        if precond == "diag" and BK <= 128:
            # the diagonal preconditioner's fp32 k̃ as the write key: BK 64 / 1 warp spills 192 B (255 registers), BK 32
            # / 1 warp holds 223, none (compile report, pgdn, dk = 128). H100 (tune.py, run 106): pgdn 0.152 ms against
            # 0.161 at BK 64, 0.269 at BK 32 / 2 warps; gdn stays fastest at BK 64 (0.0985 against 0.113 at BK 32)
            return min(32, BK), bv_full, 1, 1
        return bk_block, bv_full, 1, 1
    if name == "decay_keys":
        return bk_block, bv_full, 4, 1
    if name == "wy":
        if WY_COLUMN_PROGRAMS:  # one block of W's key columns or Ũ's value columns per program
            return bk_block, bv_full, 4, 1
        return BK, bv_full, 4, 1
    if name == "output":
        if precond == "diag" and decay != "vector":
            # the fp32 k̃ tile (scalar or no decay: the output forms its scores from the keys): at 3 stages 131 KB of
            # shared memory, one program per SM; at 2 stages 90 KB, two (compile report, pgdn, dk = dv = 128: 255
            # registers, no spill at either). H100 (`dgps tune pgdn`, run 111): 0.207 → 0.179 ms. The same shared
            # memory per SM on the H200, not timed there
            return bk_block, max(16, min(128, _next_pow2(DV))), 4, 2
        return bk_block, max(16, min(128, _next_pow2(DV))), 4, 3
    if name == "state_pass":
        # The state's key rows as 64-row tiles (two; BK = dk / 2 past dk = 128), as FLA's blockdim64 kernels
        # hold them. Compile report (gdn, dk = dv = 128, sm_90, BV 64): 234 registers, no spill. H200 (run 11):
        # 0.374 ms for two calls, no faster than the full-width [128, 32] tiles (0.367, run 9) and pgdn's bf16
        # gradients correct; the full-width tiles at BV 64 had faulted at 3 stages under Triton 3.6 and given NaN
        # in pgdn's bf16 backward at 2 (benchmarks/NOTES.md, runs 3-5).
        # BV 32 (run 25, tune.py): gdn 0.297 ms against BV 64's 0.321 (twice the programs: 256 at B = 4, H = 16),
        # kda 0.345 against 0.360; 8 warps or 3 stages slower.
        # BV 64 with a deeper pipeline (run 75, tune.py; FLA's own autotune records for its blockdim64 kernel on the
        # H200 pointed there): gdn 0.110 ms at BV 64 / 4 warps / 4 stages, 0.114 at 3, against BV 32 / 2 stages' 0.145
        # and BV 64 / 2 stages' 0.154; kda (two calls) 0.302 against 0.336. Compile report (gdn, dk = 128): 234
        # registers, no spill, 181 KB of shared memory (one program per SM; 128 programs at B = 4, H = 16: one wave).
        # The additive and tied families without a route only: their per-step tiles are W, U, the key (or
        # A ⊙ e^{b_c − B}) and the gates; the untied stream and the residual route add tiles, not measured
        # And only where BV 64 still leaves programs for most SMs (B = 1, H = 16, the 32k shape: 32 against 64)
        if BK <= 128 and family == "additive" and route == "none":
            # split over key-row blocks (one [64, BV] tile per program: compiler/plan.py, split_reverse_pass). H200,
            # simple_gla (tune.py, run 82; two calls): reference shape BV 64 / 3 stages 0.094 ms, 4 stages 0.104, BV 32
            # / 2 stages 0.117; B = 1, T = 32768, H = 16: BV 32 / 3 stages 0.673, BV 64 / 3 stages 0.878, BV 16 1.073
            return max(bk_block, BK // 2), min(64 if wide_v else 32, bv_full), 4, 3
        if BK <= 128 and family == "tied" and route == "residual" and wide_v:
            # the residual route's state pass. H200 (tune.py; two calls), when the route was formed from E, L and Z
            # tiles besides W, U, K: cler_h_gdn (run 83) BV 64 / 4 stages 0.221 ms, 3 stages 0.227, BV 32 / 2 stages
            # 0.292; cler_h_kda (run 85) 0.300, 0.318, 0.336. Its solve form (R = Ũ − W H_n, a store; fifteenth session)
            # holds fewer tiles: not re-swept
            return max(bk_block, BK // 2), min(64, bv_full), 4, 4
        if BK <= 128 and family in ("additive", "tied") and route == "none" and wide_v:
            return max(bk_block, BK // 2), min(64, bv_full), 4, 4
        if BK <= 128 and family in ("additive", "tied") and route == "none" and few_states:
            # few programs (gdn at B = 1, T = 32768, H = 16; tune.py, run 79): BV 32 / 3 stages 0.655 ms against 2
            # stages' 0.834, BV 16 0.798, BV 64 / 4 stages 0.843
            return max(bk_block, BK // 2), min(32, bv_full), 4, 3
        return max(bk_block, BK // 2), min(32, bv_full), 4, 2
    if name in ("state_output", "state_output_wy"):
        # state_output_wy: an inference call's fused kernel with the wy stage formed inside it too (one more c×c
        # product per chunk, W and Ũ not loaded; compiler/plan.py: wy_in_inference_state_pass); the same setting
        # (H100, gdn, run 115: 0.265 ms at it inside the training forward)
        # the state pass with the output fused in (scalar or no decay; codegen/templates/chunk_state_output.jinja), on
        # the state pass's 64-row key tiles. Compile report (sm_90, gdn): dk = dv = 128, BV 32 / 4 warps / 2 stages 238
        # registers, no spill, 107 KB shared (two programs per SM: 256 at B = 4, H = 16 on 132 SMs); 8 warps 205;
        # BV 64 / 4 warps 255 + 48 B spill, BV 64 / 8 warps 255, none. dk = dv = 64: 207, none. dk = 256: BV 32 / 4
        # warps spills 64 B, 8 warps none (210 KB shared). H200, gdn (tune.py, run 40): BV 32 / 4 warps / 2 stages
        # 0.226 ms, 8 warps 0.505; 1 stage faulted (illegal memory access) under Triton 3.6.
        # The additive family (simple_gla, no write-key stream; tune.py, run 74): 3 stages 0.196 ms against 2 stages'
        # 0.204 (112 KB of shared memory: two programs per SM still fit); BK 128 0.211, BV 64 / 8 warps 0.259
        # Few programs (gdn at B = 1, T = 32768, H = 16: 64 at BV 32; tune.py, run 79): BV 16 1.380 ms against BV 32's
        # 1.462 (3 stages 1.441), BV 64 2.205. The real cost there is the fusion itself (the output's c×c work walks
        # the chunks in sequence): on a GPU such calls take the unfused pair (the output stage's unfused_when,
        # compiler/plan.py); this setting serves the interpreter and DGPS_FUSE_OUTPUT=1
        if few_states and BK <= 128:
            return max(bk_block, BK // 2), min(16, bv_full), 4, 2
        stages = 3 if family == "additive" and BK <= 128 else 2
        if family == "tied" and BK <= 128:
            # the state's key rows as one tile: the tied family's fused kernel (a training forward's stores the scores)
            # spills less (compile report, dk = dv = 128: gdn 72 → 16 B, cler_h_gdn / clvr_gdn 120 → 16, deltanet 0
            # either way). H100 (run 126, benchmarks/kernel_sections.py, one process, 5 rounds): gdn 0.252 → 0.236 ms,
            # cler_h_gdn 0.349 → 0.303, deltanet 0.201 → 0.195; BK 128 at 3 stages +0.10 / +0.17 / +0.02
            return BK, min(32, bv_full), 4, stages
        return max(bk_block, BK // 2), min(32, bv_full), (8 if BK > 128 else 4), stages
    if name == "bwd_local_values":
        # whole value rows per program (up to 128): the c×c scores are formed once per chunk and head, not per
        # dv block (run 9: two 64-wide programs 0.127 ms); 109 registers, no spill at dk = dv = 128. The residual
        # route (when it added − L'ᵀ dR here; tune.py, cler_h_gdn, run 83): 3 stages 0.139 ms against 2 stages' 0.151;
        # its solve form has no route term here: not re-swept
        return bk_block, max(16, min(128, _next_pow2(DV))), 4, (3 if route == "residual" else 2)
    if name == "bwd_state":
        if decay == "vector" and (family == "untied" or route == "residual"):
            # a third per-step [BT, BK] key tile pair (the untied write stream's W ⊙ e^{b_c − B}; the residual route's
            # E ⊙ e^B before its solve form): 147-152 KB of shared memory at BV 32 / 2 stages, one program per SM, so
            # 256 programs ran in two waves. BV 64 (128 programs, one wave; compile report: cler_h_kda 255 registers +
            # 80 B spill, 176 KB).
            # H200 (tune.py, run 72): rwkv7_dplr 0.329 ms against 0.467, cler_h_kda 0.323 against 0.482; 8 warps
            # 0.378 / 0.326, 1 stage 0.549 / 0.525. cler_h_kda's solve form reads no E ⊙ e^B any more, and dR through
            # W instead: compile report 255 registers + 16 B spill at 4 warps, 198 / 0 at 8, which run 72 timed within
            # 1 % of 4 for the route's earlier form: 8 warps for the route, no spill (issue 9); not re-swept
            return max(bk_block, BK // 2), min(64, bv_full), (8 if route == "residual" else 4), 2
        if family == "additive" and route == "none" and BK <= 128:
            # split over key-row blocks, dH alone (compiler/plan.py: split_reverse_pass). H200, simple_gla (tune.py, run
            # 82): reference shape BV 64 / 3 stages 0.099 ms, 4 stages 0.101, BV 32 / 2 stages 0.109; B = 1,
            # T = 32768, H = 16: BV 32 / 3 stages 0.355, BV 64 / 3 stages 0.413, BV 16 / 2 stages 0.554
            return max(bk_block, BK // 2), min(64 if wide_v else 32, bv_full), 4, 3
        if few_states and decay != "vector" and family in ("additive", "tied") and route == "none" and BK <= 128:
            # few programs (gdn at B = 1, T = 32768, H = 16; tune.py, run 79): BV 16 1.513 ms against BV 32's 1.672
            # (3 stages 1.757), BV 64 / 4 stages 4.474. BV 16 had faulted in run 2 (an older kernel); GPU checks at
            # B = 2 (these settings) right in run 80: gdn, simple_gla, deltanet, pgdn, ccq_gdn, ccq_gla
            return max(bk_block, BK // 2), min(16, bv_full), 4, 2
        if precond == "diag" and decay != "vector" and BK <= 128 and not few_states:
            # the diagonal preconditioner's fp32 k̃ as the write key (tune.py, pgdn, run 83): BV 64 / 3 stages 0.287 ms,
            # BV 32 / 2 stages 0.349; gdn (same run) stays fastest at BV 32 / 2 stages (0.279; BV 64 / 3 stages 0.372),
            # deltanet too (0.244 against 0.633)
            return max(bk_block, BK // 2), min(64, bv_full), 4, 3
        # dH as 64-row key tiles (run 9, full-width [128, 32] tiles: 0.29 ms). Compile report at dk = dv = 128: BV 32 /
        # 4 warps 146 registers, no spill; BV 64 / 4 warps 255 + 16 B spill. 4 warps: at 8 warps Triton 3.6 emitted a
        # bf16 kernel that faults on sm_90 (grouped heads, dk = 128)
        return max(bk_block, BK // 2), min(32, bv_full), 4, 2
    if name == "bwd_scores":
        # one program per chunk and head holds the [BT, BT] score gradients and Ai (per-channel decay only). The residual
        # route's solve form adds the route's adjoint and R to every value block: compile report (cler_h_kda, dk = dv =
        # 128, sm_90) BV 64 / 4 warps 255 registers + 64 B spill, BV 32 / 4 warps 206 / 0 (not yet timed)
        return bk_block, (min(32, bv_full) if route == "residual" else bv_full), 4, 1
    if name == "bwd_intra":
        # one program per 16-token row block and 64 key channels. H200, kda (benchmarks/tune.py, run 22): BK 32 / 2 warps
        # 1.50 ms, BK 64 / 4 warps / 2 stages 1.49, BK 32 / 4 warps 1.67 (stages change nothing); 152 registers, no
        # spill. H100 (run 99, since the diagonal blocks' products and pkda's late erase key): kda BK 64 / 2 warps
        # 0.912 ms, BK 64 / 4 warps 1.047, BK 32 / 2 warps 1.107; pkda 1.083 / 1.130 / 1.216 (BK 16 / 2 warps 2.169).
        # Compile report at BK 64 / 2 warps (sm_90, dk = 128): kda, pkda, cler_h_kda, clvr_kda 255 registers, gla and
        # ccq_gla 254, no spill; gdn2 (erase key b ⊙ k) 255 + 16 B spill, at BK 64 / 4 warps 215, none (its erase
        # key loaded where it is read). H100, gdn2: BK 64 / 2 warps (the 16 B spill) 1.041 ms (run 99), BK 32 / 2
        # warps 1.556 (run 100), BK 64 / 4 warps without spill 1.206 (run 101, after the grid order, which took kda's
        # 0.907 -> 0.740). Since gdn2's row tiles are read again after the loop over blocks (reload_row_tiles,
        # codegen/chunk.py) it fits BK 64 / 2 warps without spill too (255 registers), untimed: ~1.05 ms expected
        return min(64, BK), bv_full, 2, 1
    if name == "bwd_inputs":
        return BK, max(16, _next_pow2(DV)), (8 if wide else 4), 1
    if name == "bwd_solve":
        # the delta family's c×c adjoints, one program per chunk and head (scalar or no decay; chunk_bwd_solve.jinja):
        # [BT, BT] accumulators over BV value channels, then L' and Q̂ ⋆ A over BK key channels. Compile report (sm_90,
        # dk = dv = 128), registers / spill / shared: gdn 249 / 0 / 32 KB (two programs per SM), pgdn 255 / 8 B,
        # cler_h_gdn 244 / 0, ccq_gdn 245 / 0, deltanet 186 / 0; gdn BV 128 255 / 0 / 56 KB, 8 warps 176 / 0, 2 stages
        # 236 / 0 / 64 KB. Not yet timed on the H200
        return bk_block, bv_full, 4, 1
    if name == "bwd_key_grads":
        # bwd_grads after bwd_solve: one program per chunk, head and 64 key channels, three [BT, BK] accumulators over the
        # dv blocks (dO Hᵀ, U dHᵀ, dY Hᵀ) and four products with the c×c adjoints after them (10 64³ products, against the
        # fused kernel's 18). Compile report (sm_90, dk = dv = 128), 4 warps: gdn 255 registers / 48 B spill / 40 KB
        # shared (two programs per SM, the fused kernel's 8 warps at 255 held one), gdn_fused_gate 255 / 56 B, clvr_gdn
        # 255 / 48 B, cler_h_gdn and ccq_gdn 255 / 104 B, pgdn 255 / 112 B, deltanet 235 / 0, pdn 254 / 0, exact_atk
        # 232 / 0 (adding bwd_solve's two db shares in the fused kernel's order, for its exact fp32 sums, cost gdn 24 B of
        # spill); at 8 warps none spills (gdn 197, gdn_fused_gate 192, pgdn 194, ccq_gdn 193, cler_h_gdn 201: one program
        # per SM; deltanet 127, two); BK 32 / 4 warps: gdn 178 / 0 (two programs per SM, at twice the value-side and c×c
        # loads). dk = dv = 64: gdn 4 warps 72 B spill, 8 warps 254 / 0; dk = dv = 256: gdn 255 / 64 B. Not yet timed on
        # the H200 (the fused kernel's BK 32 / BV 64 / 4 warps faulted under Triton 3.6). Since the partial sums' rows
        # (codegen/address.py: partial_row) gdn's spill is 32 B. H100 (run 97, pgdn): 4 warps 0.799 ms, 8 warps 0.928
        return bk_block, bv_full, 4, 1
    if name == "bwd_grads":
        # (the additive family's and per-channel decay's: the delta family with a scalar or no decay runs bwd_solve and
        # bwd_key_grads)
        # one program per chunk, head and 64 key channels. H200, gdn dk = dv = 128 (benchmarks/tune.py, run 9):
        # BK 64 / BV 64 / 8 warps 1.10 ms, BK 128 (full width) / BV 64 1.20, BK 64 / BV 32 1.28 (run 6's full
        # width, before the epilogue stored each adjoint as soon as it was final: 1.61)
        if decay == "vector":
            # per-channel decay holds more [BT, BK] tiles (the gates, their factors, the per-channel db): 32 key
            # channels per program; the score pairs come from bwd_intra. Compile report, kda dk = 128: 146 registers
            # at 8 warps, 250 at 4, no spill. H200 (tune.py, run 20): BK 32 / 4 warps 0.974 ms, BK 64 / 8 warps
            # 0.986, BK 64 / 4 warps 1.054, BK 32 / 8 warps ~1.6. With the PDN statistic's fp32 k̃ write key (pkda):
            # 255 registers + 8 B spill at BK 32 / 4 warps, 255 / 0 at BK 64 / 8 warps (146 / 0 at BK 16 / 4): the
            # latter, within 1.3 % of the former for kda; not yet timed for pkda (run 87's vector part sweeps it)
            if precond == "diag" and BK >= 64:
                return 64, bv_full, 8, 1
            return min(32, BK), bv_full, 4, 1
        # the additive family with a scalar, constant or no decay: whole key rows up to 128. H200, simple_gla dk = dv =
        # 128 (tune.py, run 62): BK 128 / BV 64 / 8 warps 0.397 ms (4 warps 0.397, with 368 B spill), BK 64 / BV 64 / 4
        # warps 0.413, the former BK 64 / BV 64 / 8 warps 0.614; BK 32 / BV 64 / 4 warps faulted under Triton 3.6.
        # Compile report at BK 128 / 8 warps (sm_90, dk = 128): simple_gla and retnet 214 registers, mamba2 218, la 170,
        # exact_atq 208, no spill
        return min(128, BK), bv_full, 8 if BK >= 64 else 4, 1
    if name in ("precond_diag", "bwd_precond_diag"):
        # the PDN statistic splits over key-channel blocks; within a chunk it is a decayed scan. H200, pgdn
        # dk = dv = 128 (benchmarks/tune.py, run 37): forward BK 16 / 4 warps 0.218 ms (BK 32 / 8 warps 0.255, BK 32 /
        # 4 0.318), backward 0.300 (0.305, 0.376). Sequential over chunks: more, smaller programs hide more latency.
        # The for loop's 2 stages (the next chunk's loads during this one's scan) changed nothing (run 39: 0.215 /
        # 0.313 ms, 1 stage 0.216 / 0.319): the loads were not what each chunk waits on.
        # The backward after it began re-forming the statistic per chunk (two scans per chunk; 147 registers at BK 16 /
        # 4 warps: 3 programs per SM, so its 512 programs ran as 1.3 waves, ncu run 45): BK 8 / 1 warp, 149 registers,
        # 1024 programs in one wave, each scan within a warp: 0.703 → 0.439 ms (run 46, tune.py; GPU gradients
        # unchanged). The forward stays at BK 16 / 4 warps (BK 8 / 1 warp 0.281 against 0.208).
        # Steps of several chunks (compiler/plan.py PDN_SCAN_ROWS, 128 rows) hold taller tiles: at 256 rows the backward
        # at BK 8 / 1 warp spilled 1016 B (4 warps: 167 registers). At 128 rows (compile report, pgdn, dk = 128, sm_90)
        # forward 96 registers, backward 93, no spill. H200 at 256 rows (run 59): forward 4 warps 0.263 ms, 8 warps
        # 0.236, 2 warps 0.195; backward 4 warps 0.446, 8 warps 0.466, 2 warps 0.482.
        if name == "bwd_precond_diag":
            return min(8, BK), bv_full, 4, 2
        return min(16, BK), bv_full, 4, 2
    if name in ("precond_exact", "bwd_precond_exact", "bwd_precond_gram"):
        # the exact preconditioner's per-chunk dk × dk tiles (compile report, dk = dv = 64, sm_90): at 4 warps the
        # forward spills 584 B (atk) / 11 KB (atq) and the two backward kernels 44 / 14 KB; at 8 warps 0 / 3.2 KB and
        # 21 / 8 KB (not yet timed on a GPU; the backward's spill is its tiles' layout more than the warp count)
        return BK, bv_full, 8, 1
    if name in ("curvature_state", "bwd_curvature_carry"):
        # one [BK, BV] tile of C (of D) per program, its update (one Kᵀ K product; two SᵀQ, S in halves) and a 16 KB
        # store per chunk (at 64 × 64): 256 programs at B = 4, H = 16, dk = 128. Compile report (ccq_gdn, dk = 128,
        # sm_90): 144-159 / 242 registers, no spill
        return bk_block, min(64, BK), 4, 2
    if name in WHOLE_KEY_ROWS:
        # chunk-parallel (one program per chunk, key head and BV columns of C), whole key rows in two tiles of BK.
        # (Until run 87 these were sequential passes carrying C or E as two [BK, BV] tiles of BV columns, every product
        # inside the chunk loop: the forward at BV 32 / 4 warps 0.926 ms in run 44, 0.57 in run 86; bwd_curvature_query
        # at BV 32 / 4 warps / 1 stage, with a 96 B spill, gave a wrong dλ on sm_90, a Triton 3.6 build error.)
        # Compile report (ccq_gdn, dk = 128, sm_90), registers / spill: BV 64 at 4 warps 255 / 0 (backward 250 / 0), at
        # 8 warps 199-208 / 0 (backward 174 / 0); BV 128 at 8 warps 255 / 40 B. H200 (tune.py ccq_gdn, run 88), ms at
        # BV 64 with 4 / 8 warps: curvature_query 0.338 / 0.618, bwd_curvature_query 0.359 / 0.543, bwd_curvature_key
        # 0.401 / 0.615 (BV 128 at 8 warps 0.507, 0.487, 0.565; bwd_curvature_query at BV 32 / 4 warps faulted there).
        # bwd_curvature_key (the same kernel for either decay) at BV 64 / 4 warps had 254 registers + 16 B spill; ccq_gla
        # shipped BV 32 / 4 warps for it (185 / 0; H100, tune.py ccq_gla, run 95: BV 64 / 4 warps 0.423 ms, BV 32 / 4
        # warps 0.503, BV 64 / 8 warps 0.660). Since it forms the scores in a loop of their own before E k (the keys
        # read twice) it holds 255 / 0 at BV 64 / 4 warps (twenty-fourth session): BV 64 for both, untimed as such
        return max(bk_block, BK // 2), min(64, BK), 4, 1
    return BK, bv_full, (8 if wide and decay == "vector" else 4), 1


def check_launch(spec: str, name: str, cfg: tuple[int, ...], DV: int, DK: int | None = None) -> tuple[int, ...]:
    """`cfg`, refused where the stage's kernel cannot run it (a whole-row stage with BV < dv, or 2 BK < dk)."""
    if name in WHOLE_VALUE_ROWS and cfg[1] < DV:
        raise ValueError(f"{spec}: stage {name} holds whole value rows: BV = {cfg[1]} < dv = {DV}")
    if name in WHOLE_KEY_ROWS and DK is not None and 2 * cfg[0] < DK:
        raise ValueError(f"{spec}: stage {name} holds whole key rows in two blocks: 2 BK = {2 * cfg[0]} < dk = {DK}")
    return cfg


def parse_launch_overrides(text: str) -> dict[str, tuple[int, ...]]:
    """DGPS_LAUNCH="stage=BK,BV,warps,stages;..." (tuning runs): per-stage settings that replace the table's."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        stage, _, vals = item.partition("=")
        out[stage.strip()] = tuple(int(v) for v in vals.split(","))
    return out


def format_launches(stages: list[str], DK: int, DV: int, decay: str, family: str, route: str,
                    precond: str = "none") -> str:
    """The table's settings for `stages` at head sizes DK, DV, one line each (for `dgps show --stage plan`)."""
    lines = [f"  launch settings at dk = {DK}, dv = {DV} (codegen/launch.py; DGPS_LAUNCH overrides; few: a call with few "
             "sequences × value heads)"]
    for name in stages:
        cfg = table_launch(name, DK, DV, decay, family, route, precond=precond)
        few = table_launch(name, DK, DV, decay, family, route, n_state=1, precond=precond)
        line = f"    {name:<20} BK={cfg[0]:<4} BV={cfg[1]:<4} warps={cfg[2]} stages={cfg[3]}"
        if few != cfg:
            line += f"   few: BK={few[0]} BV={few[1]} warps={few[2]} stages={few[3]}"
        lines.append(line)
    return "\n".join(lines)


def tuning_candidates(name: str, DK: int, DV: int, around: Sequence[int] | None = None) -> list[tuple[int, int, int, int]]:
    """The settings `dgps tune` (runtime/autotune.py) and benchmarks/tune.py try for one stage at head sizes DK, DV:
    the neighbourhood of the table's choices, those the stage's kernel can run (check_launch). Left out on purpose:
    8 warps for bwd_state and BV 16 there (faulted on sm_90 under Triton 3.6, runs 2 and 40).
    `around`: the setting the table gives this spec's stage; the grid is swept at its key and value blocks too, so a
    block the grid lacks is still tried with every warp and stage count (the per-channel interaction's BK 16, the
    levels' key block, is not in the grid the scalar one is swept over)."""
    fk = max(16, 1 << (DK - 1).bit_length())
    fv = max(16, 1 << (DV - 1).bit_length())
    half_k = max(16, fk // 2)
    grid = {
        "l2norm": itertools.product([fk], [64], [1, 2, 4, 8], [1]),
        "chunk_cumsum": itertools.product([fk], [64], [1, 2, 4], [1]),
        "interaction": itertools.product([32, 64], [64], [1, 2, 4, 8], [1]),
        "wy": itertools.product([64, fk], [64], [2, 4, 8], [1, 2]),
        "decay_keys": itertools.product([32, 64, fk], [64], [2, 4, 8], [1]),
        "state_pass": itertools.product([fk, half_k], [16, 32, 64], [4, 8], [2, 3]),
        "output": itertools.product([64, fk], [64, fv], [4, 8], [2, 3]),
        # the state pass with the output fused in (scalar or no decay): two key tiles (the table's) or one
        # (1 stage faulted on sm_90 under Triton 3.6, run 40)
        "state_output": itertools.product(sorted({max(64, fk // 2), fk}), [16, 32, 64], [4, 8], [2, 3]),
        # an inference call's fused kernel with the wy stage inside (one more c×c product per chunk): the same sweep
        "state_output_wy": itertools.product(sorted({max(64, fk // 2), fk}), [16, 32, 64], [4, 8], [2, 3]),
        # (both key-row tilings: the table's 64-row tiles, swept on the H200 since run 75 at BK 64 only, and whole key
        # rows, last compared there in run 11; on the H100, run 111, BK 128 / BV 64 / 3 stages took kda's 0.280 ms to
        # 0.259 and pgdn's 0.313 to 0.275, gdn staying fastest at the table's)
        "bwd_state": itertools.product([fk, half_k], [32, 64], [4], [1, 2, 3]),
        "bwd_local_values": itertools.product([64, fk], [32, 64, fv], [4, 8], [1, 2]),
        "bwd_grads": itertools.product([32, 64, fk], [32, 64], [4, 8], [1, 2]),
        "bwd_solve": itertools.product([64], [32, 64, fv], [4, 8], [1, 2]),
        "bwd_key_grads": itertools.product([32, 64], [32, 64], [4, 8], [1, 2]),
        "bwd_scores": itertools.product([64], [32, 64], [4, 8], [1, 2]),
        "bwd_intra": itertools.product([16, 32, 64], [64], [1, 2, 4, 8], [1]),
        "bwd_inputs": itertools.product([fk], [fv], [4, 8], [1, 2]),  # whole value rows (BV >= dv)
        # the PDN statistic splits over key-channel blocks (BK < dk: more programs, fewer live registers)
        "precond_diag": itertools.product([8, 16, 32, 64], [fv], [1, 2, 4, 8], [1, 2]),
        "bwd_precond_diag": itertools.product([8, 16, 32], [fv], [1, 2, 4], [1, 2]),
        # the curvature passes per chunk: BV columns of the dk × dk sums, key rows in one or two blocks of BK
        # (BV 32 faulted on sm_90 under Triton 3.6 at 4 warps / 1 and 2 stages and 8 warps / 1: H100 run 111; at 4
        # warps on the H200, run 88)
        "curvature_query": itertools.product([half_k, fk], [64, fk], [4, 8], [1, 2]),
        "bwd_curvature_query": itertools.product([half_k, fk], [64, fk], [4, 8], [1, 2]),
        "bwd_curvature_key": itertools.product([half_k, fk], [32, 64, fk], [4, 8], [1, 2]),
        # their carries: one [BK, BV] tile per program
        "curvature_state": itertools.product([32, 64], [32, 64], [4, 8], [1, 2, 3]),
        "bwd_curvature_carry": itertools.product([32, 64], [32, 64], [4, 8], [1, 2, 3]),
    }.get(name, ())
    grid = list(grid)
    if around is not None:
        grid += [(around[0], *c[1:]) for c in grid] + [(c[0], around[1], *c[2:]) for c in grid]
    out = []
    for cfg in dict.fromkeys(grid):
        bk, bv = cfg[0], cfg[1]
        if bk > fk or bv > max(fk, fv):
            continue
        try:
            check_launch("tune", name, cfg, DV, DK)
        except ValueError:
            continue
        out.append(cfg)
    return out
