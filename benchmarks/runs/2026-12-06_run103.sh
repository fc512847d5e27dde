#!/usr/bin/env bash
# Ran `main` at 8c34dc8's tree (the product form shipped then); its --patch names PDN_SCAN_FORM, which 77a1ead
# removed: a record of that run, not runnable as written at later commits.
# Run 103 (twenty-third session): the device time left after the morning's refused starts (~18 min) in two calls.
#   main:   the PDN statistic's product form against the tuple scan (generated kernels, one process, interleaved:
#           kernel_sections.py --patch), GPU gradient checks, the variant tables with profiles.
#           Predictions (H100; ~0.7× on an H200): chunk_precond_diag 0.18 -> ~0.12 ms, chunk_bwd_precond_diag
#           0.375 -> ~0.25 ms; pgdn 1.57x -> ~1.49x gdn, pkda 1.23x -> ~1.19x kda; run 101's predictions for the
#           twenty-second session's changes (kda bwd_grad 1.08 -> ~0.90 ms H100, gdn2 bwd_scores 0.225 -> ~0.19).
#   tables: the scalar and vector FLA tables with profiles and accuracy (run 101's `tables`).
# Usage: bash benchmarks/runs/2026-12-06_run103.sh main|tables   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
nvidia-smi --query-gpu=name --format=csv,noheader
main() {
  for k in chunk_precond_diag_kernel chunk_bwd_precond_diag_kernel; do
    echo "== pgdn $k (whole = product form; patch = tuple scan)"
    timeout 90 python3 benchmarks/kernel_sections.py --system pgdn --kernel $k --rounds 5 \
        --patch dgps.compiler.plan.PDN_SCAN_FORM=tuple 2>&1 | q | tail -2
  done
  echo "== tune (product form)"
  timeout 150 python3 benchmarks/tune.py pgdn --stages precond_diag bwd_precond_diag \
      --configs 8,64,4,2 16,64,4,2 32,64,4,2 16,64,2,2 --json $OUT/run103_tune_pgdn.json 2>&1 | q | tail -3
  echo "== checks"
  timeout 120 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda kda gdn2 gla ccq_gla cler_h_kda \
      --dtype bf16 2>&1 | q | tail -8
  echo "== variants"
  timeout 200 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile \
      --json $OUT/run103_variants.json 2>&1 | q | grep "^variants"
}
case "$1" in
main) main ;;
tables) bash benchmarks/runs/2026-12-06_run101.sh tables ;;
*) echo "usage: $0 main|tables"; exit 2 ;;
esac
echo "== done"
