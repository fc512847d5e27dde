#!/usr/bin/env bash
# Run 83: (1) mamba2's bf16 GPU check against the commit before the split state passes (.prev/, bad55ba: mamba2's
# dt_bias showed 8.5e-3 in run 82, its first GPU check); (2) reverse-pass sweeps where FLA's own autotune records for
# its dhu kernel (bench cache: BV 64 / 4 warps / 3 stages best at two of its three keys) point past dgps's BV 32 / 2
# stages: gdn, deltanet, cler_h_gdn, pgdn; cler_h_gdn's state pass and output (route residual: never swept at BV 64);
# gla's split passes at the reference shape. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== mamba2 now / before"
timeout 60 python3 benchmarks/check_gpu_grads.py --systems mamba2 --dtype bf16 2>&1 | grep -v -i warn | tail -2
(export PYTHONPATH="$scratch/site:$PWD/.prev" DGPS_CACHE_DIR="$scratch/prev_cache"; cd .prev/dgps && timeout 60 python3 benchmarks/check_gpu_grads.py --systems mamba2 --dtype bf16 2>&1 | grep -v -i warn | tail -2)
C="64,32,4,2 64,32,4,3 64,64,4,2 64,64,4,3 64,64,4,4"
for s in gdn deltanet pgdn; do
  echo "== tune $s bwd_state"
  timeout 70 python3 benchmarks/tune.py $s --stages bwd_state --json $OUT/tune_${s}_bs.json --configs $C 2>&1 | grep -v -i warn | tail -1
done
echo "== tune cler_h_gdn"
timeout 150 python3 benchmarks/tune.py cler_h_gdn --stages state_pass bwd_state output bwd_local_values --json $OUT/tune_clerh.json --configs $C 64,128,4,2 64,128,4,3 2>&1 | grep -v -i warn | tail -4
echo "== tune gla split passes"
timeout 70 python3 benchmarks/tune.py gla --stages state_pass bwd_state --json $OUT/tune_gla.json --configs 64,32,4,2 64,32,4,3 64,64,4,3 64,64,4,4 2>&1 | grep -v -i warn | tail -2
echo "== done"
