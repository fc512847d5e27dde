#!/usr/bin/env bash
# Run 106 (twenty-fourth session): cler_h_gdn is 1.11x gdn (H100, run 101; target 1.10). Where its step's extra time
# sits (run 101, ms, cler_h_gdn / gdn): the fused state pass + output 0.302 / 0.224, the backward's state pass rerun
# 0.209 / 0.149, bwd_state 0.337 / 0.292, bwd_solve 0.320 / 0.283. Compile report (sm_90, dk = dv = 128): the route's
# state_output at the shipped BV 32 / 4 warps / 2 stages spills 56 B at 255 registers (gdn's 8 B); BV 16 none, 8 warps 8 B.
# Prediction: state_output at BV 16 within +-10 % of BV 32 (twice the programs, half the tiles), the rerun's state
# pass at 3 stages within 5 % of 4. A setting that saves >= 0.03 ms of the step meets the target; ship it in
# codegen/launch.py with the measurement.
# Part 2 below: pkda's direct dg.
# Usage: bash benchmarks/runs/2026-12-06_run106.sh a|b   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
a() {
timeout 200 python3 benchmarks/tune.py cler_h_gdn --stages state_output \
    --configs 64,32,4,2 64,16,4,2 64,32,8,2 64,16,4,3 --json $OUT/run106_state_output.json 2>&1 | grep -v -i warn | tail -6
timeout 120 python3 benchmarks/tune.py cler_h_gdn --stages state_pass \
    --configs 64,64,4,4 64,64,4,3 64,32,4,2 --json $OUT/run106_state_pass.json 2>&1 | grep -v -i warn | tail -5
timeout 120 python3 benchmarks/tune.py cler_h_gdn --stages bwd_solve \
    --configs 64,64,4,1 64,32,4,1 64,64,8,1 --json $OUT/run106_bwd_solve.json 2>&1 | grep -v -i warn | tail -5
# pkda's log-gate gradient stored by bwd_grads in the input dtype (compiler/plan.py direct_gate_input, as kda does),
# not as an fp32 [T, HV, dk] adjoint that bwd_inputs reads back (run 101: pkda bwd_inputs 0.210 ms, kda's 0.006).
# Compile report (sm_90, dk = 128): bwd_grads at BK 64 / 8 warps 255 registers, 0 -> 24 B spill. Prediction: 268 MB
# less traffic, bwd_inputs 0.21 -> ~0.16 ms, bwd_grads +0.00-0.03.
for k in chunk_bwd_grad_kernel chunk_bwd_inputs_kernel; do
  echo "== pkda $k (whole = shipped; patch = direct dg)"
  timeout 90 python3 benchmarks/kernel_sections.py --system pkda --kernel $k --rounds 5 \
      --patch dgps.compiler.plan.DIRECT_GATE_UNDER_DIAG=True 2>&1 | grep -v -i warn | tail -2
done
# bwd_curvature_key with its scores in a loop of their own before E k (twenty-fourth session): 255 registers, no spill
# at BV 64 / 4 warps (was 254 + 16 B), now shipped for ccq_gla too (was BV 32 / 4 warps: H100 run 95, 0.503 ms against
# the old BV 64 form's 0.423). Prediction: ccq_gla at BV 64 ~0.42 ms, BV 32 ~0.50; ccq_gdn's within 3 % of run 101's 0.416.
for s in ccq_gla ccq_gdn; do
  timeout 120 python3 benchmarks/tune.py $s --stages bwd_curvature_key --configs 64,64,4,1 64,32,4,1 \
      --json $OUT/run106_ckey_$s.json 2>&1 | grep -v -i warn | tail -3
done
echo "== done a"
}
b() {
# Spill-free settings the compile report finds (sm_90, dk = dv = 128), untimed: pgdn's interaction at BK 32 / 1 warp
# 223 registers, no spill (shipped BK 64 / 1 warp: 255 + 192 B), gdn's 212 / 0 (shipped 255 + 40 B). (bwd_key_grads at
# BK 32 / 4 warps, also spill-free, was timed in run 99: gdn 0.715 against 0.518 ms, pgdn faulted: not again.)
# Prediction: pgdn's interaction 0.160 -> ~0.12 ms (H100), gdn's within 10 % (1 warp already the fastest).
for s in pgdn gdn; do
  timeout 120 python3 benchmarks/tune.py $s --stages interaction --configs 64,64,1,1 32,64,1,1 32,64,2,1 \
      --json $OUT/run106_inter_$s.json 2>&1 | grep -v -i warn | tail -3
done
echo "== done b"
}
case "$1" in
a) a ;;
b) b ;;
*) echo "usage: $0 a|b"; exit 2 ;;
esac
