#!/usr/bin/env bash
# Run 75: the forward and reverse state passes at BV 64 with deeper pipelines. FLA's own autotune records for the
# H200 (in ../shared/bench's cache) put its blockdim64 state pass at BV 64 / 4 warps / 3-4 stages 0.108-0.110 ms
# against 0.145-0.149 at BV 32 / 4 warps / 2 stages (dgps's table), and its reverse pass at BV 64 / 4 warps / 3
# stages 0.163-0.203 against 0.289-0.293. Sweeps for gdn and kda, then gdn next to FLA and FlashQLA at the sweep's
# best (DGPS_LAUNCH), with accuracy and profiles. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
fq="${TMPDIR:-/tmp}/dgps_device/fqla"
mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
echo "== tune gdn"
timeout 110 python3 benchmarks/tune.py gdn --stages state_pass bwd_state --json $OUT/tune_gdn.json --configs 64,32,4,2 64,64,4,3 64,64,4,4 64,32,4,3 64,64,4,2 2>&1 | grep -v -i warn | tail -6
timeout 80 python3 benchmarks/tune.py gdn --stages state_output --json $OUT/tune_gdn_so.json --configs 64,32,4,2 64,64,8,3 64,64,4,3 64,32,4,3 2>&1 | grep -v -i warn | tail -4
echo "== tune kda"
timeout 100 python3 benchmarks/tune.py kda --stages state_pass bwd_state --json $OUT/tune_kda.json --configs 64,32,4,2 64,64,4,3 64,64,4,4 64,32,4,3 2>&1 | grep -v -i warn | tail -6
echo "== gdn at the sweep's best"
launch=$(python3 - "$OUT" <<'PY'
import json, sys
parts = []
for f in ("tune_gdn.json", "tune_gdn_so.json"):
    try:
        d = json.load(open(f"{sys.argv[1]}/{f}"))
    except OSError:
        continue
    parts += [f"{s}={','.join(map(str, v['config']))}" for s, v in d.items()]
print(";".join(parts))
PY
)
echo "DGPS_LAUNCH=$launch"
DGPS_LAUNCH="$launch" timeout 200 python3 benchmarks/bench_fla.py --systems gdn --profile --accuracy --json $OUT/run75_gdn.json 2>&1 | grep -v -i warn | tail -12
echo "== done"
