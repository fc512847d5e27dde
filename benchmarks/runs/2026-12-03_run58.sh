#!/usr/bin/env bash
# Run 58: the GPU check of every per-channel spec the chunk form changed (gentle gates: the chunk form; plain: mostly
# the blocks form), then the vector variants against kda and gla with per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check, gentle gates"
timeout 90 python3 benchmarks/check_gpu_grads.py --systems pkda ccq_gla clvr_kda cler_h_kda --dtype bf16 --gate-scale 0.05 2>&1 | grep -v Warn | tail -5
echo "== check, plain gates"
timeout 40 python3 benchmarks/check_gpu_grads.py --systems cler_h_kda gla --dtype bf16 2>&1 | grep -v Warn | tail -3
echo "== vector variants"
timeout 100 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run58_variants.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
