#!/usr/bin/env bash
# Run 111 (twenty-fifth session): `dgps tune` on the card that comes, then the tuned settings against the shipped
# table in one process (benchmarks/tuned_ab.py). On an H200 the H200 tables first (run 105's `h200` mode).
# Prediction (H100): the table was swept on an H200; the sequential state passes (state_output, bwd_state) are the
# likeliest to prefer other settings on the H100's lower bandwidth; gdn's step within 0-5 % of the table's.
# Usage: bash benchmarks/runs/2026-12-06_run111.sh [spec] [stages...]
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu"
spec=${1:-gdn}; shift
stages=${*:-state_output bwd_state bwd_key_grads bwd_solve}
case "$gpu" in
*H200*) [ "$spec" = gdn ] && [ -z "$H200_DONE" ] && bash benchmarks/runs/2026-12-07_run105.sh h200 ;;
esac
timeout 400 python3 -m dgps.cli tune specs/$spec.dgps --stages $stages 2>&1 | q | tail -40
timeout 150 python3 benchmarks/tuned_ab.py $spec --reps 5 --json $OUT/run111_ab_$spec.json 2>&1 | q | tail -20
mkdir -p $OUT/tuned && cp -r "$DGPS_CACHE_DIR/tuned/." $OUT/tuned/ 2>/dev/null
echo "== done"
