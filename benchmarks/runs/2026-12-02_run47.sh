#!/usr/bin/env bash
# Run 47 (eighth session's first device call): the cold start in its three compile modes on a machine doing nothing
# else, then the scalar table next to FLA and FlashQLA with the variants and per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== cold start"
timeout 120 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --json $OUT/cold47.json 2>&1 | grep "cold start"
# FlashQLA's stack (tilelang, apache-tvm-ffi, z3-solver, torch-c-dlpack-ext, flash-qla) unpacked from one xz archive
fq="${TMPDIR:-/tmp}/dgps_device/fqla"
mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" -xf -
export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
export DGPS_PARALLEL_COMPILE=threads
echo "== bench"
timeout 430 python3 benchmarks/bench_fla.py --systems gdn delta_rule simple_gla precond_gdn --variants scalar --profile --json $OUT/run47.json 2>&1 | grep -v -i warn | tail -14
echo "== done"
