"""Sweep the launch settings of one compiled spec's chunk stages on the GPU; print the fastest per stage.

    python benchmarks/tune.py SPEC [--shape B T H D] [--stages interaction wy ...] [--json OUT]

The forward's output runs in the state pass's launch or in its own (`output`) as the package picks for the shape
(few sequences × heads: its own); DGPS_FUSE_OUTPUT=0 / 1 forces either.

Each stage's candidates (BK, BV, num_warps, num_stages) are set through the chunk module's
`LAUNCH_OVERRIDES`, one stage at a time, the others at their defaults; the stage's kernel time is the
profiler's CUDA time over one forward+backward (median of 3). A stage's sweep runs in its own process, so a
candidate that faults (Triton 3.6 emits some that do on sm_90) ends its process, and the sweep goes on with the
candidates after it in a new one; the result is written to `--json` and copied by hand into the launch table of
codegen/launch.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

KERNEL = {"l2norm": "chunk_l2norm_kernel", "chunk_cumsum": "chunk_cumsum_kernel", "interaction": "chunk_interaction_kernel",
          "wy": "chunk_wy_kernel", "state_pass": "chunk_state_pass_kernel", "output": "chunk_output_kernel",
          "state_output": "chunk_state_output_kernel",
          "precond_diag": "chunk_precond_diag_kernel", "curvature_query": "chunk_curvature_query_kernel",
          "bwd_state": "chunk_bwd_state_kernel", "bwd_local_values": "chunk_bwd_local_values_kernel",
          "bwd_grads": "chunk_bwd_grad_kernel", "bwd_scores": "chunk_bwd_scores_kernel", "bwd_intra": "chunk_bwd_intra_kernel",
          # the scalar- or no-decay delta family's split of bwd_grads: per chunk, then per key block (the same kernel name)
          "bwd_solve": "chunk_bwd_solve_kernel", "bwd_key_grads": "chunk_bwd_grad_kernel",
          "bwd_inputs": "chunk_bwd_inputs_kernel", "bwd_precond_diag": "chunk_bwd_precond_diag_kernel",
          "curvature_state": "chunk_curvature_state_kernel",  # the forward's, and the backward's bwd_curvature_sums
          "bwd_curvature_query": "chunk_bwd_curvature_query_kernel", "bwd_curvature_key": "chunk_bwd_curvature_key_kernel",
          "bwd_curvature_carry": "chunk_bwd_curvature_carry_kernel"}


def candidates(stage: str, D: int) -> list[tuple[int, int, int, int]]:
    full = max(16, 1 << (D - 1).bit_length())  # dk = dv = D here
    grid = {
        "l2norm": itertools.product([full], [64], [1, 2, 4, 8], [1]),
        "chunk_cumsum": itertools.product([full], [64], [1, 2, 4], [1]),
        "interaction": itertools.product([32, 64], [64], [2, 4, 8], [1]),
        "wy": itertools.product([64, full], [64], [2, 4, 8], [1, 2]),
        "state_pass": itertools.product([full], [16, 32, 64], [4, 8], [2, 3]),
        "output": itertools.product([64, full], [64, full], [4, 8], [2, 3]),
        # the state pass with the output fused in (scalar or no decay): two 64-row key tiles (the table's) or one
        "state_output": itertools.product(sorted({max(64, full // 2), full}), [16, 32, 64], [4, 8], [1, 2, 3]),
        # 4 warps only: 8 warps fault on sm_90 under Triton 3.6 (see codegen/launch.py)
        "bwd_state": itertools.product([full], [32, 64], [4], [1, 2, 3]),  # BV 16 faulted (run 2)
        "bwd_local_values": itertools.product([64, full], [32, 64, full], [4, 8], [1, 2]),
        "bwd_grads": itertools.product([32, 64, full], [32, 64], [4, 8], [1, 2]),
        "bwd_solve": itertools.product([64], [32, 64, full], [4, 8], [1, 2]),
        "bwd_key_grads": itertools.product([32, 64], [32, 64], [4, 8], [1, 2]),
        "bwd_scores": itertools.product([64], [32, 64], [4, 8], [1, 2]),
        "bwd_intra": itertools.product([16, 32, 64], [64], [2, 4, 8], [1]),
        "bwd_inputs": itertools.product([full], [full], [4, 8], [1, 2]),  # whole value rows (BV >= dv)
        # the PDN statistic splits over key-channel blocks (BK < dk: more programs, fewer live registers)
        "precond_diag": itertools.product([16, 32, 64, full], [64], [4, 8], [1]),
        "bwd_precond_diag": itertools.product([16, 32, 64, full], [64], [4, 8], [1]),
        # the curvature passes per chunk: BV columns of the dk × dk sums, key rows in one or two blocks of BK
        "curvature_query": itertools.product([max(16, full // 2), full], [32, 64, full], [4, 8], [1, 2]),
        "bwd_curvature_query": itertools.product([max(16, full // 2), full], [32, 64, full], [4, 8], [1, 2]),
        "bwd_curvature_key": itertools.product([max(16, full // 2), full], [32, 64, full], [4, 8], [1, 2]),
        # their carries: one [BK, BV] tile per program
        "curvature_state": itertools.product([32, 64], [32, 64], [4, 8], [1, 2, 3]),
        "bwd_curvature_carry": itertools.product([32, 64], [32, 64], [4, 8], [1, 2, 3]),
    }[stage]
    return [c for c in grid if c[0] <= full and c[1] <= full]


def sweep(spec: str, stage: str, shape: list[int], configs: list[tuple[int, int, int, int]] | None = None) -> None:
    """(child process) time every candidate of `stage`; one JSON line per candidate."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import dgps

    B, T, H, D = shape
    rec = dgps.load(str(ROOT / "specs" / f"{spec}.dgps"))
    pkg = dgps.compile(rec)
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda")
    x = {k: v.requires_grad_(True) for k, v in x.items()}
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")

    def step() -> None:
        for t in x.values():
            t.grad = None
        pkg.forward(**x).o.backward(do)

    launched = {name for name, _, _ in pkg.chunk._kernels() + pkg.chunk._bwd_kernels()}
    launched |= {name for name, _, _ in pkg.chunk._rerun_kernels(True) + pkg.chunk._rerun_kernels(False)}
    if hasattr(pkg.chunk, "_unfused_kernels") and not pkg.chunk._fuse_output(B * H, D, torch.device("cuda")):
        # the output in a launch of its own (few sequences × heads, or DGPS_FUSE_OUTPUT=0): its stage is swept too
        launched |= {name for name, _, _ in pkg.chunk._unfused_kernels()}
    if stage not in launched:  # e.g. bwd_grads of a spec that runs bwd_solve + bwd_key_grads: its overrides do nothing
        print(f"{spec} launches no stage {stage}", file=sys.stderr, flush=True)
        return
    for cfg in configs or candidates(stage, D):
        pkg.chunk.LAUNCH_OVERRIDES[stage] = cfg
        step()
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            times.append(sum(ev.self_device_time_total for ev in prof.key_averages() if ev.key == KERNEL[stage]) / 1e3)
        print(json.dumps({"stage": stage, "config": cfg, "ms": statistics.median(times)}), flush=True)


