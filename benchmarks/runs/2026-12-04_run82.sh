#!/usr/bin/env bash
# Run 82: the additive family's state passes split over key-row blocks (compiler/plan.py: split_reverse_pass; the
# reverse pass carries dH alone, dU is formed chunk-parallel after it by bwd_local_values; the forward state pass,
# where it runs alone, one program per key block too). (1) GPU checks of the additive specs (the checks' B = 2,
# HV = 4 also take the unfused forward, so the split forward pass); (2) sweeps of the split passes at 32k and at the
# reference shape; (3) simple_gla and gla next to FLA at both shapes. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 120 python3 benchmarks/check_gpu_grads.py --systems simple_gla gla la retnet mamba2 ccq_gla --dtype bf16 2>&1 | grep -v -i warn | tail -8
echo "== tune simple_gla at 32k"
timeout 130 python3 benchmarks/tune.py simple_gla --shape 1 32768 16 128 --stages state_pass bwd_state --json $OUT/tune_sg_32k.json --configs 64,16,4,2 64,32,4,2 64,32,4,3 64,64,4,2 64,64,4,3 64,128,4,2 2>&1 | grep -v -i warn | tail -4
echo "== tune simple_gla at the reference shape"
timeout 110 python3 benchmarks/tune.py simple_gla --stages state_pass bwd_state --json $OUT/tune_sg_ref.json --configs 64,32,4,2 64,64,4,2 64,64,4,3 64,64,4,4 64,128,4,2 2>&1 | grep -v -i warn | tail -4
echo "== 32k"
timeout 100 python3 benchmarks/bench_fla.py --shape 1 32768 16 128 --systems simple_gla gla --reps 3 --profile --json $OUT/run82_32k.json 2>&1 | grep -v -i warn | tail -3
echo "== reference shape"
timeout 100 python3 benchmarks/bench_fla.py --systems simple_gla gla --reps 3 --profile --json $OUT/run82.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
