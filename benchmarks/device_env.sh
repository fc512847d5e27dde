# Source on the H200 lent by the workplace (no network): wheels carried in .whl/, FLA's Triton cache in .bench/.
#   . benchmarks/device_env.sh && python3 benchmarks/bench_fla.py --profile --json benchmarks/latest.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
mkdir -p /tmp/pkg /tmp/fla_tc && ln -sfn "$PWD" /tmp/pkg/dgps
export PYTHONPATH=/tmp/site:/tmp/pkg PYTHONUNBUFFERED=1
[ -f .bench/fla_triton_cache_h200.tar.xz ] && xz -d < .bench/fla_triton_cache_h200.tar.xz | tar -C /tmp/fla_tc -xf -
export TRITON_CACHE_DIR=/tmp/fla_tc TRITON_STORE_BINARY_ONLY=1 FLA_CACHE_RESULTS=1 FLA_DISABLE_BACKEND_DISPATCH=1
export DGPS_CACHE_DIR=/tmp/dgps_cache