def _run_child(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def sweep_stage(spec: str, stage: str, shape: list[int], todo: list[tuple[int, int, int, int]]
                ) -> tuple[list[dict], list[tuple[tuple[int, int, int, int], str]]]:
    """Every candidate of `todo` timed in child processes, in order; a candidate that faults (Triton 3.6 emits some
    that do on sm_90, and a fault leaves the CUDA context unusable) ends its child, and a new child takes the
    candidates after it. Returns the timed rows and the faulted candidates with the child's last error line."""
    rows: list[dict] = []
    faulted: list[tuple[tuple[int, int, int, int], str]] = []
    empty = 0  # children in a row that timed nothing: two mean the stage itself fails, not a candidate
    while todo and empty < 2:
        cmd = [sys.executable, __file__, spec, "--shape", *map(str, shape), "--child", stage,
               "--configs", *(",".join(map(str, c)) for c in todo)]
        proc = _run_child(cmd)
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        rows += got
        empty = 0 if got else empty + 1
        if proc.returncode == 0 or len(got) >= len(todo):
            break
        err = proc.stderr.strip().splitlines()
        faulted.append((todo[len(got)], f"exit {proc.returncode}: {err[-1] if err else ''}"))
        todo = todo[len(got) + 1:]
    return rows, faulted


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec")
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128])
    p.add_argument("--stages", nargs="+", default=["interaction", "wy", "state_output", "state_pass", "output", "bwd_state",
                                                   "bwd_solve", "bwd_key_grads", "bwd_grads", "bwd_inputs"])
    p.add_argument("--json", default=None)
    p.add_argument("--configs", nargs="+", default=None, metavar="BK,BV,WARPS,STAGES",
                   help="only these candidates (every stage swept)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        configs = [tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs else None
        sweep(args.spec, args.child, args.shape, configs)
        return 0
    best: dict[str, dict] = {}
    for stage in args.stages:
        todo = ([tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs
                else candidates(stage, args.shape[3]))
        rows, faulted = sweep_stage(args.spec, stage, args.shape, todo)
        rows = [r for r in rows if r["ms"] > 0]
        for cfg, why in faulted:
            print(f"{stage}: candidate {list(cfg)} faulted ({why}); the sweep went on with the rest", flush=True)
        if rows:
            rows.sort(key=lambda r: r["ms"])
            best[stage] = {"config": rows[0]["config"], "ms": rows[0]["ms"], "all": rows}
            print(f"{stage}: best {rows[0]['config']} {rows[0]['ms']:.4f} ms; next "
                  + ", ".join(f"{r['config']} {r['ms']:.4f}" for r in rows[1:4]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(best, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
