#!/usr/bin/env bash
# Run 84: the PDN statistic as a decay-matrix product (one tf32x3 product per chunk, forward and reverse; the decay
# adjoint from the decayed part as formed) in place of the tuple scan (~100 instructions per element, runs 51-59).
# (1) GPU checks, bf16 and fp32, and at B = 4, H = 16 (run 83's wide settings: pgdn's reverse pass, cler_h_gdn's
# state pass); (2) the statistic's kernels swept over BK / warps; (3) precond_gdn next to FLA and the scalar variants,
# with profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 90 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda pdn --dtype bf16 2>&1 | grep -v -i warn | tail -4
timeout 60 python3 benchmarks/check_gpu_grads.py --systems pgdn --dtype fp32 2>&1 | grep -v -i warn | tail -1
timeout 90 python3 benchmarks/check_gpu_grads.py --systems pgdn cler_h_gdn --B 4 --H 16 --dtype bf16 2>&1 | grep -v -i warn | tail -3
echo "== tune the statistic"
timeout 100 python3 benchmarks/tune.py pgdn --stages precond_diag bwd_precond_diag --json $OUT/tune_pdn.json --configs 16,64,4,2 32,64,4,2 16,64,8,2 32,64,8,2 64,64,8,2 2>&1 | grep -v -i warn | tail -2
echo "== precond_gdn and the scalar variants"
timeout 200 python3 benchmarks/bench_fla.py --systems precond_gdn --variants scalar --reps 3 --profile --json $OUT/run84.json 2>&1 | grep -v -i warn | grep -E "^variants|precond_gdn  "
echo "== done"
