"""One forward+backward step per system and side, inside cudaProfilerStart/Stop, for Nsight Compute.

    ncu --clock-control none --profile-from-start off -k regex:'chunk_interaction|...' \
        --section SpeedOfLight --section WarpStateStats --csv \
        python3 benchmarks/ncu_step.py --systems kda [--fla] [--specs ccq_gdn]

Inputs, signatures and sides are those of bench_fla.py; each side runs once before profiling (compile, autotune),
so that ncu sees only the profiled step's kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
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
    p.add_argument("--specs", nargs="*", default=[], help="library specs (the variants FLA lacks), through dgps.compile")
    args = p.parse_args()
    B, T, H, D = args.shape
    for spec in args.specs:
        import dgps

        rec = dgps.load(str(Path(__file__).resolve().parent.parent / "specs" / f"{spec}.dgps"))
        pkg = dgps.compile(rec)
        xs = {k: v.requires_grad_(True)
              for k, v in rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda").items()}
        dos = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")

        def spec_step(pkg=pkg, xs=xs, dos=dos) -> None:  # noqa: ANN001
            pkg.forward(**xs).o.backward(dos)

        _profiled(spec_step, f"{spec} dgps")
    impls = {"dgps": calls(dgps_fla)}
    if args.fla:
        impls["fla"] = calls(fla_module())
    for system in args.systems:
        x = make_inputs(system, B, T, H, D)
        do = torch.randn_like(x["v"])
        for side, c in impls.items():
            _profiled(fwd_bwd(c[system], x, do), f"{system} {side}")
    return 0


def _profiled(step: Callable[[], None], what: str) -> None:
    """One warm-up call, then one call between cudaProfilerStart and Stop."""
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {what}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
