#!/usr/bin/env bash
# Run 133 (thirty-first session): the residual route's rerun of the state pass reading R from the forward's route
# output (compiler/plan.py: rerun_reads_route, on) against the rerun that forms R again (plan_experiment --patch
# no_route_rerun), one process, interleaved; GPU gradient checks; then cler_h_gdn against gdn in the variants harness.
# Prediction (H100, B 4 T 4096 H 16 D 128 bf16): cler_h_gdn's rerun 0.214 -> ~0.10 ms (~470 -> ~270 MB, one product
# per step), its step 2.103 -> ~1.99 ms (~1.06x gdn, under issue 8's 1.10x); cler_h_kda's step -0.1 ms or more
# (its rerun reads Kg, W, U, v; now Kg and R). Errors: equal within 0.3 % (CPU, bf16, T 256: measured).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run133.sh   (carry .whl; ~250 s)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
timeout 120 python3 benchmarks/check_gpu_grads.py --systems cler_h_gdn cler_h_kda --dtype bf16 2>&1 | q | tail -4
timeout 300 python3 benchmarks/plan_experiment.py cler_h_gdn cler_h_kda --patch no_route_rerun --reps 5 \
    --json $OUT/run133_route_rerun.json 2>&1 | q | tail -12
timeout 150 python3 benchmarks/bench_fla.py --systems --variants scalar --variant-specs gdn cler_h_gdn --reps 5 \
    --profile --json $OUT/run133_variants.json 2>&1 | q | grep "^variants"
echo "== done"
