#!/usr/bin/env bash
# Run 118 (twenty-sixth session): the WY form in the state passes at few sequences (B 1, T 32768, H 16, D 128: the
# output runs unfused there, after a standalone state pass, which pays for the form's extra product on its chain),
# both forms in one process; GPU gradient checks of every spec that takes the form (bf16 and fp32, GVA); then, on an
# H200 only, run 105's H200 tables.
# Usage: bash benchmarks/runs/2026-12-06_run118.sh   (carry .whl .bench .fqla; writes under $OUT)
. benchmarks/device_env.sh || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
q() { grep -v -i warn; }
timeout 200 python3 benchmarks/plan_experiment.py gdn deltanet --patch wy_launch --shape 1 32768 16 128 --reps 5 \
    --check-dtypes --keep-states --json $OUT/run118_32k.json 2>&1 | q | cut -c1-160
for dt in bf16 fp32; do
  timeout 120 python3 benchmarks/check_gpu_grads.py --systems gdn deltanet gdn_fused_gate clvr_gdn longhorn \
      --dtype $dt 2>&1 | q | tail -6
done
if [[ "$gpu" == *H200* ]]; then
  bash benchmarks/runs/2026-12-07_run105.sh h200
fi
echo "== done"
