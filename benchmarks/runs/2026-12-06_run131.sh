#!/usr/bin/env bash
# Run 131 (twenty-ninth session): two latency-bound chunk-parallel kernels.
#  1. the wy stage with one program per block of columns (codegen/launch.py WY_COLUMN_PROGRAMS, off; grid kind
#     chunk_columns): compile report (gdn, dk = dv = 128) 118 -> 62 registers, 24 -> 16 KB shared, so 8 programs per
#     SM instead of 4, each one product and store instead of three. Prediction: gdn's wy 0.113 -> ~0.06 ms, kda's 0.159
#     -> ~0.09 (kernel_sections --patch: the module rendered with it, launched on its own recorded arguments).
#  2. the l2norm kernel (0.093 ms for q and k, ~67 MB: a fifth of HBM's rate) at fewer rows per program and other
#     warp counts. Prediction: BT 32 or 16 -0.02 to -0.04.
# Usage: bash benchmarks/runs/2026-12-06_run131.sh   (carry .whl; ~150 s)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
for s in gdn kda; do
  timeout 90 python3 benchmarks/kernel_sections.py --system $s --kernel chunk_wy_kernel \
      --patch dgps.codegen.launch.WY_COLUMN_PROGRAMS=True --rounds 5 2>&1 | q | tail -3
done
timeout 60 python3 benchmarks/kernel_sections.py --system gdn --kernel chunk_l2norm_kernel \
    --set num_warps=2 num_warps=8 BT=32,grid0=512 BT=16,grid0=1024 BT=32,grid0=512,num_warps=2 --rounds 5 2>&1 | q | tail -7
echo "== done"
