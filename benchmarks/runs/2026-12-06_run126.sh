#!/usr/bin/env bash
# Run 126 (twenty-eighth session), most valuable first:
#  1. the fused state pass + output of a training forward (KEEP: it stores the scores) at BK 128 (one key tile;
#     compile report: gdn 72 -> 16 B spill, cler_h_gdn / clvr_gdn 120 -> 16, deltanet 0 either way) against the
#     table's BK 64, on the recorded launch (benchmarks/kernel_sections.py --set), reference shape;
#  2. kda's Q⋆A in the reverse pass at one stage (16 KB of shared memory instead of 131: several programs per SM)
#     against the shipped bwd_local_values form (plan_experiment --patched-launch);
#  3. gdn's interaction (+ solve) at BK 32 (no spill: 212 registers) and at 2 warps.
# Usage: bash benchmarks/runs/2026-12-06_run126.sh   (carry .whl)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
so() {
  timeout 100 python3 benchmarks/kernel_sections.py --system $1 --kernel chunk_state_output_kernel \
      --set BK=128 BK=128,num_stages=3 BV=16,grid0=8 --rounds 5 2>&1 | q | tail -5
}
so gdn
timeout 150 python3 benchmarks/plan_experiment.py kda --patch keep_scores --patched-launch "bwd_state=64,32,4,1" \
    --check-dtypes --reps 5 2>&1 | q | cut -c1-330
so cler_h_gdn
timeout 90 python3 benchmarks/kernel_sections.py --system gdn --kernel chunk_interaction_kernel \
    --set BK=32 num_warps=2 --rounds 5 2>&1 | q | tail -4
so deltanet
echo "== done"
