#!/bin/bash
# Run 147 (thirty-sixth session): the chunk form at BKF 32 for every per-channel spec (codegen/launch.py), with the
# solve's block indices formed where they are stored (compile report: no spill at 32 in kda, gla, gdn2, pkda).
#   sweep: chunk_form_block.py at 16 / 32, to check the index change against run 146's 32 (kda fwd 0.927, gla 0.557,
#     gdn2 0.955, pkda 1.227): prediction equal within 2 % or faster (fewer live registers).
#   vector: the vector table (bench_fla.py): prediction against run 145 (same H100 kind): kda fwd 1.027 -> ~0.95
#     (0.86-0.88x FLA), gla 0.618 -> ~0.56, gdn2 1.061 -> ~0.97, pkda 1.342 -> ~1.25; steps -0.06 to -0.09 ms.
#   variants: the vector variants against their bases (pkda / kda, ccq_gla / gla_l2norm, clvr / cler_h_kda).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run147.sh [sweep] [vector] [variants]  (carry .whl .bench)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
sweep() {
  timeout 200 python3 benchmarks/chunk_form_block.py kda gla gdn2 precond_kda --widths 16 32 --reps 5 \
      --json $OUT/run147_bkf.json 2>&1 | grep -v -i warn | tail -6
}
vector() {
  timeout 240 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run147_vector.json 2>&1 | grep -v -i warn | tail -8
}
variants() {
  timeout 300 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --json $OUT/run147_variants.json 2>&1 \
      | grep -v -i warn | tail -12
}
for s in ${@:-sweep vector}; do $s; done
echo "== done"
