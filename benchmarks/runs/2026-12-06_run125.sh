#!/usr/bin/env bash
# Run 125 (twenty-eighth session): the output's stored scores for the route specs (cler_h_gdn, clvr_gdn: the route
# changes the reverse pass's dH terms, not dU's local share) against bwd_local_values (plan_experiment.py --patch
# no_keep_scores: the renamed spec without them), one process; GPU checks bf16 at B 4 T 300 H 8 D 128 (the fused
# forward runs) with the route's gradient; then gdn at the same time for the variant ratio.
# Usage: bash benchmarks/runs/2026-12-06_run125.sh   (carry .whl; writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
timeout 150 python3 benchmarks/check_gpu_grads.py --systems cler_h_gdn clvr_gdn --dtype bf16 2>&1 | q | tail -3
timeout 150 python3 benchmarks/check_gpu_grads.py --systems cler_h_gdn clvr_gdn --dtype fp32 2>&1 | q | tail -3
timeout 280 python3 benchmarks/plan_experiment.py cler_h_gdn clvr_gdn gdn --patch no_keep_scores \
  --check-shape 4 300 8 128 --check-dtypes bf16 --reps 5 --json "$OUT/run125.json" 2>&1 | q | cut -c1-400
echo "== done"
