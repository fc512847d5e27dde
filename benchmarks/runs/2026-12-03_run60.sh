#!/usr/bin/env bash
# Run 60: where gdn's and kda's training steps leave the GPU idle (dgps and FLA, and which calls synchronise), the
# PDN statistic at its 128-row steps with other warp counts, then the variants of both families with the chunk form
# (run 58's, never run) and the 128-row PDN steps, per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== gaps"
timeout 120 python3 benchmarks/step_gaps.py --systems gdn kda simple_gla --fla --sync-check 2>&1 | grep -v -i warn
echo "== pdn forward / backward at 128-row steps"
for k in chunk_precond_diag_kernel chunk_bwd_precond_diag_kernel; do
  timeout 60 python3 benchmarks/kernel_sections.py --system pgdn --kernel $k --set num_warps=2 num_warps=8 2>&1 | grep -v -i warn | tail -4
done
echo "== variants"
timeout 300 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile --json $OUT/run60_variants.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
