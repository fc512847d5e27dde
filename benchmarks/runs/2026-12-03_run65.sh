#!/usr/bin/env bash
# Run 65: the residual route fused into the state pass + output launch (cler_h_gdn; one program per SM at 128 KB of
# shared memory): GPU checks, the scalar variants with profiles against run 60 (cler_h_gdn 2.392 ms: state pass 0.293
# for two calls + output 0.254). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 70 python3 benchmarks/check_gpu_grads.py --systems cler_h_gdn clvr_gdn gdn --dtype bf16 2>&1 | grep -v Warn | tail -4
echo "== scalar variants"
timeout 120 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run65_variants.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
