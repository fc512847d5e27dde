#!/usr/bin/env bash
# Run 78: varlen KDA again, cu_seqlens now read once per tensor (run 77: 1.79 ms forward against 0.92 for the same
# tokens in uniform rows: a device-to-host read of the offsets in every forward and in the backward's rerun), with
# run 77's FLA cache (its varlen kernels autotuned) restored; then the vector table (the state pass at BV 64) and the
# vector variants. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
xz -d < .fla_varlen/fla_tc_varlen.tar.xz | tar -C /tmp/fla_tc -xf -
echo "== varlen kda"
timeout 150 python3 benchmarks/bench_fla.py --systems kda --varlen 8 --reps 5 --profile --json $OUT/run78_varlen.json 2>&1 | grep -v -i warn | tail -3
echo "== vector table"
timeout 200 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --reps 3 --profile --json $OUT/run78.json 2>&1 | grep -v -i warn | tail -6
echo "== vector variants"
timeout 150 python3 benchmarks/bench_fla.py --systems --variants vector --reps 3 --profile --json $OUT/run78_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== done"
