#!/usr/bin/env bash
# Run 128 (twenty-ninth session): a training forward forming the WY form inside its fused state pass + output and
# storing W and Ũ for the backward (compiler/plan.py WY_IN_TRAINING_STATE_PASS, off; plan_experiment --patch wy_train)
# against the shipped wy launch + fused kernel, one process, B 4 T 4096 H 16 D 128 bf16: errors of both (bf16, fp32),
# then the step. Prediction (gdn): the wy launch's 0.116 ms gone, the fused kernel 0.236 -> ~0.29 (run 115's chain
# product +0.034, the stores and two off-chain products +0.02; compile report 255 registers + 40 B spill), the forward
# and the step -0.05 to -0.06 ms; at 8 warps (no spill) slower (run 40: 8 warps 2x at BV 32).
# Usage: bash benchmarks/runs/2026-12-06_run128.sh   (carry .whl; ~330 s)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
timeout 170 python3 benchmarks/plan_experiment.py gdn --patch wy_train --check-dtypes bf16 fp32 --reps 5 \
    --json "$OUT/run128_gdn.json" 2>&1 | q | cut -c1-600
timeout 80 python3 benchmarks/plan_experiment.py gdn --patch wy_train --patched-launch "state_output_wy=128,32,8,2" \
    --check-dtypes --reps 5 2>&1 | q | tail -2 | cut -c1-600
timeout 100 python3 benchmarks/plan_experiment.py deltanet --patch wy_train --check-dtypes bf16 --reps 5 2>&1 | q | \
    cut -c1-600
echo "== done"
