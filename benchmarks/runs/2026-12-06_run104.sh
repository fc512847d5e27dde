#!/usr/bin/env bash
# (Twenty-fourth session: ran as run 104, both patches then shipped in a0b578a; `git apply` now refuses them: a record.)
# Run 104 (prepared in the twenty-third session, not yet run: its device time was spent): does forming the additive
# family's output scores in three tf32 products bring gla's o error under FLA's?
# Hypothesis: gla's o error has sat 0.5 % above FLA's since run 26 (2.9812e-3 / 2.9664e-3 in run 101). FLA forms its
# diagonal 16 × 16 score blocks elementwise in fp32 and the off-diagonal ones in tf32; dgps's interaction forms the
# whole chunk's Q ⋆ A in one tf32 product (both operands rounded to 10 bits) before rounding it to bf16 for the
# output. The patch (2026-12-06_gla_scores_tf32x3.patch: `scores_mm` in chunk_interaction_vector.jinja) makes the
# additive family's score products tf32x3 (the delta family's L' tiles leave no registers: kda would spill 8 B).
# Compile report (sm_90, dk = 128): gla interaction 194 -> 206 registers, SASS 2160 -> 3176, MMA 30 -> 74, no spill.
# Prediction: gla o error 2.981e-3 -> ~2.95e-3 (below FLA's 2.966e-3), g unchanged (the scores feed the output and
# the local values' dv, not g); interaction 0.261 -> ~0.29-0.31 ms (H100).
# Usage: bash benchmarks/runs/2026-12-06_run104.sh   (writes under $OUT; both sides in one call, same machine)
. benchmarks/device_env.sh || exit 1
side() {
  timeout 150 python3 benchmarks/bench_fla.py --systems gla --reps 5 --profile --accuracy --json $OUT/run104_$1.json \
      2>&1 | grep -v -i warn | tail -3
  python3 -c "
import json, os
d = json.load(open(os.environ['OUT'] + '/run104_$1.json'))
a = d['accuracy']['gla']
print('$1', {k: (round(a['dgps'][k] * 1e3, 5), round(a['fla'][k] * 1e3, 5)) for k in a['dgps']})
print('$1', {k: round(v, 3) for k, v in d['profiles']['gla']['dgps'].items() if v > 0.05})"
}
side base
git apply benchmarks/runs/2026-12-06_gla_scores_tf32x3.patch && python3 -m dgps.codegen.generate | tail -1
side tf32x3
# (twenty-fourth session) the g gradient (+0.4 % over FLA's in run 101): bwd_intra's off-diagonal pair products in
# tf32x3 for the additive family too (2026-12-06_gla_intra_tf32x3.patch; compile report 255 -> 250 registers, SASS
# 2672 -> 3128, MMA 64 -> 96, no spill). Prediction: g 3.033e-3 -> ~3.01e-3, k / q a little lower, bwd_intra +0.02-0.04 ms
git apply benchmarks/runs/2026-12-06_gla_intra_tf32x3.patch && python3 -m dgps.codegen.generate | tail -1
side intra
echo "== done"
