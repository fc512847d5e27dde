# Source on the H200 lent by the workplace (no network): wheels carried in .whl/, FLA's Triton cache in .bench/.
#   . benchmarks/device_env.sh && python3 benchmarks/bench_fla.py --profile --json benchmarks/latest.json
# Scratch goes under $TMPDIR (default /tmp). FLA's cache must be unpacked at /tmp/fla_tc: Triton recorded that
# absolute path when the cache was built (see the bench cache's README).
scratch="${TMPDIR:-/tmp}/dgps_device"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$scratch/site" .whl/*.whl || return 1
mkdir -p "$scratch/pkg" /tmp/fla_tc && ln -sfn "$PWD" "$scratch/pkg/dgps"
export PYTHONPATH="$scratch/site:$scratch/pkg" PYTHONUNBUFFERED=1
[ -f .bench/fla_triton_cache_h200.tar.xz ] && xz -d < .bench/fla_triton_cache_h200.tar.xz | tar -C /tmp/fla_tc -xf -
export TRITON_CACHE_DIR=/tmp/fla_tc TRITON_STORE_BINARY_ONLY=1 FLA_CACHE_RESULTS=1 FLA_DISABLE_BACKEND_DISPATCH=1
export DGPS_CACHE_DIR="$scratch/dgps_cache"
# benchmarks time the shipped launch table (codegen/launch.py), not settings a `dgps tune` in this session recorded
# in $DGPS_CACHE_DIR/tuned; a run comparing the two sets DGPS_TUNED itself (benchmarks/tuned_ab.py)
export DGPS_TUNED=0
