#!/usr/bin/env bash
# Run 91 (written in the eighteenth session, which had no device): after run 90 (one call each, ~500 s).
#   checks: GPU checks of what this session changed in kernels (bwd_grads' dS share of db as `b_db = x; b_db += y`,
#           the same fp32 add, every split delta-family spec; rwkv7_dplr's host no longer allocates a dβ buffer).
#   route:  the residual route's state-pass settings in its solve form (codegen/launch.py says "not re-swept": they
#           were tuned for the explicit form, runs 72/83/85). cler_h_gdn is 1.13x gdn (target 1.10, 2.048 against
#           1.816 ms by kernel sums in run 89): its fused state pass + output 0.289 against gdn's 0.229 and its rerun
#           0.177 against 0.110. Prediction: at best ~0.03 ms from each (1.13x -> ~1.10x); then the variants' table.
# Usage: bash benchmarks/runs/2026-12-05_run91.sh checks|route   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
case "$1" in
checks)
  timeout 200 python3 benchmarks/check_gpu_grads.py --systems gdn deltanet pgdn cler_h_gdn ccq_gdn rwkv7_dplr --dtype bf16 2>&1 | q | tail -8
  ;;
route)
  timeout 200 python3 benchmarks/tune.py cler_h_gdn --stages state_output state_pass \
      --configs 64,32,4,2 64,32,4,3 64,16,4,2 64,64,8,2 64,64,4,4 64,64,4,3 \
      --json $OUT/run91_tune_cler_h_gdn.json 2>&1 | q | tail -4
  timeout 120 python3 benchmarks/tune.py cler_h_kda --stages state_pass --configs 64,64,4,4 64,64,4,3 64,32,4,2 \
      --json $OUT/run91_tune_cler_h_kda.json 2>&1 | q | tail -3
  timeout 170 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 5 --profile \
      --json $OUT/run91_scalar_variants.json 2>&1 | q | grep "^variants"
  ;;
*) echo "usage: $0 checks|route"; exit 2 ;;
esac
echo "== done"
