#!/bin/bash
# Run 153 (prepared in the thirty-seventh session, not yet run): the variants FLA lacks, on an H200, at HEAD.
#   latest.json's H200 variant rows are run 137's (0ec3642); the H100 rows are run 141's (210748e). Since then: the
#   host-time work (sessions 34-35), the chunk form's key block and kda's wy in its interaction (session 36); the
#   thirty-seventh session's codegen hooks left every non-route kernel's source as it was and the route kernels' code
#   the same to renamings.
#   prediction: ratios within 3 % of run 141's H100 ones (ccq_gdn 2.03×, pgdn 1.72×, cler_h_gdn 1.09× gdn; pkda 1.31×
#   kda; ccq_gla 1.62× gla_l2norm; clvr_kda ~1.03× and cler_h_kda ~1.07× kda_l2norm), the kda-based steps ~0.1 ms
#   lower than run 137's by the key block and the fused wy.
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run153.sh [scalar] [vector]   (carry .whl; DGPS_COMMIT a
#   literal sha: the device's copy carries an older .git, and $(git rev-parse) would run there)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
for family in ${@:-scalar vector}; do
  timeout 280 python3 benchmarks/bench_fla.py --systems --variants $family --reps 3 --profile \
      --json $OUT/run153_variants_$family.json 2>&1 | grep -v -i warn | tail -16
done
echo "== done"
