#!/bin/bash
# Run 144 (thirty-fifth session): CUDA graph capture of the generated packages, checked and timed.
#   tests/test_cuda_graphs.py: inference forward, training step (make_graphed_callables) and decode, captured and
#   replayed on new values, equal bit for bit to the eager calls (gdn, kda, simple_gla, pgdn, ccq_gdn, cler_h_gdn).
#   benchmarks/cuda_graphs.py gdn kda: eager against replayed, tiny training step, reference-shape step, decode token.
#   prediction: the capture works unchanged (the launcher takes the current stream per launch; the fixed-length path
#   reads nothing back to the host); tiny step ~1100-1300 -> ~100-200 us (kernel time only); decode token ~60-100 ->
#   ~10-20 us; reference-shape step unchanged on an H100 (kernel-bound: within 2 %).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run144.sh [lean]   (carry .whl)
#   lean: gdn and kda only (the tests' other specs and the layer left out), for a short device budget
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
f=tests/test_cuda_graphs.py
if [ "$1" = lean ]; then
  sel=(); for t in inference_forward training_step decode; do for s in gdn kda; do sel+=("$f::test_${t}_replays_as_eager[$s]"); done; done
  specs=(gdn)
else sel=("$f"); specs=(gdn kda); fi
timeout 330 python3 -m pytest -q -p no:cacheprovider -x "${sel[@]}" 2>&1 | grep -v -i warn | tail -25
timeout 240 python3 benchmarks/cuda_graphs.py "${specs[@]}" --rounds 5 --json $OUT/run144_graphs.json 2>&1 | grep -v -i warn | tail -12
echo "== done"
