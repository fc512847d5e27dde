#!/usr/bin/env bash
# Run 50: GPU checks of the merged kernels (chunk-parallel PDN passes, the batched vector interaction, CCQ's q̂ pair),
# then the vector and preconditioned systems next to FLA and every variant, with per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 170 python3 benchmarks/check_gpu_grads.py --systems pgdn pdn pkda kda gla gdn2 ccq_gdn ccq_gla --dtype bf16 2>&1 | grep -v Warn | tail -10
echo "== bench"
timeout 190 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda precond_gdn --profile --json $OUT/run50.json 2>&1 | grep -v -i warn | tail -8
echo "== variants"
timeout 210 python3 benchmarks/bench_fla.py --systems --variants scalar vector --profile --json $OUT/run50_variants.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
