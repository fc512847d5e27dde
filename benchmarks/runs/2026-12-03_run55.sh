#!/usr/bin/env bash
# Run 55: the cold start in the processes mode next to the default threads mode, the scalar variants' kernel sums
# (ccq_gdn's fused state pass + output), and the one-GPU context-parallel check (issue 12: 3 processes sharing the
# GPU, so a middle rank runs the transition passes). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== cold start"
timeout 120 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 --cold-start-modes processes threads --json $OUT/cold55.json 2>&1 | grep -A3 "cold start"
echo "== variants"
timeout 200 python3 benchmarks/bench_fla.py --systems --variants scalar --profile --json $OUT/run55_variants.json 2>&1 | grep -v -i warn | tail -4
echo "== cp, one GPU, 3 ranks"
timeout 150 python3 benchmarks/cp_one_gpu.py --systems gdn --world 3 2>&1 | grep -v -i warn | tail -12
echo "== done"
