#!/usr/bin/env bash
# Run 97 (twentieth session): what the nineteenth left untimed, then the tables at one commit.
#   pdn:     run 92's PDN part (GPU checks, gdn/pgdn/kda/pkda variants with profiles) for
#            the token-major PDN partials. Prediction (NOTES, nineteenth session, H100 run 92 as the base): pgdn
#            bwd_inputs 0.543 -> ~0.25 ms, pgdn 1.69x -> ~1.55x gdn, pkda 1.37x -> ~1.30x kda. Then pgdn's
#            bwd_key_grads at 4 warps (shipped: 255 registers, 112 B spill) against 8 (194, no spill; never timed), and
#            bwd_precond_diag's settings again now that it holds the chain rule (tuned at BK 8 before it did). (~500 s)
#            (precond_gdn / precond_kda against FLA: in the scalar / vector parts.)
#   scalar:  the scalar FLA systems with profiles and accuracy, then the scalar variants.          (~450 s)
#   vector:  the vector FLA systems with profiles, then the vector variants.                         (~550 s)
# Usage: bash benchmarks/runs/2026-12-05_run97.sh pdn|scalar|vector   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
nvidia-smi --query-gpu=name --format=csv,noheader
case "$1" in
pdn)
  timeout 100 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda --dtype bf16 2>&1 | q | tail -3
  timeout 200 python3 benchmarks/bench_fla.py --systems --variants --variant-specs gdn pgdn kda pkda --reps 5 --profile \
      --json $OUT/run97_pdn_variants.json 2>&1 | q | grep "^variants"
  timeout 80 python3 benchmarks/tune.py pgdn --stages bwd_key_grads --configs 64,64,4,1 64,64,8,1 \
      --json $OUT/run97_tune_pgdn_kg.json 2>&1 | q | tail -2
  timeout 110 python3 benchmarks/tune.py pgdn --stages bwd_precond_diag --configs 8,64,4,2 8,64,2,2 8,64,1,2 16,64,4,2 \
      --json $OUT/run97_tune_pgdn_bpd.json 2>&1 | q | tail -2
  ;;
scalar)
  timeout 280 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy \
      --json $OUT/run97_scalar.json 2>&1 | q | tail -8
  timeout 250 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 5 --profile \
      --json $OUT/run97_scalar_variants.json 2>&1 | q | grep "^variants"
  ;;
vector)
  timeout 250 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda dplr --reps 5 --profile \
      --json $OUT/run97_vector.json 2>&1 | q | tail -8
  timeout 300 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile \
      --json $OUT/run97_vector_variants.json 2>&1 | q | grep "^variants"
  ;;
*) echo "usage: $0 pdn|scalar|vector"; exit 2 ;;
esac
echo "== done"
