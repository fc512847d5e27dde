#!/usr/bin/env bash
# Run 61: the scalar table next to FLA and FlashQLA at this session's head (the PDN statistic's 128-row steps change
# precond_gdn; the other scalar kernels are unchanged since runs 47-55), per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
# FlashQLA's stack (tilelang, apache-tvm-ffi, z3-solver, torch-c-dlpack-ext, flash-qla) unpacked from one xz archive
fq="${TMPDIR:-/tmp}/dgps_device/fqla"
mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
echo "== scalar table"
timeout 540 python3 benchmarks/bench_fla.py --systems gdn delta_rule simple_gla precond_gdn --profile --json $OUT/run61.json 2>&1 | grep -v -i warn | tail -8
echo "== done"
