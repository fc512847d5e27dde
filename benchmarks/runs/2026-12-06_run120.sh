# Run 120: an inference call's WY form inside the fused state pass + output (3c2400b), against the wy launch before it
# (plan_experiment --patch no_inference_wy), one process: GPU checks at a shape with many state programs (4 x 8 heads:
# the fused kernel runs), the reference shape, then B 1 T 32768 (few programs: both sides launch the same kernels).
. benchmarks/device_env.sh
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 benchmarks/plan_experiment.py gdn deltanet ccq_gdn clvr_gdn --patch no_inference_wy \
  --check-shape 4 300 8 128 --reps 5 --json "$OUT/run120_ref.json"
timeout 150 python3 benchmarks/plan_experiment.py gdn deltanet --patch no_inference_wy --check-dtypes \
  --shape 1 32768 16 128 --reps 5 --json "$OUT/run120_32k.json"
