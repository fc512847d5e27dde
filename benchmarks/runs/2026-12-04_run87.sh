#!/usr/bin/env bash
# Run 87 (written in the fifteenth session, which was lent no device: the next session's first run). Built and
# CPU-verified, not yet on a GPU: CCQ's curvature passes chunk-parallel (the sums and their adjoint as sequential
# passes of [BK, BV] tiles, C_n stored for every other chunk); CLER-H's residual route through the solve's form
# (docs/chunk_forms.md §8a: the output fused in the state pass for gdn, no route terms in either backward); and (the
# sixteenth session, also lent no device) the PDN statistic chunk-parallel (precond_state / precond_diag, bwd_precond_diag /
# bwd_precond_carry), and delta_rule's block merges as tf32x3 products. GPU checks of the CCQ, CLER and PDN specs; sweeps of the new or changed kernels; the scalar
# variants with their profiles. Writes under $OUT. Three device calls (each under the 600 s limit): `bash ...run87.sh
# checks`, then `... sweeps`, then `... pdn`, then `... vector` if device time is left.
. benchmarks/device_env.sh || exit 1
part=${1:-checks}
if [ "$part" = checks ]; then
echo "== checks"
timeout 90 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gdn_uncentered ccq_gla ccq_gla_uncentered --dtype bf16 2>&1 | grep -v -i warn | tail -5
timeout 60 python3 benchmarks/check_gpu_grads.py --systems cler_h_gdn cler_h_kda clvr_gdn deltanet gdn kda --dtype bf16 2>&1 | grep -v -i warn | tail -6
timeout 60 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn cler_h_gdn cler_h_kda --B 4 --H 16 --HV 16 --T 300 --dtype bf16 2>&1 | grep -v -i warn | tail -3
timeout 60 python3 benchmarks/check_gpu_grads.py --systems pgdn pdn pkda --dtype bf16 2>&1 | grep -v -i warn | tail -3
timeout 40 python3 benchmarks/check_gpu_grads.py --systems pgdn --dtype fp32 2>&1 | grep -v -i warn | tail -1
timeout 40 python3 benchmarks/check_gpu_grads.py --systems exact_atk longhorn --dtype bf16 2>&1 | grep -v -i warn | tail -2
echo "== scalar variants (before the sweeps: the table's settings)"
timeout 80 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run87_var.json 2>&1 | grep -v -i warn | grep "^variants"
fi
if [ "$part" = sweeps ]; then
echo "== sweeps"
timeout 150 python3 benchmarks/tune.py ccq_gdn --stages curvature_query bwd_curvature_query bwd_curvature_key --configs 64,64,8,1 64,64,4,1 64,64,8,2 64,128,8,1 64,32,4,1 --json $OUT/run87_tune_cq.json 2>&1 | grep -v -i warn | tail -12
timeout 90 python3 benchmarks/tune.py ccq_gdn --stages curvature_state bwd_curvature_carry --configs 64,64,4,2 64,64,4,1 64,64,4,3 64,32,4,2 64,64,8,2 --json $OUT/run87_tune_cs.json 2>&1 | grep -v -i warn | tail -6
timeout 90 python3 benchmarks/tune.py cler_h_gdn --stages state_output --configs 64,32,4,2 64,32,8,2 64,32,4,1 64,64,8,2 64,16,4,2 --json $OUT/run87_tune_clerh.json 2>&1 | grep -v -i warn | tail -4
echo "== delta_rule: the interaction's block merges as tf32x3 products (were IEEE fp32): sweep, then against FLA with accuracy"
timeout 60 python3 benchmarks/tune.py deltanet --stages interaction --configs 64,64,2,1 64,64,1,1 64,64,4,1 --json $OUT/run87_tune_dn.json 2>&1 | grep -v -i warn | tail -3
timeout 130 python3 benchmarks/bench_fla.py --systems delta_rule --reps 5 --profile --accuracy --json $OUT/run87_delta.json 2>&1 | grep -v -i warn | tail -4
fi
if [ "$part" = pdn ]; then
echo "== PDN statistic sweeps, then precond_gdn / precond_kda against FLA"
timeout 90 python3 benchmarks/tune.py pgdn --stages precond_diag --configs 32,64,4,1 16,64,4,1 64,64,4,1 32,64,2,1 64,64,8,1 --json $OUT/run87_tune_pd.json 2>&1 | grep -v -i warn | tail -5
timeout 90 python3 benchmarks/tune.py pgdn --stages bwd_precond_diag --configs 16,64,4,1 16,64,2,1 16,64,8,1 16,64,1,1 --json $OUT/run87_tune_bpd.json 2>&1 | grep -v -i warn | tail -5
timeout 100 python3 benchmarks/tune.py pgdn --stages precond_state --configs 16,64,2,2 16,64,1,2 8,64,1,2 32,64,2,3 16,64,2,1 --json $OUT/run87_tune_ps.json 2>&1 | grep -v -i warn | tail -5
timeout 60 python3 benchmarks/tune.py pgdn --stages bwd_precond_carry --configs 16,64,1,2 16,64,2,2 16,64,1,3 16,64,4,2 --json $OUT/run87_tune_pc.json 2>&1 | grep -v -i warn | tail -4
timeout 45 python3 benchmarks/tune.py pgdn --stages interaction --configs 64,64,1,1 64,64,2,1 64,64,4,1 --json $OUT/run87_tune_pint.json 2>&1 | grep -v -i warn | tail -3
timeout 200 python3 benchmarks/bench_fla.py --systems precond_gdn precond_kda --reps 5 --profile --accuracy --json $OUT/run87_pdn.json 2>&1 | grep -v -i warn | tail -6
fi
if [ "$part" = vector ]; then
echo "== vector variants (run 86 cut them at 80 s): checks of the changed ones, then the family against kda / gla"
timeout 60 python3 benchmarks/check_gpu_grads.py --systems pkda ccq_gla cler_h_kda --dtype bf16 2>&1 | grep -v -i warn | tail -3
timeout 45 python3 benchmarks/tune.py pkda --stages bwd_grads --configs 64,64,8,1 32,64,4,1 16,64,4,1 --json $OUT/run87_tune_pkg.json 2>&1 | grep -v -i warn | tail -3
timeout 45 python3 benchmarks/tune.py cler_h_kda --stages bwd_state --configs 64,64,8,2 64,64,4,2 64,32,4,2 --json $OUT/run87_tune_chs.json 2>&1 | grep -v -i warn | tail -3
timeout 400 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run87_vec.json 2>&1 | grep -v -i warn | grep "^variants"
fi
echo "== done"
