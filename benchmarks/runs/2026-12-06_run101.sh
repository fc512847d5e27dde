#!/usr/bin/env bash
# Run 101 (written in the twenty-second session, when no device was lent): times that session's untimed changes and
# gives the tables one commit. Predictions (NOTES, twenty-second session; H100 numbers from run 99, B4 T4096 H16 D128):
#   - key blocks adjacent in the backward grids (a91eeb0): bwd_grads of kda / gdn2 / pkda -0.1 to -0.2 ms each,
#     bwd_intra -0.05, gdn / pgdn bwd_key_grads -0.02 to -0.05;
#   - dY once per chunk for the vector delta family (47fcb8b): kda bwd_grad 1.08 -> ~0.90 ms, bwd_scores 0.21 -> ~0.25;
#     kda step 3.83 -> ~3.55 ms with the grid order; gdn2 more (its v / w gradients left the key blocks, 9ef6ac1);
#   - gdn2 without a dβ (360f182): bwd_scores 0.225 -> ~0.19 ms;
#   - peaks (memory_trace.py): kda 973, gdn2 1096, precond_kda 1548 MiB.
#   checks:  GPU gradient checks of the vector specs and pgdn (bf16, worst relative error over o, states, gradients).
#   tables:  the scalar and vector FLA tables with profiles and accuracy, then both variant families (3 reps).
#   repro:   the two Triton 3.6 sm_90 faults as standalone files (benchmarks/repro/), plain, then under memcheck.
#   tune:    the vector family's bwd_grads at BK 64 / 8 warps against the shipped BK 32 / 4 (pkda's shipped BK 64 / 8
#            against BK 32 / 4): with dY read instead of formed, BK 64 / 8 warps no longer spills (compile report, sm_90,
#            dk = 128: kda 249 registers, gdn2 246, pkda 255, none; BK 64 / 4 warps spills 1040 B), and two key blocks
#            per chunk read the value tiles half as often. Prediction: within ±10 %, sign unknown.
#   all:     checks, tables and repro in one call (~450 s warm; give it the 600 s limit).
# Usage: bash benchmarks/runs/2026-12-06_run101.sh checks|tables|repro|tune|all   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
nvidia-smi --query-gpu=name --format=csv,noheader
checks() {
  timeout 120 python3 benchmarks/check_gpu_grads.py --systems kda pkda gla gdn2 ccq_gla clvr_kda cler_h_kda pgdn \
      --dtype bf16 2>&1 | q | tail -10
}
tables() {
  timeout 150 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run101_scalar.json 2>&1 | q | tail -6
  timeout 150 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run101_vector.json 2>&1 | q | tail -6
  timeout 150 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile \
      --json $OUT/run101_variants.json 2>&1 | q | grep "^variants"
}
repro() {
  for f in benchmarks/repro/*.py; do
    timeout 60 python3 "$f" 2>&1 | q | tail -2
    timeout 120 compute-sanitizer --tool memcheck --print-limit 2 python3 "$f" 2>&1 | q | grep -v "Host Frame" | head -12
  done
}
tune() {
  for s in kda gdn2 pkda; do
    timeout 150 python3 benchmarks/tune.py $s --stages bwd_grads --configs 32,64,4,1 64,64,8,1 \
        --json $OUT/run101_tune_${s}_grads.json 2>&1 | q | tail -3
  done
}
case "$1" in
checks) checks ;;
tune) tune ;;
tables) tables ;;
repro) repro ;;
all) checks; tables; repro ;;
*) echo "usage: $0 checks|tables|repro|tune|all"; exit 2 ;;
esac
echo "== done"
