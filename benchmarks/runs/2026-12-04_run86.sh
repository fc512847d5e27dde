#!/usr/bin/env bash
# Run 86 (the session's last device time): GPU checks of the additive family without a stored U and of cler_h_kda's
# wide state pass; then, each to its own JSON so that a cut run keeps what finished: the scalar systems next to FLA
# at the reference shape, the scalar variants, the 32k shape, the vector systems, the vector variants. Writes under
# $OUT.
. benchmarks/device_env.sh || exit 1
echo "== checks"
timeout 60 python3 benchmarks/check_gpu_grads.py --systems simple_gla mamba2 gla --dtype bf16 2>&1 | grep -v -i warn | tail -4
timeout 60 python3 benchmarks/check_gpu_grads.py --systems cler_h_kda --B 4 --H 16 --HV 16 --T 300 --dtype bf16 2>&1 | grep -v -i warn | tail -1
echo "== scalar systems"
timeout 100 python3 benchmarks/bench_fla.py --systems gdn delta_rule simple_gla precond_gdn --reps 3 --profile --json $OUT/run86.json 2>&1 | grep -v -i warn | tail -5
echo "== scalar variants"
timeout 70 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run86_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== 32k"
timeout 70 python3 benchmarks/bench_fla.py --shape 1 32768 16 128 --systems gdn delta_rule simple_gla --reps 3 --profile --json $OUT/run86_32k.json 2>&1 | grep -v -i warn | tail -4
echo "== vector systems"
timeout 90 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --reps 3 --profile --json $OUT/run86_vec.json 2>&1 | grep -v -i warn | tail -5
echo "== vector variants"
timeout 80 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run86_vvar.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== done"
