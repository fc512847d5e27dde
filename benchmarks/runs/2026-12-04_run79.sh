#!/usr/bin/env bash
# Run 79: the 32k shape (B=1, T=32768, H=16, D=128; last measured in run 41, before the split backward and the fused
# state pass + output). The sequential passes then have 16 sequences × heads: a state-pass sweep at that shape (BV 16 /
# 32 / 64), then gdn, delta_rule, simple_gla and kda next to FLA. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== tune gdn at 32k"
timeout 100 python3 benchmarks/tune.py gdn --shape 1 32768 16 128 --stages state_pass state_output bwd_state --json $OUT/tune_gdn_32k.json --configs 64,16,4,2 64,32,4,2 64,32,4,3 64,64,4,4 2>&1 | grep -v -i warn | tail -6
echo "== 32k table"
timeout 260 python3 benchmarks/bench_fla.py --shape 1 32768 16 128 --systems gdn delta_rule simple_gla kda --reps 3 --profile --json $OUT/run79_32k.json 2>&1 | grep -v -i warn | tail -6
echo "== done"
