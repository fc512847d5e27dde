#!/usr/bin/env bash
# Run 88 (seventeenth session): run 87's plan cut to the device time left (~27 min in three calls). Part `a`: GPU
# checks of every spec whose kernels changed since run 86 (CCQ's chunk-parallel curvature passes, CLER-H's solve form,
# the PDN statistic chunk-parallel, the tf32x3 no-decay merges), then delta_rule / precond_gdn / precond_kda against
# FLA with accuracy. Part `b`: the scalar variants with profiles, the fused state pass + output for pgdn (a plan
# experiment: benchmarks/plan_experiment.py) and the PDN kernels' sweeps. Part `c`: the vector variants.
. benchmarks/device_env.sh || exit 1
part=${1:-a}
q() { grep -v -i warn; }
if [ "$part" = a ]; then
echo "== checks (bf16, B2 T300 H2 HV4 D128)"
timeout 150 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gla cler_h_gdn cler_h_kda pgdn pdn pkda deltanet exact_atk gdn --dtype bf16 2>&1 | q | tail -11
timeout 60 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn cler_h_gdn pgdn --B 4 --H 16 --HV 16 --T 300 --dtype bf16 2>&1 | q | tail -3
timeout 40 python3 benchmarks/check_gpu_grads.py --systems pgdn --dtype fp32 2>&1 | q | tail -1
echo "== delta_rule, precond_gdn, precond_kda against FLA (accuracy, profile)"
timeout 280 python3 benchmarks/bench_fla.py --systems delta_rule precond_gdn precond_kda --reps 5 --profile --accuracy --json $OUT/run88_sys.json 2>&1 | q | tail -8
fi
if [ "$part" = b ]; then
echo "== scalar variants"
timeout 100 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 5 --profile --json $OUT/run88_var.json 2>&1 | q | grep "^variants"
echo "== pgdn: the output fused into the state pass (fp32 k̃ tile; run 40 NaN'd under Triton 3.6)"
timeout 150 python3 benchmarks/plan_experiment.py pgdn --patch fuse_output --reps 5 --json $OUT/run88_fuse_pgdn.json 2>&1 | q | tail -6
echo "== PDN sweeps"
timeout 70 python3 benchmarks/tune.py pgdn --stages precond_diag --configs 32,64,4,1 16,64,4,1 64,64,4,1 32,64,2,1 --json $OUT/run88_tune_pd.json 2>&1 | q | tail -3
timeout 70 python3 benchmarks/tune.py pgdn --stages bwd_precond_diag --configs 16,64,4,1 16,64,2,1 16,64,8,1 --json $OUT/run88_tune_bpd.json 2>&1 | q | tail -3
timeout 60 python3 benchmarks/tune.py pgdn --stages interaction --configs 64,64,1,1 64,64,2,1 64,64,4,1 --json $OUT/run88_tune_pint.json 2>&1 | q | tail -3
fi
if [ "$part" = c ]; then
echo "== vector variants"
timeout 400 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run88_vec.json 2>&1 | q | grep "^variants"
timeout 100 python3 benchmarks/tune.py deltanet --stages interaction --configs 64,64,1,1 64,64,2,1 64,64,4,1 --json $OUT/run88_tune_dn.json 2>&1 | q | tail -3
fi
echo "== done"
