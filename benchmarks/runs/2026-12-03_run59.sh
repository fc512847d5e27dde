#!/usr/bin/env bash
# Run 59 (tenth session): the PDN statistic's 256-row scan steps on the GPU (check, then the two kernels against
# 64 / 128 / 512-row steps and other warp counts, in one process), the cold start with the plan's stage order computed
# once and the harness's inputs drawn on the GPU, then run 58's checks of the vector variants. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check pdn family"
timeout 120 python3 benchmarks/check_gpu_grads.py --systems pgdn pdn pkda --dtype bf16 2>&1 | grep -v Warn | tail -5
echo "== pdn forward: 256-row steps against others"
P=dgps.compiler.plan.PDN_SCAN_ROWS
timeout 90 python3 benchmarks/kernel_sections.py --system pgdn --kernel chunk_precond_diag_kernel --patch $P=64 $P=128 $P=512 --set num_warps=8 num_warps=2 2>&1 | grep -v -i warn | tail -7
echo "== pdn backward"
timeout 90 python3 benchmarks/kernel_sections.py --system pgdn --kernel chunk_bwd_precond_diag_kernel --patch $P=64 $P=128 $P=512 --set num_warps=8 num_warps=2 2>&1 | grep -v -i warn | tail -7
echo "== cold start"
timeout 150 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --cold-start-modes threads processes --json $OUT/cold59.json 2>&1 | grep -A3 "cold start"
echo "== check vector variants, gentle gates"
timeout 90 python3 benchmarks/check_gpu_grads.py --systems pkda ccq_gla clvr_kda cler_h_kda --dtype bf16 --gate-scale 0.05 2>&1 | grep -v Warn | tail -5
echo "== done"
