#!/usr/bin/env bash
# Run 68: why CCQ's training step takes ~0.75 ms more wall clock than its kernels (runs 60 and 67: ccq_gdn 4.584 /
# 3.852, ccq_gla 5.886 / 5.046; the other specs within 0.02): the GPU timeline's idle gaps and the synchronising
# calls of one step. Then cler_h_kda's reverse state pass at other launch settings (152 KB of shared memory at 2
# stages: one program per SM; 24 KB at 1 stage). Writes under $OUT.
. benchmarks/device_env.sh || exit 1
echo "== gaps"
timeout 200 python3 benchmarks/step_gaps.py --systems --specs gdn ccq_gdn ccq_gla --sync-check --top 6 2>&1 | grep -v -i warn | tail -40
echo "== tune cler_h_kda bwd_state"
timeout 300 python3 benchmarks/tune.py cler_h_kda --stages bwd_state --configs 64,32,4,2 64,32,4,1 64,32,8,1 64,64,4,1 64,64,8,1 64,16,4,2 64,16,4,1 --json $OUT/tune68.json 2>&1 | grep -v -i warn | tail -12
echo "== done"
