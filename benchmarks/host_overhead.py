"""Host-side cost of a forward call, dgps against FLA, through the same FLA signatures.

A forward is host-bound when the Python work and kernel launches of one call take longer than its kernels:
then its wall clock is the host time, whatever the kernels cost. This script measures, per system,

- the wall clock at a tiny shape (B=1, T=256), where the kernels take a few µs: ≈ the host time per call;
- the wall clock and the CUDA kernel sum at the reference shape (torch.profiler), so the gap is visible;
- with --cprofile, where dgps's host time goes (cProfile over 200 tiny calls, top functions by own time).

    . benchmarks/device_env.sh && python3 benchmarks/host_overhead.py --systems kda gdn --cprofile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fla import calls, fla_module, make_inputs  # noqa: E402


def kernel_sum_ms(f, x) -> float:  # noqa: ANN001
    from torch.profiler import ProfilerActivity, profile

    f(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        f(x)
        torch.cuda.synchronize()
    total = 0.0
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", 0) or 0
        if ev.device_type.name == "CUDA" or t > 0:
            total += t
    return total / 1000


def main() -> int:
    import triton.testing

    import dgps.fla_compat as dgps_fla

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=["kda", "gdn"])
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128])
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    sides = {"dgps": calls(dgps_fla), "fla": calls(fla_module())}
    result: dict = {}
    for system in args.systems:
        row: dict = {}
        tiny = make_inputs(system, 1, 256, args.shape[2], args.shape[3])
        full = make_inputs(system, *args.shape)
        for side, fns in sides.items():
            f = fns[system]
            f(tiny), f(full)
            torch.cuda.synchronize()
            row[f"{side}_tiny_ms"] = triton.testing.do_bench(lambda f=f: f(tiny), warmup=20, rep=200,
                                                             return_mode="median")
            row[f"{side}_full_ms"] = triton.testing.do_bench(lambda f=f: f(full), warmup=10, rep=100,
                                                             return_mode="median")
            row[f"{side}_full_kernels_ms"] = kernel_sum_ms(f, full)
        print(system, json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
        if args.cprofile:
            f = sides["dgps"][system]
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                f(tiny)
            pr.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
            print(s.getvalue()[:6000], flush=True)
        result[system] = row
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
