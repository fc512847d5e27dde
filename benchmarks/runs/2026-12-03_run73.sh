#!/usr/bin/env bash
# Run 73: GPU checks of rwkv7_dplr and cler_h_kda with the reverse state pass at BV 64; RWKV-7 (dplr) next to FLA with
# profiles and full-size accuracy (FLA's kernels from run 71's cache); the vector variants (cler_h_kda). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
xz -d < .fla_dplr/fla_tc.tar.xz | tar -C /tmp/fla_tc -xf -
echo "== checks"
timeout 100 python3 benchmarks/check_gpu_grads.py --systems rwkv7_dplr cler_h_kda --dtype bf16 2>&1 | grep -v -i warn | tail -3
echo "== dplr"
timeout 150 python3 benchmarks/bench_fla.py --systems dplr --profile --accuracy --json $OUT/run73.json 2>&1 | grep -v -i warn | tail -4
echo "== vector variants"
timeout 200 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run73_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== done"
