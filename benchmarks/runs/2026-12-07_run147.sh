#!/bin/bash
# Run 147 (thirty-sixth session): the wy stage at the end of kda's interaction launch (49f9026; compiler/plan.py
# _wy_in_interaction), against c524898 (the chunk form at BKF 32, wy its own launch) in alternating processes, then
# the vector table at HEAD with accuracy.
#   compile report (sm_90, dk = 128): the fused kernel 255 registers, no spill (KEEP 0 and 1).
#   prediction: kda's forward 0.93 -> 0.85-0.88 ms (the wy launch's 0.164 ms replaced by ~0.09-0.11 of tail that reads
#   k and the gates from L2 and T from L2), training step -0.05 to -0.08 ms; gla / gdn2 / pkda unchanged (not fused).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run147.sh [ab] [vector]  (carry .whl .bench .ab; .ab/oldpkg
#   = c524898: mkdir -p .ab/oldpkg/dgps && git archive c524898 | tar -x -C .ab/oldpkg/dgps, generated/ kda only)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
ab() {
  new="$PYTHONPATH" old="${TMPDIR:-/tmp}/dgps_device/site:$PWD/.ab/oldpkg"
  for i in $(seq ${AB_ROUNDS:-2}); do
    for side in old new; do
      [ $side = old ] && pp="$old" || pp="$new"
      echo "-- $side"
      PYTHONPATH="$pp" timeout 120 python3 benchmarks/bench_fla.py --systems kda --reps 3 --no-fla --profile 2>&1 \
          | grep -v -i warn | grep -v "^ *$" | sed "s|$PWD||" | tail -5
    done
  done
}
vector() {
  timeout 240 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run147_vector.json 2>&1 | grep -v -i warn | tail -8
}
for s in ${@:-ab vector}; do $s; done
echo "== done"
