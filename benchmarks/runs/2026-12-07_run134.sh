#!/usr/bin/env bash
# Run 134 (written in the thirty-first session, for the next device call).
#   sections: (~120 s, carry .whl) the route-fed rerun of cler_h_gdn's state pass (one product per step, R loaded;
#             run 133: 0.150 ms, as gdn's two-product rerun) at other launch settings than the residual route's row of
#             the table (BV 64 / 4 stages, swept in run 83 for the form with E, L and Z tiles): 2 and 3 stages, and BV
#             32 (256 programs) at 3. Run 75 found BV 64 / 4 stages best for gdn's rerun (0.110 against BV 32 / 2
#             stages' 0.145), so the prediction is modest: a setting within ±0.01 ms, or BV 32 / 3 stages -0.02 if
#             the one-product step leaves room for a second program per SM. gdn's rerun at the same settings as a
#             control.
#   tables:   (~550 s, carry .whl .bench .fqla) the scalar table with FlashQLA and accuracy, then the vector table:
#             on an H200 these replace latest.json's H200 rows (which predate runs 88-133).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run134.sh sections|tables   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
sections() {
  for s in cler_h_gdn gdn; do
    timeout 120 python3 benchmarks/kernel_sections.py --system "$s" --kernel chunk_state_pass_kernel \
        --set num_stages=2 num_stages=3 BV=32,grid0=4,num_stages=3 --rounds 5 2>&1 | q | tail -5
  done
}
tables() {
  if [ -f .fqla/flashqla_site.tar.xz ]; then
    fq="${TMPDIR:-/tmp}/dgps_device/fqla"
    mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
    export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
  fi
  timeout 330 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run134_scalar.json 2>&1 \
      | q | tail -8
  timeout 200 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run134_vector.json 2>&1 | q | tail -6
}
"${1:-sections}"
echo "== done"
