#!/usr/bin/env bash
# Run 49: the cold start in its three modes with CUDA-free compile workers and pooled launcher builds (phase
# breakdown), then full sweeps of gdn's split backward (bwd_solve, bwd_key_grads), never swept before. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== cold start"
timeout 130 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --json $OUT/cold49.json 2>&1 | grep -A4 "cold start"
echo "== sweeps"
timeout 200 python3 benchmarks/tune.py gdn --stages bwd_solve bwd_key_grads --json $OUT/tune49.json 2>&1 | grep -v -i warn | tail -40
echo "== done"
