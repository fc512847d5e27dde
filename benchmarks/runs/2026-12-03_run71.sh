#!/usr/bin/env bash
# Run 71 (twelfth session): RWKV-7 (dplr) with bwd_intra's bounded diagonal blocks, next to FLA's chunk_dplr_delta_rule
# (not in the bench cache: FLA compiles and autotunes it here, and the grown cache comes back as $OUT/fla_tc.tar.xz
# for the next runs), profiled, with full-size accuracy; then the reverse state pass's launch settings of rwkv7_dplr
# (147 KB of shared memory at BV 32 / 2 stages: one program per SM, 256 programs). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 80 python3 benchmarks/check_gpu_grads.py --systems rwkv7_dplr --dtype bf16 2>&1 | grep -v -i warn | tail -3
echo "== dplr"
timeout 330 python3 benchmarks/bench_fla.py --systems dplr --profile --accuracy --json $OUT/run71.json 2>&1 | grep -v -i warn | tail -30
tar -C /tmp/fla_tc -cf - . | xz -6 > $OUT/fla_tc.tar.xz; ls -la $OUT
echo "== tune"
timeout 100 python3 benchmarks/tune.py specs/rwkv7_dplr.dgps --stages bwd_state --configs 64,32,4,2 64,64,8,2 64,64,4,2 64,32,4,1 2>&1 | grep -v -i warn | tail -8
echo "== done"
