"""Sweep the launch settings of one spec's chunk stages on the GPU; print the fastest per stage (for the shipped table).

    python benchmarks/tune.py SPEC [--shape B T H D] [--stages interaction wy ...] [--configs BK,BV,W,S ...] [--json OUT]

The sweep is `dgps tune`'s (runtime/autotune.py: every candidate in child processes, so one that faults ends only its
child; its results checked against the table setting's before it is timed; a stage's time the profiler's CUDA time
of its kernel over one training step, median of 3), without recording anything in the tuned-settings cache: what
it finds is copied by hand, with the measurement, into the launch table of codegen/launch.py. The forward's output
runs in the state pass's launch or in its own (`output`) as the package picks for the shape; DGPS_FUSE_OUTPUT=0 / 1
forces either.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec")
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--stages", nargs="+", default=None, help="default: every stage the spec launches at the shape")
    p.add_argument("--json", default=None)
    p.add_argument("--configs", nargs="+", default=None, metavar="BK,BV,WARPS,STAGES",
                   help="only these candidates (every stage swept), besides the table's own setting")
    args = p.parse_args()
    os.environ["DGPS_TUNED"] = "0"  # the table's settings are the reference, not a tuned file's
    import dgps
    from dgps.runtime.autotune import tune

    B, T, H, D = args.shape
    pkg = dgps.compile(dgps.load(str(ROOT / "specs" / f"{args.spec}.dgps")))
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs else None
    _, results = tune(pkg, (B, T, H, D, D), stages=args.stages, configs=configs, record=False,
                      log=lambda s: print(s, flush=True))
    best = {}
    for stage, r in results.items():
        timed = sorted((row for row in r["rows"] if "ms" in row), key=lambda row: row["ms"])
        best[stage] = {"config": r["config"], "ms": r["ms"], "table": r["table"], "table_ms": r["table_ms"],
                       "all": timed, "refused": [row for row in r["rows"] if "refused" in row], "faults": r["faults"]}
        print(f"{stage}: next " + ", ".join(f"{row['config']} {row['ms']:.4f}" for row in timed[1:4]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(best, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
