#!/usr/bin/env bash
# Run 99 (twenty-first session): the H200 tables at one commit (HEAD d5212fd's kernels: the PDN partials in
# [heads, blocks, T] rows and the same layout for every per-token partial sum), as run 97 on the H100 but without
# its sweeps. Predictions (NOTES, twenty-first session): ratios against FLA as run 97's H100 table within ~0.05;
# pgdn / gdn ~1.55x, pkda / kda ~1.30x; gdn's step unchanged by the dβ / db row layout (<= 0.01 ms).
#   scalar:  GPU checks of pgdn / pkda, the scalar FLA systems with profiles and accuracy, the scalar variants.
#   vector:  the vector FLA systems with profiles, then the vector variants (pkda, ccq_gla, ...).
#   variants: (no H200 lent: on an H100) GPU checks of pgdn / pkda, then the scalar and the vector variants with profiles
#            (the untimed changes: pkda's late erase key, every partial sum in [heads, blocks, T] rows, CLER's step
#            with a route gradient).
#   all:     one call for everything at one commit (after the direct gate gradient, 2nd half of the session): GPU
#            checks of the vector specs, the scalar and vector FLA tables with accuracy, both variant families.
#            Prediction for the direct gate gradient (bwd_grads stores the per-channel log gate's input gradient):
#            kda's bwd_inputs 0.071 -> ~0.01 ms and its step -0.05 to -0.08 ms; gla, gdn2, ccq_gla, cler_h_kda,
#            clvr_kda alike; pkda unchanged (not applied under a diagonal preconditioner).
#   tune:    pkda's bwd_intra. Its untied erase key is now loaded again where it is read instead of held across the
#            sub-block loop (4a-): compile report (sm_90, dk = 128, BK 32 / 2 warps) 223 -> 168 registers, kda's count.
#            Prediction: pkda's bwd_intra from ~1.41x kda's (1.548 / 1.098 ms, H100 run 98) to ~1.1-1.15x kda's in the
#            variants' profile (it still does the dE pairs), pkda / kda 1.31x -> ~1.24x. The sweep: BK 16 / 2 warps
#            (168), BK 32 / 4 warps, BK 64 / 4 warps, BK 16 / 4 warps around the shipped BK 32 / 2 warps.
#            And pkda's bwd_grads (shipped BK 64 / 8 warps, 255 registers; never timed for pkda): BK 32 / 4 warps (255
#            registers, no spill since the erase key loads late; kda's setting) and BK 32 / 8 warps (172, none). Prediction: BK 32 /
#            4 warps fastest by ~3 % (kda's run 20 order).
#            gdn's and pgdn's bwd_key_grads at BK 32 / 4 warps (compile report: gdn 178, pgdn 198 registers, no spill;
#            never timed) against the shipped BK 64 / 4 warps (255 + 32 B / 128 B spill): twice the value-side and c×c
#            loads for more resident programs. Prediction: within ±10 %, sign unknown.
#   fault:   the curvature query's BV 32 fault (runs 88 / 97: "illegal memory access"; in bounds under the interpreter's
#            checker, runtime/bounds.py): ccq_gdn at B1 T256 H2 D128 with bwd_curvature_query at BK 64 / BV 32 / 4 warps,
#            first plain (does it fault at this shape?), then under compute-sanitizer memcheck (which instruction).
# Usage: bash benchmarks/runs/2026-12-05_run99.sh scalar|vector|variants|all|tune|fault   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
nvidia-smi --query-gpu=name --format=csv,noheader
case "$1" in
scalar)
  timeout 100 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda --dtype bf16 2>&1 | q | tail -3
  timeout 250 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy \
      --json $OUT/run99_scalar.json 2>&1 | q | tail -8
  timeout 220 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 5 --profile \
      --json $OUT/run99_scalar_variants.json 2>&1 | q | grep "^variants"
  ;;
vector)
  timeout 250 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda dplr --reps 5 --profile \
      --json $OUT/run99_vector.json 2>&1 | q | tail -8
  timeout 300 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile \
      --json $OUT/run99_vector_variants.json 2>&1 | q | grep "^variants"
  ;;
variants)
  timeout 100 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda --dtype bf16 2>&1 | q | tail -3
  timeout 200 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 5 --profile \
      --json $OUT/run99_scalar_variants.json 2>&1 | q | grep "^variants"
  timeout 260 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile \
      --json $OUT/run99_vector_variants.json 2>&1 | q | grep "^variants"
  ;;
all)
  timeout 120 python3 benchmarks/check_gpu_grads.py --systems kda pkda gla gdn2 ccq_gla clvr_kda cler_h_kda pgdn \
      --dtype bf16 2>&1 | q | tail -10
  timeout 150 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run100_scalar.json 2>&1 | q | tail -6
  timeout 150 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run100_vector.json 2>&1 | q | tail -6
  timeout 150 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile \
      --json $OUT/run100_variants.json 2>&1 | q | grep "^variants"
  ;;
tune)
  timeout 200 python3 benchmarks/tune.py pkda --stages bwd_intra --configs 32,128,2,1 16,128,2,1 32,128,4,1 64,128,4,1 \
      16,128,4,1 --json $OUT/run99_tune_pkda_intra.json 2>&1 | q | tail -3
  timeout 150 python3 benchmarks/tune.py pkda --stages bwd_grads --configs 64,64,8,1 32,64,4,1 32,64,8,1 \
      --json $OUT/run99_tune_pkda_grads.json 2>&1 | q | tail -3
  for s in gdn pgdn; do
    timeout 100 python3 benchmarks/tune.py $s --stages bwd_key_grads --configs 64,64,4,1 32,64,4,1 \
        --json $OUT/run99_tune_${s}_kg.json 2>&1 | q | tail -2
  done
  ;;
fault)
  timeout 120 python3 benchmarks/launch_fault.py ccq_gdn --launch "bwd_curvature_query=64,32,4,1" 2>&1 | q | tail -4
  timeout 300 compute-sanitizer --tool memcheck --print-limit 4 python3 benchmarks/launch_fault.py ccq_gdn \
      --launch "bwd_curvature_query=64,32,4,1" > $OUT/run99_fault_memcheck.txt 2>&1
  grep -v -i warn $OUT/run99_fault_memcheck.txt | head -60
  ;;
*) echo "usage: $0 scalar|vector|variants|all|tune|fault"; exit 2 ;;
esac
echo "== done"
