#!/usr/bin/env bash
# Run 109 (twenty-fifth session, first device call): whichever card comes.
#   H200: the H200 tables at one commit (run 105's `h200` mode: scalar and vector FLA tables with accuracy, both
#         variant families, FlashQLA next to gdn, the cold start); latest.json's H200 rows predate runs 88-108.
#   H100: the variants at the shipped commit (pkda's spill-free direct dg untimed since the twenty-fourth session),
#         then GPU checks of the systems whose kernels changed last session.
# Usage: bash benchmarks/runs/2026-12-06_run109.sh
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
case "$gpu" in
*H200*) bash benchmarks/runs/2026-12-07_run105.sh h200 ;;
*)
  timeout 170 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile \
      --json $OUT/run109_variants.json 2>&1 | q | grep "^variants"
  timeout 150 python3 benchmarks/check_gpu_grads.py --systems pkda pgdn ccq_gla gla --dtype bf16 2>&1 | q | tail -6
  ;;
esac
echo "== done"
