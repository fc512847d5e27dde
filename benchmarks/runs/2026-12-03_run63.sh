#!/usr/bin/env bash
# Run 63: the additive family's bwd_grads at whole key rows (BK 128 / BV 64 / 8 warps, run 62's sweep): GPU checks of
# every spec it runs in, then simple_gla's row of the table next to FLA with profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== check"
timeout 150 python3 benchmarks/check_gpu_grads.py --systems simple_gla la retnet mamba2 --dtype bf16 2>&1 | grep -v Warn | tail -6
echo "== simple_gla"
timeout 200 python3 benchmarks/bench_fla.py --systems simple_gla --profile --json $OUT/run63.json 2>&1 | grep -v -i warn | tail -4
echo "== done"
