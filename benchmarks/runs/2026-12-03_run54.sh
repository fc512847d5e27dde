#!/usr/bin/env bash
# Run 54: the vector systems next to FLA (decay_keys fused into the interaction; the diagonal-block form that run 53
# chose) with per-kernel profiles, then the vector variants against kda and gla. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== vector systems"
timeout 260 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --profile --json $OUT/run54.json 2>&1 | grep -v -i warn | tail -7
echo "== vector variants"
timeout 260 python3 benchmarks/bench_fla.py --systems --variants vector --profile --json $OUT/run54_variants.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
