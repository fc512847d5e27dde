#!/usr/bin/env bash
# Run 85: (1) GPU checks at B = 4, H = HV = 16 (64 sequences × heads: run 83's wide settings, pgdn's reverse pass at
# BV 64 / 3 stages and cler_h_gdn's state pass at BV 64 / 4 stages); (2) cler_h_kda's state pass, output, local values
# and reverse pass swept (1.11× kda in run 78, the bound is 1.10; its state pass never swept at BV 64). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks (wide)"
timeout 120 python3 benchmarks/check_gpu_grads.py --systems pgdn cler_h_gdn --B 4 --H 16 --HV 16 --T 300 --dtype bf16 2>&1 | grep -v -i warn | tail -3
echo "== tune cler_h_kda"
timeout 200 python3 benchmarks/tune.py cler_h_kda --stages state_pass output bwd_local_values bwd_state --json $OUT/tune_clerh_kda.json --configs 64,32,4,2 64,64,4,2 64,64,4,3 64,64,4,4 64,128,4,2 64,128,4,3 2>&1 | grep -v -i warn | tail -4
echo "== done"
