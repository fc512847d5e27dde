#!/usr/bin/env bash
# Run 72: RWKV-7 (dplr) with the untied interaction's chunk form; launch sweeps of its interaction and reverse state
# pass (and cler_h_kda's), dplr next to FLA (its kernels from run 71's cache, .fla_dplr/), then the scalar variants
# (ccq_gdn without the dC0 pass). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
xz -d < .fla_dplr/fla_tc.tar.xz | tar -C /tmp/fla_tc -xf -
echo "== checks"
timeout 80 python3 benchmarks/check_gpu_grads.py --systems rwkv7_dplr --dtype bf16 2>&1 | grep -v -i warn | tail -2
echo "== tune"
timeout 120 python3 benchmarks/tune.py rwkv7_dplr --stages interaction --configs 32,64,2,1 32,64,4,1 16,64,4,1 16,64,2,1 32,64,8,1 64,64,4,1 2>&1 | grep -v -i warn | tail -8
timeout 100 python3 benchmarks/tune.py rwkv7_dplr --stages bwd_state --configs 64,32,4,2 64,64,8,2 64,64,4,2 64,32,4,1 2>&1 | grep -v -i warn | tail -6
timeout 100 python3 benchmarks/tune.py cler_h_kda --stages bwd_state --configs 64,32,4,2 64,64,8,2 64,64,4,2 64,32,4,1 2>&1 | grep -v -i warn | tail -6
echo "== dplr"
timeout 120 python3 benchmarks/bench_fla.py --systems dplr --profile --json $OUT/run72.json 2>&1 | grep -v -i warn | tail -4
echo "== scalar variants"
timeout 120 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run72_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== done"
