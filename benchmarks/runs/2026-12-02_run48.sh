#!/usr/bin/env bash
# Run 48: the cold start with the launchers built in the compile pool (serial and threads, with a phase breakdown),
# and where the host time of a tiny training step goes (cProfile), gdn and simple_gla. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== cold start"
timeout 150 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 2 --cold-start-modes 0 threads --json $OUT/cold48.json 2>&1 | grep -A3 "cold start"
echo "== host"
timeout 200 python3 benchmarks/host_overhead.py --systems simple_gla gdn --cprofile --breakdown --json $OUT/host48.json 2>&1 | grep -v -i warn | head -150
echo "== done"
