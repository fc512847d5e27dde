#!/usr/bin/env bash
# Run 62: the vector table next to FLA at this session's head (precond_kda's PDN statistic at 128-row steps; the
# others unchanged since run 57), per-kernel profiles, then full-size accuracy of kda against FLA. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== vector table"
timeout 330 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --profile --json $OUT/run62.json 2>&1 | grep -v -i warn | tail -8
echo "== accuracy"
timeout 200 python3 benchmarks/bench_fla.py --systems kda gdn2 --reps 1 --accuracy --json $OUT/run62_acc.json 2>&1 | grep -v -i warn | tail -8
echo "== done"
