#!/usr/bin/env bash
# Run 124 (twenty-eighth session): the shipped plan with KEEP_SCORES on (run 123: the scalar family's reverse pass
# reads the output's stored scores; the vector family's Q⋆A form stays off). GPU gradient checks of every spec that
# keeps the scores (bf16 and fp32), then the scalar FLA table with accuracy and FlashQLA next to gdn (carry .fqla),
# then the variant family.
# Usage: bash benchmarks/runs/2026-12-06_run124.sh   (carry .whl .bench .fqla; writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
if [ -f .fqla/flashqla_site.tar.xz ]; then
  fq="${TMPDIR:-/tmp}/dgps_device/fqla"
  mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
  export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
fi
for dt in bf16 fp32; do
  timeout 100 python3 benchmarks/check_gpu_grads.py --systems gdn deltanet gdn_fused_gate longhorn --dtype $dt 2>&1 \
      | q | tail -5
done
timeout 300 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run124_scalar.json 2>&1 | q | tail -8
timeout 150 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile \
    --json $OUT/run124_variants.json 2>&1 | q | grep "^variants"
echo "== done"
