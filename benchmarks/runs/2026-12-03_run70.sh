#!/usr/bin/env bash
# Run 70: the PDN map's log on the SFU (_fast_log). GPU checks of the PDN specs (bf16, and pgdn in fp32: the fast log's
# own error), precond_gdn / precond_kda next to FLA with profiles, the scalar variants, then the PDN systems'
# full-size accuracy next to FLA. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 60 python3 benchmarks/check_gpu_grads.py --systems pgdn pkda pdn --dtype bf16 2>&1 | grep -v -i warn | tail -4
timeout 40 python3 benchmarks/check_gpu_grads.py --systems pgdn --dtype fp32 2>&1 | grep -v -i warn | tail -2
echo "== PDN systems"
timeout 130 python3 benchmarks/bench_fla.py --systems precond_gdn precond_kda --profile --json $OUT/run70.json 2>&1 | grep -v -i warn | tail -4
echo "== scalar variants"
timeout 110 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run70_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== accuracy"
timeout 100 python3 benchmarks/bench_fla.py --systems precond_gdn precond_kda --reps 1 --accuracy --json $OUT/run70_acc.json 2>&1 | grep -v -i warn | grep -i "accuracy\|error\|Trace" | tail -4
echo "== done"
