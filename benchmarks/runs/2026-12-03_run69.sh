#!/usr/bin/env bash
# Run 69: both families' variants with CCQ's synchronising copy gone (runs 60/67: CCQ's wall clock ~0.75 ms above its
# kernel sums) and cler_h_kda's stored E ⊙ e^B; then the scalar systems' full-size accuracy next to FLA (last measured
# in run 41, before sessions 6-10 changed every scalar kernel). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== variants"
timeout 330 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile --json $OUT/run69.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== scalar accuracy"
timeout 220 python3 benchmarks/bench_fla.py --systems gdn delta_rule simple_gla precond_gdn --reps 1 --accuracy --json $OUT/run69_acc.json 2>&1 | grep -v -i warn | grep -i "accuracy\|error\|Trace" | tail -8
echo "== done"
