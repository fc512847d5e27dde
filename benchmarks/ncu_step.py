"""One forward+backward step per system and side, inside cudaProfilerStart/Stop, for Nsight Compute.

    ncu --clock-control none --profile-from-start off -k regex:'chunk_interaction|...' \
        --section SpeedOfLight --section WarpStateStats --csv python3 benchmarks/ncu_step.py --systems kda [--fla]

Inputs, signatures and sides are those of bench_fla.py; each side runs once before profiling (compile, autotune),
so that ncu sees only the profiled step's kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fla import calls, fla_module, fwd_bwd, make_inputs  # noqa: E402


def main() -> int:
    import dgps.fla_compat as dgps_fla

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=["gdn"])
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--fla", action="store_true", help="also profile FLA's step")
    args = p.parse_args()
    B, T, H, D = args.shape
    impls = {"dgps": calls(dgps_fla)}
    if args.fla:
        impls["fla"] = calls(fla_module())
    for system in args.systems:
        x = make_inputs(system, B, T, H, D)
        do = torch.randn_like(x["v"])
        for side, c in impls.items():
            step = fwd_bwd(c[system], x, do)
            step()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            step()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled {system} {side}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
