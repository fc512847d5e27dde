#!/usr/bin/env bash
# Run 80 (the session's last device time): (1) CCQ's corr kept from the forward (split products there), the
# backward's dλ reading it: GPU checks; (2) the small-batch launch settings (few sequences × heads: the state pass at
# BV 32 / 3 stages, the fused state pass + output and the reverse pass at BV 16), which the checks' B = 2 now take;
# (3) the scalar variants with profiles; (4) gdn and simple_gla at the 32k shape. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 110 python3 benchmarks/check_gpu_grads.py --systems ccq_gdn ccq_gla ccq_gdn_uncentered gdn simple_gla pgdn deltanet --dtype bf16 2>&1 | grep -v -i warn | tail -8
echo "== scalar variants"
timeout 90 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run80_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== 32k"
timeout 90 python3 benchmarks/bench_fla.py --shape 1 32768 16 128 --systems gdn simple_gla --reps 3 --profile --json $OUT/run80_32k.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
