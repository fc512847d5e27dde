#!/usr/bin/env bash
# Run 53 (ninth session's first device call): the GPU check of ccq_gdn's fused state pass + output (interpreter-checked
# only so far), then kda's, gdn2's and gla's interaction by sections and, with bwd_intra, in the bounded diagonal form
# (run 54 takes the vector table with whichever form wins). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 150 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gdn_uncentered --dtype bf16 2>&1 | grep -v Warn | tail -8
echo "== kda's interaction by sections"
timeout 120 python3 benchmarks/kernel_sections.py --system kda --kernel chunk_interaction_kernel --cut "-- levels s" "-- level 32" "-- level 64" "-- triangular_solve" "level 32: the inverses" --set BK=32 BK=64 KEEP=0 num_warps=8 maxnreg=168 maxnreg=128 --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -14
timeout 90 python3 benchmarks/kernel_sections.py --system gdn2 --kernel chunk_interaction_kernel --set maxnreg=168 --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -4
timeout 90 python3 benchmarks/kernel_sections.py --system gla --kernel chunk_interaction_kernel --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -3
echo "== bwd_intra, bounded diagonal blocks"
for s in kda gla gdn2; do timeout 80 python3 benchmarks/kernel_sections.py --system $s --kernel chunk_bwd_intra_kernel --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -3; done
echo "== done"
