#!/usr/bin/env bash
# Run 53 (ninth session's first device call): the GPU check of ccq_gdn's fused state pass + output (built in the eighth
# session, interpreter-checked only), then the cold start in the processes mode next to the default threads mode, then
# the scalar variants' kernel sums (does the fused ccq_gdn kernel cost what NOTES predicted?). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 150 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gdn_uncentered gdn --dtype bf16 2>&1 | grep -v Warn | tail -8
echo "== cold start"
timeout 120 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --cold-start-modes processes threads --json $OUT/cold53.json 2>&1 | grep -A3 "cold start"
echo "== variants"
timeout 200 python3 benchmarks/bench_fla.py --systems --variants scalar --profile --json $OUT/run53_variants.json 2>&1 | grep -v -i warn | tail -4

echo "== kda's interaction by sections"
timeout 120 python3 benchmarks/kernel_sections.py --system kda --kernel chunk_interaction_kernel --cut "-- levels s" "-- level 32" "-- level 64" "-- triangular_solve" "level 32: the inverses" --set BK=32 BK=64 KEEP=0 num_warps=8 maxnreg=168 maxnreg=128 --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -14
echo "== done"
timeout 90 python3 benchmarks/kernel_sections.py --system gdn2 --kernel chunk_interaction_kernel --set maxnreg=168 --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -4
timeout 90 python3 benchmarks/kernel_sections.py --system gla --kernel chunk_interaction_kernel --patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded 2>&1 | grep -v -i warn | tail -3
echo "== vector systems (decay_keys fused into the interaction)"
timeout 200 python3 benchmarks/bench_fla.py --systems kda gla gdn2 --profile --json $OUT/run53_vector.json 2>&1 | grep -v -i warn | tail -6
echo "== done2"
