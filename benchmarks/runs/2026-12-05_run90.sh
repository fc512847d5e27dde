#!/usr/bin/env bash
# Run 90 (written in the seventeenth session when its device time ran out): what changed after runs 88/89 and is not
# timed. pkda's kernels are the sequential PDN statistic again (the chunk-parallel one reverted after run 88) and
# ccq_gla's curvature passes run at 4 warps (bwd_curvature_key at 8 for per-channel decay: 4 warps spill 16 B there).
# One device call (~400 s): GPU checks, ccq_gla's bwd_curvature_key at 4 / 8 warps and BV 32 (185 registers, no
# spill; BV 32 faulted for bwd_curvature_query in run 88: see whether bwd_curvature_key's passes the check too),
# then the vector variants with profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
timeout 80 python3 benchmarks/check_gpu_grads.py --systems pkda ccq_gla ccq_gla_uncentered --dtype bf16 2>&1 | q | tail -4
DGPS_LAUNCH="bwd_curvature_key=64,32,4,1" timeout 60 python3 benchmarks/check_gpu_grads.py --systems ccq_gla --dtype bf16 2>&1 | q | tail -1
timeout 90 python3 benchmarks/tune.py ccq_gla --stages bwd_curvature_key --configs 64,64,8,1 64,64,4,1 64,32,4,1 --json $OUT/run90_tune_ck.json 2>&1 | q | tail -2
timeout 330 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run90_vec.json 2>&1 | q | grep "^variants"
echo "== done"
