#!/usr/bin/env bash
# Run 136 (thirty-second session): the training forward compiles its backward's lists with its own (_warm_step).
#   cold:  (~150 s, carry .whl) gdn's cold start. First one threads round as run 135 left the machine (no bytecode for
#          site-packages: this device runs Python with dont_write_bytecode), then `compileall` over the pipeline's
#          dependencies and two interleaved rounds of threads and fork. Prediction (H100): the forward keeps run 135's
#          ~3.2-3.7 s (one wait for the slowest of all eleven kernels, which was the forward's already), the backward
#          4.2 -> ~1.5 s (loading six compiled kernels, ~0.2 s each, and its launches); with bytecode, threads 13.5 ->
#          ~11 s, fork 12.0 -> ~9.5 s (its children no longer each hash Triton's files). Run 135 also compiled fp32
#          variants of bf16 buffers in the backward's warm (fixed at 0a3540d), so its launches compiled again.
#   check: (~100 s) GPU gradients against float64 for gdn, cler_h_gdn, pgdn, ccq_gdn, kda (bf16): the changed host
#          path (rerun launched after the backward's buffers are planned; lists built at the forward) must leave every
#          error as in run 132 (gdn ~4.0e-3, pgdn 4.28e-3, ccq_gdn 4.34e-3).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run136.sh cold|check   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
q() { grep -v -i warn; }
cold() {
  timeout 60 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 1 \
      --cold-start-modes threads --json $OUT/run136_cold_nobytecode.json 2>&1 | q | tail -2
  SP=$(python3 -c "import sympy, os; print(os.path.dirname(os.path.dirname(sympy.__file__)))")
  python3 -m compileall -q -j 16 $SP/sympy $SP/mpmath $SP/networkx $SP/jinja2 $SP/markupsafe \
      "${TMPDIR:-/tmp}/dgps_device/site" . >/dev/null 2>&1
  timeout 150 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 2 \
      --cold-start-modes threads fork --json $OUT/run136_cold.json 2>&1 | q | tail -3
}
check() {
  timeout 200 python3 benchmarks/check_gpu_grads.py --systems gdn cler_h_gdn pgdn ccq_gdn kda --dtype bf16 2>&1 | q | tail -30
}
"${1:-cold}"
echo "== done"
