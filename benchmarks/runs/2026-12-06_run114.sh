#!/usr/bin/env bash
# Run 114 (twenty-sixth session). On an H200: run 105's `h200` mode (the H200 tables at one commit, FlashQLA next
# to gdn, the cold start; latest.json's H200 rows predate runs 88-113). On an H100: gdn next to FLA and FlashQLA in
# one process (the issue's "within 1.5x FlashQLA" has only H200 numbers, from run 76's tree), with the profile.
# Mode `variants` (later in the session): on an H100, the scalar variants table instead (after the WY change).
# Usage: bash benchmarks/runs/2026-12-06_run114.sh [variants]   (carry .whl .bench .fqla; writes under $OUT)
. benchmarks/device_env.sh || exit 1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "$gpu"
if [[ "$gpu" == *H200* ]]; then
  bash benchmarks/runs/2026-12-07_run105.sh h200
  exit
fi
if [ "$1" = variants ]; then
  timeout 300 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile \
      --json $OUT/run117_variants.json 2>&1 | grep -v -i warn | grep -A12 "^variants"
  echo "== done"
  exit
fi
fq="${TMPDIR:-/tmp}/dgps_device/fqla"
mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
timeout 500 python3 benchmarks/bench_fla.py --systems gdn --reps 5 --profile --json $OUT/run114_gdn_fqla.json 2>&1 \
    | grep -v -i warn | tail -12
echo "== done"
