#!/usr/bin/env bash
# Run 129 (twenty-ninth session): run 128 again after its two findings. Run 128 measured the training kernel with W
# and Ũ stored at 0.572 ms (4 warps; 0.664 at 8) against 0.233 + 0.113 for the fused kernel + wy launch: its reloads
# of T and Z took it to 117 KB of shared memory (compile report), one program per SM where the others fit two; now
# 97 KB (255 registers + 80 B spill). And its check faulted: an unfused inference call (few programs) wrote W into an
# unallocated buffer (fixed: codegen/buffers.py call_launch_of). Prediction: the kernel ~0.30 ms, the step -0.03 to
# -0.05 against the shipped form; errors equal. Checks at B 4 T 300 H 8 (the fused kernel runs) and the default
# B 2 T 300 H 2 (the unfused form).
# Usage: bash benchmarks/runs/2026-12-06_run129.sh   (carry .whl; ~200 s)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
timeout 150 python3 benchmarks/plan_experiment.py gdn --patch wy_train --check-shape 4 300 8 128 --check-dtypes bf16 \
    --reps 5 2>&1 | q | cut -c1-700
timeout 60 python3 benchmarks/plan_experiment.py gdn --patch wy_train --check-dtypes bf16 --reps 1 2>&1 | q | \
    grep worst | cut -c1-300
echo "== done"
