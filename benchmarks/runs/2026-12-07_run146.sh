#!/bin/bash
# Run 146 (thirty-sixth session): the per-channel interaction's chunk form at its own key block BKF (was the levels'
# BK = 16: eight K = 16 blocks of 32-byte rows per matrix), swept 16 / 32 / 64 on bench_fla's inputs (chunk form taken).
#   compile report (sm_90, dk = 128, 4 warps): kda 255 regs at 16 / 32 / 64 (64: 16 B spill in one variant), gla 206 /
#   243 / 255 + 72 B, gdn2 255 / +24 B / +80 B, pkda 255 / +16 B / +240 B; shared memory 12-16 / 24-32 / 49-65 KB.
#   prediction: the interaction's chunk part (~0.3 of kda's 0.486 ms) -30 to -40 % at BKF 32 (fewer, wider loads, a
#   quarter of the loop trips): kda interaction 0.486 -> 0.38-0.42 ms, forward 1.03 -> 0.93-0.97 (FLA 1.08: 0.86-0.90x);
#   64 no better than 32 where it spills (gla, gdn2, pkda).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run146.sh   (carry .whl)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 benchmarks/chunk_form_block.py kda gla gdn2 precond_kda --reps 5 --json $OUT/run146_bkf.json 2>&1 \
    | grep -v -i warn | tail -8
echo "== done"
