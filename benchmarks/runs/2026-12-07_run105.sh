#!/usr/bin/env bash
# Run 105 (written at the end of the twenty-third session for the next device window, which may be short: the
# twenty-third got ~9 minutes). One call each, most valuable first; every mode writes under $OUT.
#   first:   (~300 s) gdn2's bwd_intra at BK 64 / 2 warps without spill (twenty-third session, untimed; predicted
#            1.206 -> ~1.05 ms on an H100, step 4.04 -> ~3.89), GPU checks of gdn2 / kda / pgdn / pkda, the vector
#            table with accuracy, then run 104 (gla's scores in tf32x3: both sides in one process).
#   h200:    (~450 s, on an H200) the H200 tables at one commit: scalar and vector FLA tables with accuracy, both
#            variant families, FlashQLA next to gdn when .fqla/ is carried (see run 76); latest.json's H200 rows
#            predate runs 88-105.
#   repro:   (~360 s) the two Triton 3.6 sm_90 faults (benchmarks/repro/) plain, then under compute-sanitizer memcheck:
#            if they fault standalone, report upstream with the files.
# Usage: bash benchmarks/runs/2026-12-07_run105.sh first|h200|repro
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
nvidia-smi --query-gpu=name --format=csv,noheader
first() {
  timeout 140 python3 benchmarks/check_gpu_grads.py --systems gdn2 kda pgdn pkda ccq_gdn ccq_gla --dtype bf16 2>&1 | q | tail -8
  timeout 150 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run105_vector.json 2>&1 | q | tail -6
  # (run 104 ran here on 2026-12-06; its two patches are shipped since a0b578a, so it no longer applies)
}
h200() {
  if [ -f .fqla/flashqla_site.tar.xz ]; then
    fq="${TMPDIR:-/tmp}/dgps_device/fqla"
    mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
    export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
  fi
  bash benchmarks/runs/2026-12-06_run101.sh tables 2>&1 | q | tail -30
  # (twenty-fourth session) cold start again: last measured in run 59 (14.4 s, 11 kernels), since when kernels changed
  timeout 60 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 \
      --cold-start-modes threads --json $OUT/run105_cold.json 2>&1 | q | grep -A3 "cold start"
  timeout 60 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gla --dtype bf16 2>&1 | q | tail -3
}
case "$1" in
first) first ;;
h200) h200 ;;
repro) bash benchmarks/runs/2026-12-06_run101.sh repro ;;
*) echo "usage: $0 first|h200|repro"; exit 2 ;;
esac
echo "== done"
