#!/usr/bin/env bash
# Run 66 (eleventh session): full-size accuracy of the vector family on the chunk form (not measured since run 44,
# before the per-channel forms of sessions 8-10), next to FLA on the same inputs; then varlen KDA (8 ragged
# sequences; FLA's varlen kernels autotune on their first call: cut at the time left). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== vector accuracy"
timeout 400 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --reps 1 --accuracy --json $OUT/run66.json 2>&1 | grep -v -i warn | grep -i "accuracy\|error\|Trace" | tail -12
echo "== varlen kda"
timeout 170 python3 benchmarks/bench_fla.py --systems kda --varlen 8 --reps 3 --json $OUT/run66_varlen.json 2>&1 | grep -v -i warn | tail -4
echo "== done"
