#!/usr/bin/env bash
# Run 132 (written in the thirtieth session, which got no device time). WY_COLUMN_PROGRAMS is off in the shipped
# table (interpreter-verified both ways); `wy` and `sections` time it against the shipped form (--patch ...=True).
#   sections: (~150 s) wy with one program per block of columns vs one per chunk (kernel_sections --patch
#             ...WY_COLUMN_PROGRAMS=True is the new form): prediction gdn wy 0.113 -> ~0.06 ms, kda 0.159 -> ~0.09
#             (H100, run 130); the l2norm kernel at other rows per program / warps: prediction -0.02 to -0.04 ms.
#   scalar:   (~400 s, carry .whl .bench .fqla) GPU gradient checks of gdn/kda/cler_h_gdn/rwkv7_dplr (the shipped
#             launches; after a flip, the new wy), then the scalar FLA table with accuracy and FlashQLA next to gdn (its JIT ~90 s).
#   rest:     (~350 s, carry .whl .bench) the vector FLA table with accuracy, both variant families, cold start.
#   both:     sections, then gdn with FlashQLA and accuracy, then the other three scalar systems (~550 s).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-06_run132.sh wy|sections|scalar|rest|both   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
# FlashQLA's site (carried in .fqla/) on the path, when carried
flashqla() {
  if [ -f .fqla/flashqla_site.tar.xz ]; then
    fq="${TMPDIR:-/tmp}/dgps_device/fqla"
    mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
    export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
  fi
}
# one system's wy kernel: the shipped form and the per-column one, on the same recorded arguments
wy_of() {
  timeout 120 python3 benchmarks/kernel_sections.py --system "$1" --kernel chunk_wy_kernel \
      --patch dgps.codegen.launch.WY_COLUMN_PROGRAMS=True --rounds 5 2>&1 | q | tail -3
}
sections() {
  wy_of gdn
  wy_of kda
  timeout 60 python3 benchmarks/kernel_sections.py --system gdn --kernel chunk_l2norm_kernel \
      --set num_warps=2 num_warps=8 BT=32,grid0=512 BT=16,grid0=1024 BT=32,grid0=512,num_warps=2 --rounds 5 2>&1 \
      | q | tail -7
  # q's and k's tiles loaded together before either store (the guess: the stores, which may alias the next load's
  # input, keep that load behind the first round trip)
  timeout 60 python3 benchmarks/kernel_sections.py --system gdn --kernel chunk_l2norm_kernel \
      --sub benchmarks/runs/2026-12-06_run132_l2norm_sub.json --rounds 5 2>&1 | q | tail -4
  # the l2norm backward (bwd_inputs: 0.178 ms for ~400 MB, the fp32 adjoints of q and k) at other warp counts
  timeout 60 python3 benchmarks/kernel_sections.py --system gdn --kernel chunk_bwd_inputs_kernel \
      --set num_warps=4 num_warps=16 --rounds 5 2>&1 | q | tail -3
}
scalar() {
  flashqla
  timeout 100 python3 benchmarks/check_gpu_grads.py --systems gdn kda cler_h_gdn rwkv7_dplr --dtype bf16 2>&1 | q | tail -5
  timeout 420 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run132_scalar.json 2>&1 \
      | q | tail -8
}
rest() {
  timeout 150 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run132_vector.json 2>&1 | q | tail -6
  timeout 150 python3 benchmarks/bench_fla.py --systems --variants --reps 3 --profile \
      --json $OUT/run132_variants.json 2>&1 | q | grep "^variants"
  timeout 60 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 \
      --cold-start-modes threads --json $OUT/run132_cold.json 2>&1 | q | grep -A3 "cold start"
}
# one call when the device is scarce: the sections, gdn with FlashQLA (and accuracy), then the other scalar systems
both() {
  sections
  flashqla
  timeout 240 python3 benchmarks/bench_fla.py --systems gdn --reps 5 --profile --accuracy \
      --json $OUT/run132_gdn.json 2>&1 | q | tail -6
  timeout 200 python3 benchmarks/bench_fla.py --systems simple_gla delta_rule precond_gdn --reps 5 --profile \
      --accuracy --json $OUT/run132_scalar3.json 2>&1 | q | tail -6
}
# the smallest call that decides the flip: gdn's wy, the per-column form against the shipped one
wy() { wy_of gdn; }
case "$1" in
wy) wy ;;
both) both ;;
sections) sections ;;
scalar) scalar ;;
rest) rest ;;
*) echo "usage: $0 wy|sections|scalar|rest|both"; exit 2 ;;
esac
echo "== done"
