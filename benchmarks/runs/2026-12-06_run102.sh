#!/usr/bin/env bash
# Not run as a whole: its `gen` and `tune` modes time the product form (PDN_SCAN_FORM), which 77a1ead removed after
# run 103 measured it; `forms` (benchmarks/pdn_forms.py) still runs.
# Run 102 (twenty-third session): Nsight Compute on the PDN statistic's two kernels, before restructuring them.
# Question: are chunk_precond_diag (0.18 ms, H100 run 99) and chunk_bwd_precond_diag (0.375 ms) bound by instruction
# issue (the NOTES' reading of run 59: the tuple scans' shuffles, 217 SHFL of the backward's 1664 SASS instructions,
# and the map's transcendentals), by latency (64 sequences × heads × 8-16 key-channel blocks, each sequential over 32
# steps), or by DRAM? Prediction: issue-active ≥ 60 % and DRAM throughput ≤ 40 % of peak for both (instruction-bound);
# if instead "stall long scoreboard" dominates the warp states and issue-active is low, latency is what to remove
# (more, chunk-parallel programs), not instructions.
# forms: benchmarks/pdn_forms.py, prototypes of the forward (the in-chunk scan as one tf32x3 product M X; a light
#        sequential carry pass + a chunk-parallel map pass) against the shipped kernel, same inputs, interleaved.
#        Prediction: if the shipped forward is instruction-bound, seq_dot BK16 ~0.6-0.7× its time; par_dot ~0.5×
#        (its map pass moves 192 MiB at full occupancy: ~0.06 ms on an H100, the carry ~0.02-0.03).
# gen:   the generated kernels with the product form (compiler/plan.py PDN_SCAN_FORM = "product", shipped in this
#        commit) against the tuple scan (--patch ...=tuple), same process, interleaved (kernel_sections.py).
#        Prediction (compile report, sm_90, dk 128: forward 183-199 registers, backward 230, no spill; SASS 1336 -> 1176
#        and 1664 -> 1888 static, but no shuffle scans): forward 0.18 -> ~0.12 ms, backward 0.375 -> ~0.25 (H100).
# tune:  the product form's launch settings (pgdn; BK 8-32, 2-4 warps).
# Usage: bash benchmarks/runs/2026-12-06_run102.sh ncu|forms|both|gen|tune   (writes under $OUT)
. benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
ncu_pdn() {
  timeout 300 ncu --clock-control none --profile-from-start off -k regex:'precond_diag' \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --csv \
      python3 benchmarks/ncu_step.py --systems precond_gdn > $OUT/run102_ncu_pdn.csv 2> $OUT/run102_ncu_pdn.err
  tail -3 $OUT/run102_ncu_pdn.err
  python3 - <<'PY'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/run102_ncu_pdn.csv")))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
cols = rows[head]
want = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "Issue Slots Busy",
        "Issued Warp Per Scheduler", "Achieved Occupancy", "Theoretical Occupancy", "Stall Long Scoreboard",
        "Stall Barrier", "Stall Short Scoreboard", "Stall Wait", "Stall Math Pipe Throttle", "Warp Cycles Per Issued Instruction",
        "Registers Per Thread", "Grid Size", "Block Size")
for r in rows[head + 1:]:
    d = dict(zip(cols, r))
    name, metric = d.get("Kernel Name", "")[:40], d.get("Metric Name", "")
    if any(w in metric for w in want):
        print(name, "|", metric, "|", d.get("Metric Value"), d.get("Metric Unit"))
PY
}
forms() {
  for prec in tf32x3 tf32; do
    timeout 100 python3 benchmarks/pdn_forms.py --reps 7 --prec $prec 2>&1 | grep -v -i warn | tail -20
    timeout 150 python3 benchmarks/pdn_forms.py --backward --reps 7 --prec $prec 2>&1 | grep -v -i warn | tail -12
  done
}
gen() {
  for k in chunk_precond_diag_kernel chunk_bwd_precond_diag_kernel; do
    for sys in pgdn pkda; do
      echo "== $sys $k"
      timeout 120 python3 benchmarks/kernel_sections.py --system $sys --kernel $k --rounds 5 \
          --patch dgps.compiler.plan.PDN_SCAN_FORM=tuple 2>&1 | grep -v -i warn | tail -3
    done
  done
}
tune() {
  timeout 200 python3 benchmarks/tune.py pgdn --stages precond_diag bwd_precond_diag \
      --configs 8,64,4,2 16,64,4,2 32,64,4,2 16,64,2,2 8,64,2,2 --json $OUT/run102_tune_pgdn.json 2>&1 | grep -v -i warn | tail -4
}
case "$1" in
gen) gen ;;
tune) tune ;;
ncu) ncu_pdn ;;
forms) forms ;;
both) forms; ncu_pdn ;;
*) echo "usage: $0 ncu|forms|both|gen|tune"; exit 2 ;;
esac
echo "== done"
