#!/usr/bin/env bash
# Run 57: the per-channel kernels with the gates-bounded forms (compiler/plan.py VECTOR_DIAG_FORM, now "chunk"): the
# GPU check with gentle gates (every chunk on the chunk form) and plain ones (mostly the blocks form), kda's interaction
# and bwd_intra against "blocks" and "levels" in one process, then the vector table next to FLA with profiles.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 100 python3 benchmarks/check_gpu_grads.py --systems kda gdn2 gla --dtype bf16 --gate-scale 0.05 2>&1 | grep -v Warn | tail -4
timeout 60 python3 benchmarks/check_gpu_grads.py --systems kda --dtype bf16 2>&1 | grep -v Warn | tail -2
echo "== kda: chunk (the default) against blocks and levels"
for k in chunk_interaction_kernel chunk_bwd_intra_kernel; do
  timeout 60 python3 benchmarks/kernel_sections.py --system kda --kernel $k --patch dgps.compiler.plan.VECTOR_DIAG_FORM=blocks dgps.compiler.plan.VECTOR_DIAG_FORM=levels 2>&1 | grep -v -i warn | tail -4
done
echo "== vector systems"
timeout 220 python3 benchmarks/bench_fla.py --systems kda gdn2 gla precond_kda --profile --json $OUT/run57.json 2>&1 | grep -v -i warn | tail -7
echo "== done"
