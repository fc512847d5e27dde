#!/bin/bash
# Run 140 (thirty-fourth session): a gdn training step's host time, this tree against fad74e7 (before the host
# changes of 2026-12-07's second half: check_inputs' seen signatures, the run's list key formed once, shared
# placeholders, the launcher's tensor key), in alternating processes: the runtime changed too, so host_ab.py (one
# process, one runtime) cannot compare them. `.ab/oldpkg/dgps` holds fad74e7's tree (git archive; gdn's package only).
#   prediction: the tiny step (B 1 T 256 H 2) -5 to -10 % (CPU, launches stubbed: 309 -> 288 us).
# Usage: bash benchmarks/runs/2026-12-07_run140.sh  (carry .whl .ab)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
new="$PYTHONPATH" old="${TMPDIR:-/tmp}/dgps_device/site:$PWD/.ab/oldpkg"
q() { grep -v -i warn | grep "us per step" | sed "s|$PWD||"; }
for shape in "1 256 2 128" "4 4096 16 128"; do
  steps=300; [ "${shape%% *}" = 4 ] && steps=60
  for i in 1 2 3; do
    PYTHONPATH="$old" timeout 100 python3 benchmarks/host_profile.py gdn --steps $steps --shape $shape 2>&1 | q
    PYTHONPATH="$new" timeout 100 python3 benchmarks/host_profile.py gdn --steps $steps --shape $shape 2>&1 | q
  done
done
timeout 100 python3 benchmarks/host_profile.py gdn --steps 300 --profile --top 40 2>&1 | grep -v -i warn | sed 's/ \+/ /g' \
    | cut -c1-150 | head -55
echo "== done"
