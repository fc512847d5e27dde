#!/usr/bin/env bash
# Run 74 (the session's last device time): launch sweeps where a kernel stands above its base: simple_gla's fused
# state pass + output (forward 1.04x FLA's), cler_h_kda's output and bwd_grads (0.19 / 1.13 ms against kda_l2norm's
# 0.11 / 1.00); then simple_gla next to FLA with the sweep's best state_output (DGPS_LAUNCH; simple_gla alone in that
# process). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== tune"
timeout 100 python3 benchmarks/tune.py simple_gla --stages state_output --json $OUT/tune_sg.json --configs 64,32,4,2 64,16,4,2 64,32,4,3 64,32,8,2 128,32,4,2 64,64,8,2 2>&1 | grep -v -i warn | tail -4
timeout 90 python3 benchmarks/tune.py cler_h_kda --stages output --json $OUT/tune_ck_out.json --configs 64,128,4,3 64,64,4,2 64,64,4,3 64,128,8,2 128,64,4,2 2>&1 | grep -v -i warn | tail -4
timeout 80 python3 benchmarks/tune.py cler_h_kda --stages bwd_grads --json $OUT/tune_ck_grads.json --configs 32,64,4,1 32,64,8,1 64,64,8,1 32,32,4,1 2>&1 | grep -v -i warn | tail -4
echo "== simple_gla at the sweep's best"
best=$(python3 -c "import json; print(','.join(map(str, json.load(open('$OUT/tune_sg.json'))['state_output']['config'])))" 2>/dev/null)
echo "state_output=$best"
[ -n "$best" ] && DGPS_LAUNCH="state_output=$best" timeout 60 python3 benchmarks/bench_fla.py --systems simple_gla --json $OUT/run74_sg.json 2>&1 | grep -v -i warn | tail -3
echo "== done"
