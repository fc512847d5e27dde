#!/usr/bin/env bash
# Run 51: PDN's k̃ as a hi / lo pair in the input dtype (remainder rounded toward zero; CCQ's q̂ pair too): GPU checks,
# the preconditioned systems next to FLA and the scalar variants, with per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 110 python3 benchmarks/check_gpu_grads.py --systems pgdn pdn pkda ccq_gdn --dtype bf16 2>&1 | grep -v Warn | tail -6
echo "== bench"
timeout 120 python3 benchmarks/bench_fla.py --systems precond_gdn precond_kda --profile --json $OUT/run51.json 2>&1 | grep -v -i warn | tail -4
echo "== variants"
timeout 120 python3 benchmarks/bench_fla.py --systems --variants scalar --profile --json $OUT/run51_variants.json 2>&1 | grep -v -i warn | tail -2
echo "== done"
