#!/usr/bin/env bash
# Run 87 (fifteenth session): the curvature sums as a state pass of [BK, BV] tiles storing C_n (curvature_state),
# the keys' adjoint carry likewise (bwd_curvature_carry), and chunk-parallel curvature_query, bwd_curvature_query,
# bwd_curvature_key. GPU checks of the four CCQ specs; sweeps; the scalar variants with their profiles. Writes under
# $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 90 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gdn_uncentered ccq_gla ccq_gla_uncentered --dtype bf16 2>&1 | grep -v -i warn | tail -5
timeout 60 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn --B 4 --H 16 --HV 16 --T 300 --dtype bf16 2>&1 | grep -v -i warn | tail -1
echo "== sweeps"
timeout 200 python3 benchmarks/tune.py ccq_gdn --stages curvature_query bwd_curvature_query bwd_curvature_key --configs 64,64,8,1 64,64,4,1 64,64,8,2 64,128,8,1 64,32,4,1 64,32,4,2 --json $OUT/run87_tune_cq.json 2>&1 | grep -v -i warn | tail -16
timeout 120 python3 benchmarks/tune.py ccq_gdn --stages curvature_state bwd_curvature_carry --configs 64,64,4,2 64,64,4,1 64,64,4,3 64,32,4,2 64,64,8,2 --json $OUT/run87_tune_cs.json 2>&1 | grep -v -i warn | tail -8
echo "== scalar variants"
timeout 80 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run87_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== done"
