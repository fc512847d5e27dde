#!/usr/bin/env bash
# Run 52: the cold start, processes mode (workers pre-import their chunk module, launchers without the active driver)
# next to the default threads mode, one round each. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
timeout 90 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --cold-start-modes processes threads --json $OUT/cold52.json 2>&1 | grep -A3 "cold start"
