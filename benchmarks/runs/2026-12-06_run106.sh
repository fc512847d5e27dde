#!/usr/bin/env bash
# Run 106 (twenty-fourth session): the session's untimed changes and spill-free settings, each against the shipped
# form in one process.
#   a: pkda's log-gate gradient stored by bwd_grads in the input dtype (compiler/plan.py direct_gate_input, as kda
#      does), not as an fp32 [T, HV, dk] adjoint that bwd_inputs reads back (run 101: pkda bwd_inputs 0.210 ms, kda's
#      0.006). Compile report (sm_90, dk = 128): bwd_grads at BK 64 / 8 warps 255 registers, 0 -> 24 B spill.
#      Prediction: 268 MB less traffic, bwd_inputs 0.21 -> ~0.16 ms, bwd_grads +0.00-0.03.
#      Then pgdn's k~ copy (KTILDE_COPY, shipped off: the interaction, output, bwd_local_values and bwd_solve read k~ rounded to the
#      input dtype, half the bytes; bitwise the same results, tests/test_pdn_steps.py). Compile report (sm_90, dk = 128):
#      interaction spill 192 -> 104 B, bwd_solve 8 -> 0 B, output 131 -> 115 KB shared. Prediction (H100 run 101 ->):
#      interaction 0.160 -> ~0.13, output 0.205 -> ~0.17, bwd_local_values 0.148 -> ~0.135, bwd_solve 0.343 -> ~0.32,
#      precond_diag +0.01-0.02 (the copy's store): pgdn's step -0.08 to -0.12 ms. Its cost: the copy is kept, a training
#      forward holds 293 -> 357 MiB (the step's peak unchanged, 1040 MiB: benchmarks/memory_trace.py).
#   b: bwd_curvature_key with its scores in a loop of their own before E k (26ae236): 255 registers, no spill at BV 64
#      / 4 warps (was 254 + 16 B), now shipped for ccq_gla too (was BV 32 / 4 warps: H100 run 95, 0.503 ms against the
#      old BV 64 form's 0.423). Prediction: ccq_gla at BV 64 ~0.42 ms, BV 32 ~0.50; ccq_gdn's within 3 % of run 101's
#      0.416. Then the interaction at BK 32 / 1 warp, spill-free: pgdn 211 registers with the k~ copy (shipped BK 64 /
#      1 warp: 255 + 104 B), gdn 212 (255 + 40 B). Prediction: pgdn's -10-20 %, gdn's within 10 % (1 warp already the
#      fastest).
#   (Not here, swept before: cler_h_gdn's state_output and state pass, run 93; bwd_solve, run 49; bwd_key_grads at
#   BK 32, run 99.)
# (A record: KTILDE_COPY and DIRECT_GATE_UNDER_DIAG were removed after this run; `a` no longer runs as written.)
# Usage: bash benchmarks/runs/2026-12-06_run106.sh a|b   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
q() { grep -v -i warn; }
nvidia-smi --query-gpu=name --format=csv,noheader
a() {
  for k in chunk_bwd_grad_kernel chunk_bwd_inputs_kernel; do
    echo "== pkda $k (whole = shipped; patch = direct dg)"
    timeout 90 python3 benchmarks/kernel_sections.py --system pkda --kernel $k --rounds 5 \
        --patch dgps.compiler.plan.DIRECT_GATE_UNDER_DIAG=True 2>&1 | q | tail -2
  done
  for k in chunk_interaction_kernel chunk_output_kernel chunk_bwd_local_values_kernel chunk_bwd_solve_kernel \
      chunk_precond_diag_kernel; do
    echo "== pgdn $k (whole = shipped, fp32 k~ only; patch = the k~ copy)"
    timeout 90 python3 benchmarks/kernel_sections.py --system pgdn --kernel $k --rounds 5 \
        --patch dgps.compiler.plan.KTILDE_COPY=True 2>&1 | q | tail -2
  done
  echo "== done a"
}
b() {
  for s in ccq_gla ccq_gdn; do
    timeout 120 python3 benchmarks/tune.py $s --stages bwd_curvature_key --configs 64,64,4,1 64,32,4,1 \
        --json $OUT/run106_ckey_$s.json 2>&1 | q | tail -3
  done
  for s in pgdn gdn; do
    timeout 120 python3 benchmarks/tune.py $s --stages interaction --configs 64,64,1,1 32,64,1,1 32,64,2,1 \
        --json $OUT/run106_inter_$s.json 2>&1 | q | tail -3
  done
  echo "== done b"
}
case "$1" in
a) a ;;
b) b ;;
*) echo "usage: $0 a|b"; exit 2 ;;
esac
