#!/bin/bash
# Run 145 (thirty-sixth session): the H200 rows at HEAD, and CUDA graphs of a whole step.
#   scalar / vector: run 143's tables (benchmarks/bench_fla.py, FlashQLA beside gdn) on an H200, to replace run 134's
#     H200 rows (0ec3642), taken before the host-time work of sessions 34-35 (c3cea05 .. 9c0ae01).
#     prediction: run 134's gdn step 1.641 ms had a kernel sum of 1.37 ms (host-bound); the H100 hosts' tiny step went
#     1.9 -> ~1.15 ms since, so the H200 gdn step should fall to 1.40-1.45 ms and gdn / FlashQLA from 1.55x to
#     1.32-1.37x; kernel-bound rows (kda, gdn2, pkda steps) within 3 % of run 134's.
#   graphs: benchmarks/cuda_graphs.py gdn with the new train-whole case (torch.cuda.graph over static leaves) and FLA's
#     decode eager / replayed. prediction: train-whole at the reference shape = the kernel sum (~1.4 ms H200, ~1.85 H100),
#     below both eager and make_graphed_callables (which copies ~200 MB); FLA decode eager ~40-80 us, replayed ~4-6 us.
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run145.sh [scalar] [vector] [graphs]  (carry .whl .bench .fqla)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
scalar() {
  if [ -f .fqla/flashqla_site.tar.xz ]; then
    fq="${TMPDIR:-/tmp}/dgps_device/fqla"
    mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
    export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
  fi
  timeout 330 python3 benchmarks/bench_fla.py --reps 5 --profile --accuracy --json $OUT/run145_scalar.json 2>&1 \
      | grep -v -i warn | grep -v TileLang | tail -12
}
vector() {
  timeout 240 python3 benchmarks/bench_fla.py --systems gla kda gdn2 precond_kda --reps 5 --profile --accuracy \
      --json $OUT/run145_vector.json 2>&1 | grep -v -i warn | tail -8
}
graphs() {
  timeout 240 python3 benchmarks/cuda_graphs.py gdn --rounds 5 --json $OUT/run145_graphs.json 2>&1 | grep -v -i warn | tail -12
}
for s in ${@:-scalar}; do $s; done
echo "== done"
