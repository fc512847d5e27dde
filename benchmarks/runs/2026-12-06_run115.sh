#!/usr/bin/env bash
# Run 115 (twenty-sixth session): the WY form inside the state passes against a wy launch of its own (plan_experiment
# --patch wy_launch: both packages in one process, errors against float64 at B 2 T 300 H 2 D 128, then times at the
# reference shape), then gdn next to FLA and FlashQLA (bench_fla, one process), with keep_states (keep_states_ab).
# Usage: bash benchmarks/runs/2026-12-06_run115.sh   (carry .whl .bench .fqla; writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
timeout 300 python3 benchmarks/plan_experiment.py gdn pgdn ccq_gdn --patch wy_launch --reps 5 --check-dtypes bf16 \
    --json $OUT/run115_wy.json 2>&1 | q | grep -v "^ *$" | cut -c1-220
fq="${TMPDIR:-/tmp}/dgps_device/fqla"
mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
timeout 200 python3 benchmarks/bench_fla.py --systems gdn delta_rule --reps 5 --profile --accuracy \
    --json $OUT/run115_fla.json 2>&1 | q | grep -v TileLang | tail -8
timeout 100 python3 benchmarks/keep_states_ab.py --systems gdn delta_rule precond_gdn --json $OUT/run115_keep.json 2>&1 | q | tail -5
echo "== done"
