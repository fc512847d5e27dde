#!/usr/bin/env bash
# Run 76: the state pass at BV 64 / 4 warps / 4 stages (run 75's sweep; where the call has sequences × value heads
# enough for it) and simple_gla's fused state pass + output at 3 stages (run 74). GPU checks with the state pass
# forced to BV 64 (the checks' small batches would otherwise pick BV 32), then the scalar table next to FLA and
# FlashQLA, then the scalar variants. Writes under $OUT.
. benchmarks/device_env.sh || exit 1
fq="${TMPDIR:-/tmp}/dgps_device/fqla"
mkdir -p "$fq" && xz -d < .fqla/flashqla_site.tar.xz | tar -C "$fq" --strip-components=1 -xf -
export PYTHONPATH="$PYTHONPATH:$fq" TILELANG_CACHE_DIR="${TMPDIR:-/tmp}/dgps_device/tilelang"
echo "== checks (state_pass=64,64,4,4)"
DGPS_LAUNCH="state_pass=64,64,4,4" timeout 170 python3 benchmarks/check_gpu_grads.py --systems gdn pgdn kda deltanet simple_gla gdn2 ccq_gdn pkda --dtype bf16 2>&1 | grep -v -i warn | tail -9
echo "== scalar table"
timeout 260 python3 benchmarks/bench_fla.py --systems gdn delta_rule simple_gla precond_gdn --profile --json $OUT/run76.json 2>&1 | grep -v -i warn | grep -v -i tilelang | tail -7
echo "== scalar variants"
timeout 100 python3 benchmarks/bench_fla.py --systems --variants scalar --reps 3 --profile --json $OUT/run76_var.json 2>&1 | grep -v -i warn | grep "^variants"
echo "== done"
