#!/usr/bin/env bash
# Run 67: cler_h_kda with Eg = E ⊙ e^B stored by the interaction (the output and the reverse state pass load it):
# its GPU check, then the vector variants (with kda_l2norm / gla_l2norm, the bases with the variants' normalisation)
# and their per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 150 python3 benchmarks/check_gpu_grads.py --systems cler_h_kda clvr_kda --dtype bf16 2>&1 | grep -v -i warn | tail -6
echo "== vector variants"
timeout 400 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run67.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
