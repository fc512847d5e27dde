#!/bin/bash
# Run 143 (thirty-fifth session): no zero states for states nobody gave (9c0ae01: S0_GIVEN / DS_FIN_GIVEN flags,
# runtime/reference.py zero_state), this tree against 1ea8a5d's (.ab/oldpkg/dgps, git archive, gdn only) in
# alternating processes, tiny shape (host time); then the reference-shape tables (scalar
# with FlashQLA, vector), accuracy: on an H200 these replace latest.json's H200 rows (run 134's script, never run).
#   prediction: tiny step -30 to -60 us (two [N,H,128,128] zero fills and their allocations gone, ~3-5 %);
#   reference shape unchanged on an H100 (kernel-bound), -0.03 to -0.06 ms on an H200 (host-bound).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run143.sh [ab] [scalar] [vector]  (carry .whl .ab .bench .fqla)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
ab() {
  new="$PYTHONPATH" old="${TMPDIR:-/tmp}/dgps_device/site:$PWD/.ab/oldpkg"
  q() { grep -v -i warn | grep "us per step" | sed "s|$PWD||"; }
  for i in 1 2 3; do
    PYTHONPATH="$old" timeout 100 python3 benchmarks/host_profile.py gdn --steps 300 2>&1 | q
    PYTHONPATH="$new" timeout 100 python3 benchmarks/host_profile.py gdn --steps 300 2>&1 | q
  done
}
scalar() {
  if [ -f .fqla/flashqla_site.tar.xz ]; then
    fq="${TMPDIR:-/tmp}/dgps_device/fqla"
    mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
    export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
  fi
  timeout 300 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run143_scalar.json 2>&1 \
      | grep -v -i warn | grep -v TileLang | tail -12
}
vector() {
  timeout 220 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run143_vector.json 2>&1 | grep -v -i warn | tail -8
}
for s in ${@:-ab scalar}; do $s; done
echo "== done"
