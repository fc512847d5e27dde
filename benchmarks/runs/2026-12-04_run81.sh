#!/usr/bin/env bash
# Run 81: the output per call (fused into the state pass, or the state pass then the chunk-parallel output when few
# sequences × value heads leave the sequential pass short of programs; built in the thirteenth session, CPU-verified
# only). (1) GPU checks, whose default B = 2, HV = 4 takes the unfused pair; (2) the 32k shape with dgps as it picks,
# forced fused and forced unfused next to FLA in one process; (3) the output kernel's sweep at 32k. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 130 python3 benchmarks/check_gpu_grads.py --systems gdn simple_gla deltanet la ccq_gdn clvr_gdn --dtype bf16 2>&1 | grep -v -i warn | tail -9
echo "== 32k output forms"
timeout 220 python3 benchmarks/bench_fla.py --shape 1 32768 16 128 --systems gdn delta_rule simple_gla --output-forms --reps 3 --profile --json $OUT/run81_32k.json 2>&1 | grep -v -i warn | tail -14
echo "== tune output at 32k"
DGPS_FUSE_OUTPUT=0 timeout 100 python3 benchmarks/tune.py gdn --shape 1 32768 16 128 --stages output --json $OUT/tune_out_32k.json --configs 64,128,4,3 64,64,4,3 64,64,4,2 32,128,4,2 64,128,8,3 2>&1 | grep -v -i warn | tail -6
echo "== done"
