#!/usr/bin/env bash
# Run 127 (written in the twenty-eighth session, not yet run): the read-corrected and preconditioned specs keeping
# the output's scores (compiler/plan.py SCORES_WITH_READ_CORRECTION, SCORES_WITH_PRECONDITIONER, off;
# plan_experiment.py --patch more_scores: the renamed spec with them) against the shipped bwd_local_values form, one
# process: errors against float64 of both (bf16 and fp32, B 4 T 300 H 8 D 128: the fused forward runs), then the
# step at B 4 T 4096 H 16 D 128. Predictions: ccq_gdn's step −0.12 to −0.15 ms (bwd_local_values 0.128 gone,
# bwd_state −0.04, the fused forward +0.02 for its 72 B spill); pgdn's −0.15 to −0.2 (its bwd_local_values 0.148
# gone, bwd_state −0.04, its unfused output +0.01 for the store).
# Usage: bash benchmarks/runs/2026-12-06_run127.sh   (carry .whl; ~400 s)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
timeout 400 python3 benchmarks/plan_experiment.py ccq_gdn ccq_gdn_uncentered pgdn --patch more_scores \
    --check-shape 4 300 8 128 --check-dtypes bf16 fp32 --reps 5 --json "$OUT/run127.json" 2>&1 | q | cut -c1-330
# pgdn's reverse pass with the scores at its table setting (3 stages) holds 255 registers + 48 B spill and 213 KB of
# shared memory (compile report; the shipped one 24 B, 197 KB); at 2 stages 180 / 0 / 119 KB
timeout 200 python3 benchmarks/plan_experiment.py pgdn --patch more_scores --patched-launch "bwd_state=64,32,4,2" \
    --check-dtypes --reps 5 2>&1 | q | cut -c1-330
echo "== done"
