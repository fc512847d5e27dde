#!/usr/bin/env bash
# Run 46 (seventh session's last device call): GPU checks of the new kernels, the scalar table and variants, the
# split backward's warps, the cold start in three compile modes, the PDN launch candidates. Writes under $OUT. Each
# step has its own timeout so that a slow one leaves the later ones their share.
. benchmarks/device_env.sh || exit 1
export DGPS_PARALLEL_COMPILE=threads
echo "== check (bwd_solve + bwd_key_grads, kept CCQ q̂)"
timeout 100 python3 benchmarks/check_gpu_grads.py --systems gdn pgdn ccq_gdn cler_h_gdn deltanet --dtype bf16 2>&1 | grep -v Warn | tail -6
echo "== bench"
timeout 130 python3 benchmarks/bench_fla.py --systems gdn precond_gdn --variants scalar --profile --json $OUT/run46.json 2>&1 | grep -v -i warn | tail -9
echo "== bwd_key_grads warps"
timeout 45 python3 benchmarks/tune.py gdn --stages bwd_key_grads --configs 64,64,4,1 64,64,8,1 2>&1 | grep best
echo "== cold start"
timeout 70 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --json $OUT/cold46.json 2>&1 | grep "cold start"
echo "== PDN candidates"
DGPS_LAUNCH="bwd_precond_diag=8,64,1,2;precond_diag=8,64,1,2" timeout 30 python3 benchmarks/check_gpu_grads.py --systems pgdn --dtype bf16 2>&1 | grep "^pgdn"
timeout 50 python3 benchmarks/tune.py pgdn --stages bwd_precond_diag precond_diag --configs 16,64,4,2 8,64,1,2 2>&1 | grep best
echo "== done"
