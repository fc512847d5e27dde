#!/bin/bash
# Run 142 (thirty-fourth session): the launcher without Triton 3.6's empty hook chains and its Python __call__ frame
# (runtime/launcher.py: launch_hooks, _direct), this tree against 210748e's (.ab/oldpkg/dgps, git archive, gdn only)
# in alternating processes; then the gdn row with FlashQLA and accuracy (the direct launches are what every timed
# call after the first goes through, so --accuracy checks them on the GPU), and kda's row with accuracy.
#   prediction: tiny step -3 to -6 % (11 launches x ~5 us of 1.4 ms); reference-shape rows unchanged on an H100
#   (kernel-bound), -0.03 to -0.1 ms on an H200 (host-bound); every error as run 134's.
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run142.sh   (carry .whl .ab .bench .fqla)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
new="$PYTHONPATH" old="${TMPDIR:-/tmp}/dgps_device/site:$PWD/.ab/oldpkg"
q() { grep -v -i warn | grep "us per step" | sed "s|$PWD||"; }
for i in 1 2 3; do
  PYTHONPATH="$old" timeout 100 python3 benchmarks/host_profile.py gdn --steps 300 2>&1 | q
  PYTHONPATH="$new" timeout 100 python3 benchmarks/host_profile.py gdn --steps 300 2>&1 | q
done
if [ -f .fqla/flashqla_site.tar.xz ]; then
  fq="${TMPDIR:-/tmp}/dgps_device/fqla"
  mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
  export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
fi
timeout 260 python3 benchmarks/bench_fla.py --systems gdn --reps 5 --profile --accuracy --json $OUT/run142_gdn.json 2>&1 \
    | grep -v -i warn | grep -v TileLang | tail -12
timeout 120 python3 benchmarks/bench_fla.py --systems kda --reps 3 --accuracy --json $OUT/run142_kda.json 2>&1 \
    | grep -v -i warn | tail -8
echo "== done"
