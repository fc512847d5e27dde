#!/bin/bash
# Run 152 (prepared in the thirty-seventh session, not yet run): the launch table's forward settings for the per-channel
# family, swept where kda's and gdn2's forwards spend their time (run 151, H200: kda forward 0.840 ms = cumsum 0.072 +
# interaction with wy 0.520 + state pass 0.148 + output 0.108; the 0.8 goal asks 0.812).
#   interaction: the table's BK 16 (the levels' key block) at BV 64 / 4 warps against 2 and 8 warps and BV 32 / 128
#     (the fused wy tail's value blocks; `dgps tune` now sweeps around the table's BK, but its grid has BV 64 only,
#     so the configs are named here).
#   state_pass, output: tuning_candidates' grids (state pass: 128 programs at BV 64 — one per SM, latency-bound per
#     chunk step — against BV 32's 256).
#   prediction: the table's settings within 3 % of the best at each stage (the interaction was last swept before the
#     chunk form's key block and the fused wy tail); if a BV 32 state pass wins, by <= 0.02 ms per call.
# Usage: bash benchmarks/runs/2026-12-07_run152.sh [kda] [gdn2]   (carry .whl; ~60-90 s per spec after the start)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
for spec in ${@:-kda}; do
  timeout 200 python3 -m dgps.cli tune specs/$spec.dgps --stages interaction \
      --configs 16,64,4,1 16,128,4,1 16,64,8,1 16,128,8,1 16,64,2,1 16,32,4,1 2>&1 | grep -v -i warn | tail -12
  timeout 200 python3 -m dgps.cli tune specs/$spec.dgps --stages state_pass output 2>&1 | grep -v -i warn | tail -40
done
echo "== done"
