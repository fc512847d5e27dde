#!/usr/bin/env bash
# Run 77: varlen KDA next to FLA (8 ragged sequences, 16384 tokens; never timed: FLA's varlen kernels compile and
# autotune for minutes, past run 66's 170 s), then kda at the reference shape (the state pass at BV 64). FLA's grown
# Triton cache comes back under $OUT (fla_tc_varlen.tar.xz) for later runs. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== varlen kda"
timeout 400 python3 benchmarks/bench_fla.py --systems kda --varlen 8 --reps 5 --json $OUT/run77_varlen.json 2>&1 | grep -v -i warn | tail -4
tar -C /tmp/fla_tc -cf - . | xz -6 -T8 > $OUT/fla_tc_varlen.tar.xz
echo "== kda"
timeout 90 python3 benchmarks/bench_fla.py --systems kda --reps 5 --profile --json $OUT/run77_kda.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
