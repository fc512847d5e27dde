#!/bin/bash
# Run 139 (thirty-fourth session): the host change of the thirty-third session (generated launch_config memoized,
# host _cdiv) timed on a GPU, then the gdn FLA-signature row with FlashQLA.
#   host: `host_ab.py gdn --against 2413cd0` (carry .whl .ab; `.ab` from `host_ab.py gdn --against 2413cd0 --export`)
#         prediction: tiny-shape step -5 to -10 %, full-shape wall -0.05 to -0.1 ms where host-bound.
#   fqla: bench_fla.py gdn with FlashQLA (carry .whl .bench .fqla): the 1.5x FlashQLA bound (run 134: 1.55x).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run139.sh host fqla   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
host() {
  timeout 200 python3 benchmarks/host_ab.py gdn --against 2413cd0 --reps 5 --json $OUT/run139_host.json 2>&1 | q | tail -4
}
fqla() {
  if [ -f .fqla/flashqla_site.tar.xz ]; then
    fq="${TMPDIR:-/tmp}/dgps_device/fqla"
    mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
    export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
  fi
  timeout 300 python3 benchmarks/bench_fla.py --systems gdn --reps 5 --profile --json $OUT/run139_gdn.json 2>&1 \
      | q | tail -8
}
for part in "${@:-host}"; do "$part"; done
echo "== done"
