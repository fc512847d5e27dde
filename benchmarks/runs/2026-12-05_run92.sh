#!/usr/bin/env bash
# Run 92 (nineteenth session): times the PDN chain rule moved into bwd_precond_diag (each input's share of k̃'s and
# the increment's chain rule formed there; bwd_inputs reads one fp32 tile per share instead of A_t, dk̃ and the
# increment's adjoint). Prediction (benchmarks/NOTES.md, nineteenth session): pgdn bwd_inputs 0.361 -> ~0.18 ms,
# bwd_precond_diag 0.405 -> 0.40-0.44; pkda bwd_inputs 0.364 -> ~0.08; pgdn 3.09 -> ~2.92 ms, pkda -0.25 ms.
#   a: GPU checks (pgdn, pdn, pkda, precond_gdn's and precond_kda's FLA systems untouched), scalar variants with
#      profiles, precond_gdn and precond_kda against FLA.                                            (~450 s)
#   b: run 90's part: ccq_gla's bwd_curvature_key sweep, vector variants with profiles.               (~450 s)
#   c: a and b's PDN part in one short call (checks, gdn/pgdn/kda/pkda variants, precond_gdn/kda vs FLA). (~420 s)
# Usage: bash benchmarks/runs/2026-12-05_run92.sh a|b|c   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
case "$1" in
a)
  timeout 120 python3 benchmarks/check_gpu_grads.py --systems pgdn pdn pkda --dtype bf16 2>&1 | q | tail -4
  timeout 60 python3 benchmarks/check_gpu_grads.py --systems pgdn --dtype fp32 2>&1 | q | tail -2
  timeout 200 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 5 --profile \
      --json $OUT/run92_scalar_variants.json 2>&1 | q | grep "^variants"
  timeout 150 python3 benchmarks/bench_fla.py --systems precond_gdn precond_kda --reps 5 --profile \
      --json $OUT/run92_precond.json 2>&1 | q | tail -6
  ;;
b)
  DGPS_LAUNCH="bwd_curvature_key=64,32,4,1" timeout 60 python3 benchmarks/check_gpu_grads.py --systems ccq_gla --dtype bf16 2>&1 | q | tail -1
  timeout 90 python3 benchmarks/tune.py ccq_gla --stages bwd_curvature_key --configs 64,64,8,1 64,64,4,1 64,32,4,1 \
      --json $OUT/run92_tune_ck.json 2>&1 | q | tail -2
  timeout 330 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile \
      --json $OUT/run92_vec.json 2>&1 | q | grep "^variants"
  ;;
c)
  # one call when device time is short (~420 s): the PDN change's checks and its systems only
  timeout 100 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda --dtype bf16 2>&1 | q | tail -3
  timeout 200 python3 benchmarks/bench_fla.py --systems --variants --variant-specs gdn pgdn kda pkda --reps 5 --profile \
      --json $OUT/run92_pdn_variants.json 2>&1 | q | grep "^variants"
  timeout 110 python3 benchmarks/bench_fla.py --systems precond_gdn precond_kda --reps 5 \
      --json $OUT/run92_precond.json 2>&1 | q | tail -3
  ;;
*) echo "usage: $0 a|b|c"; exit 2 ;;
esac
echo "== done"
