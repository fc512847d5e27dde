# Run 123 (not run in the twenty-seventh session: no device time left): the output's scores kept for the reverse state
# pass (compiler/plan.py: _scores_kept, KEEP_SCORES off in the shipped plan: the patched side, `<spec>__keep_scores`)
# against the bwd_local_values launch (the shipped side), one process: GPU checks (bf16) at B 4 T 300 H 8
# D 128 (the fused forward runs), the reference shape with keep_states too; then B 1 T 32768 for gdn (the unfused
# pair stores the scores) if time is left.
. benchmarks/device_env.sh
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/plan_experiment.py gdn deltanet kda --patch keep_scores --keep-states \
  --check-shape 4 300 8 128 --check-dtypes bf16 --reps 5 --json "$OUT/run123_ref.json"
timeout 90 python3 benchmarks/plan_experiment.py gdn --patch keep_scores --check-dtypes \
  --shape 1 32768 16 128 --reps 3 --json "$OUT/run123_32k.json"
