#!/usr/bin/env bash
# Run 62: simple_gla's backward launch settings swept (run 61: its kernels sum to 1.27 ms against FLA's 1.05; bwd_grads
# 0.608 against FLA's dqkwg 0.448, bwd_state 0.226 against dh 0.123, never tuned for the additive family), then the
# vector table next to FLA at this head (precond_kda's PDN statistic at 128-row steps), per-kernel profiles.
. benchmarks/device_env.sh || exit 1
echo "== tune simple_gla"
timeout 240 python3 benchmarks/tune.py simple_gla --stages bwd_grads bwd_state --json $OUT/tune62.json 2>&1 | grep -v -i warn | tail -6
echo "== vector table"
timeout 300 python3 benchmarks/bench_fla.py --systems kda gla gdn2 precond_kda --reps 3 --profile --json $OUT/run62.json 2>&1 | grep -v -i warn | tail -7
echo "== done"
