#!/usr/bin/env bash
# Run 135 (thirty-second session).
#   cold:   (~150 s, carry .whl) gdn's cold start (fresh process, empty caches, first forward+backward), threads mode
#           against the new fork mode (runtime/warmup.py: one forked child per kernel of a launch list, compiling for
#           the host's target into the on-disk cache while the host waits), two interleaved rounds. Prediction:
#           threads ~20 s as run 132 (forward 4.0, backward 7.5: Triton's passes hold the GIL, so the threads overlap
#           little); fork: forward ~2.0, backward ~2.5 (each list waits for its slowest kernel, ~1.5-2 s, and its
#           launcher), total ~13 s. And the backward now warms its rerun and all its segments at once (it compiled six
#           one-kernel lists in turn): threads backward 7.5 -> ~5 s, fork ~2 s; total fork ~10-11 s. The spec-compile phase now reports dgps's own import apart.
#   tables: run 134's tables (~550 s, carry .whl .bench .fqla).
# Usage: DGPS_COMMIT=<sha> bash benchmarks/runs/2026-12-07_run135.sh cold|tables   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
cold() {
  timeout 240 python3 benchmarks/bench_fla.py --systems --no-fla --cold-start --cold-start-rounds 2 \
      --cold-start-modes threads fork --json $OUT/run135_cold.json 2>&1 | grep -v -i warn | tail -8
  # what dgps's own import costs on this host (the cold starts above wrote its bytecode)
  python3 -X importtime -c "import torch; import dgps.runtime.compile" \
      2>&1 | sort -t'|' -k2 -n | tail -14
}
tables() { bash benchmarks/runs/2026-12-07_run134.sh tables; }
"${1:-cold}"
echo "== done"
