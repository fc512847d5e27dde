#!/usr/bin/env bash
# Run 58 (right after run 57, on the same warm machine): the vector variants against kda and gla with the chunk form,
# with per-kernel profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
timeout 200 python3 benchmarks/bench_fla.py --systems --variants vector --profile --json $OUT/run58_variants.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
