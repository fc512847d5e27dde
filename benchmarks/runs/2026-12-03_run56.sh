#!/usr/bin/env bash
# Run 56 (run on the machine runs 53 and 55 left warm, as one inline command; recorded here as it ran): the vector
# table and variants with the per-block bounded form, set through a wrapper before any package was compiled (the
# default was still "levels" then; it is "chunk" since). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
cat > /tmp/bounded.py <<'PY'
import runpy, sys
import dgps.compiler.plan as P
P.VECTOR_DIAG_FORM = "blocks"  # called "bounded" in that commit
sys.argv = ["bench_fla.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench_fla.py", run_name="__main__")
PY
echo "== vector systems (bounded)"
timeout 250 python3 /tmp/bounded.py --systems kda gla gdn2 precond_kda --profile --json $OUT/run56.json 2>&1 | grep -v -i warn | tail -7
echo "== vector variants (bounded)"
timeout 230 python3 /tmp/bounded.py --systems --variants vector --profile --json $OUT/run56_variants.json 2>&1 | grep -v -i warn | tail -3
