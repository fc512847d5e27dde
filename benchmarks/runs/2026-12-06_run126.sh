#!/usr/bin/env bash
# Run 126 (twenty-eighth session): the fused state pass + output of a training forward (KEEP: it stores the scores)
# at BK 128 (one key tile; compile report: gdn 72 -> 16 B spill, cler_h_gdn / clvr_gdn 120 -> 16, deltanet 0 either
# way) against the table's BK 64, timed on the recorded launch (benchmarks/kernel_sections.py --set), reference shape.
# Then gdn's interaction at BK 32 and at 2 warps.
# Usage: bash benchmarks/runs/2026-12-06_run126.sh   (carry .whl)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
for s in gdn cler_h_gdn deltanet; do
  timeout 120 python3 benchmarks/kernel_sections.py --system $s --kernel chunk_state_output_kernel \
      --set BK=128 BK=128,num_stages=3 BV=16,grid0=8 --rounds 5 2>&1 | q | tail -5
done
# the interaction (+ solve) at warps 1 spills 40 B at BK 64 (compile report); BK 32: 212 registers, no spill
timeout 90 python3 benchmarks/kernel_sections.py --system gdn --kernel chunk_interaction_kernel \
    --set BK=32 num_warps=2 --rounds 5 2>&1 | q | tail -4
echo "== done"
