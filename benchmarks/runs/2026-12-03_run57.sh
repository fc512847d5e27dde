#!/usr/bin/env bash
# Run 57: the per-channel kernels with the gates-bounded forms (compiler/plan.py VECTOR_DIAG_FORM, now "chunk"):
# interaction and bwd_intra timed against "blocks" and "levels" in one process (kda, gdn2, gla), then the vector table
# next to FLA with profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== interaction and bwd_intra: chunk (the default) against blocks and levels"
for s in kda gdn2 gla; do for k in chunk_interaction_kernel chunk_bwd_intra_kernel; do
  timeout 70 python3 benchmarks/kernel_sections.py --system $s --kernel $k --patch dgps.compiler.plan.VECTOR_DIAG_FORM=blocks dgps.compiler.plan.VECTOR_DIAG_FORM=levels 2>&1 | grep -v -i warn | tail -4
done; done
echo "== vector systems"
timeout 250 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --profile --json $OUT/run57.json 2>&1 | grep -v -i warn | tail -7
echo "== done"
