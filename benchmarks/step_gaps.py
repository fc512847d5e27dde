"""Where a training step's wall clock goes beyond its kernels: the GPU timeline of one forward+backward, its idle gaps.

    . benchmarks/device_env.sh && python3 benchmarks/step_gaps.py --systems gdn kda [--fla] [--sync-check]
                                      [--specs ccq_gdn ...]

Both sides are called through FLA's signatures on bench_fla.py's inputs (reference shape). For each system the step is
warmed up, then traced once with torch.profiler (CUDA activity): the printout is the step's span on the GPU, the
time its kernels, memsets and copies cover, and the largest idle gaps with the operations on either side. A gap
means the GPU waited on the host: a synchronising call, or a host that enqueues slower than the GPU runs. With
CPU activity recorded too, the profiler's own host cost swamped the gaps (run 60: gdn's step spanned 6.0 ms for 1.6 ms
of kernels, FLA's 3.9); it now records CUDA activity only (not yet run that way). do_bench's wall clock against the
kernel sum is the check on what it shows.
`--specs` traces library specs (the variants, which FLA lacks) as bench_fla.py's `--variants` times them: their own
package's forward on random_inputs. `--sync-check` also runs one step under torch.cuda.set_sync_debug_mode("warn"),
which names every call that synchronises the host with the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

import dgps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fla import calls, fla_module, fwd_bwd, make_inputs, variant_spec  # noqa: E402

GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


def gpu_timeline(step, path: Path) -> list[tuple[float, float, str]]:  # noqa: ANN001
    """(start µs, end µs, name) of every GPU operation of one call of `step`, in start order."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    # CUDA activity only: recording every CPU op as well inflated the host time it means to expose (run 60)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    ops = [(e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
           if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    return sorted(ops)


def summarise(ops: list[tuple[float, float, str]], top: int) -> dict:
    span = ops[-1][1] - ops[0][0]
    busy, gaps, end, prev = 0.0, [], ops[0][0], ""
    for s, e, name in ops:
        if s > end:
            gaps.append((s - end, prev, name))
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
        prev = name[:60]
    gaps.sort(reverse=True)
    return {"span_us": span, "busy_us": busy, "idle_us": span - busy, "ops": len(ops),
            "gaps": [(round(g, 1), a, b[:60]) for g, a, b in gaps[:top]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="*", default=["gdn"])
    p.add_argument("--specs", nargs="*", default=[], help="library specs, through their package (no FLA side)")
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--fla", action="store_true", help="trace FLA's step too")
    p.add_argument("--sync-check", action="store_true")
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    import dgps.fla_compat as dgps_fla

    sides = {"dgps": calls(dgps_fla)}
    if a.fla:
        sides["fla"] = calls(fla_module())
    tmp = Path(tempfile.mkdtemp())
    B, T, H, D = a.shape
    runs = [(system, side, fns[system], make_inputs(system, *a.shape)) for system in a.systems
            for side, fns in sides.items()]
    for spec in a.specs:
        rec = dgps.load(variant_spec(spec))
        pkg = dgps.compile(rec)
        runs.append((spec, "dgps", lambda xx, pkg=pkg: pkg.forward(**xx).o,
                     rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda", on_device=True)))
    for system, side, fn, x in runs:
        do = torch.randn_like(x["v"])
        step = fwd_bwd(fn, x, do)
        for _ in range(3):
            step()
        r = summarise(gpu_timeline(step, tmp / f"{system}_{side}.json"), a.top)
        print(f"{system:12s} {side:5s} span {r['span_us'] / 1e3:.3f} ms, busy {r['busy_us'] / 1e3:.3f}, "
              f"idle {r['idle_us'] / 1e3:.3f} over {r['ops']} GPU ops", flush=True)
        for g, before, after in r["gaps"]:
            print(f"    gap {g:8.1f} us  after {before}  before {after}")
        if a.sync_check and side == "dgps":
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step()
                    torch.cuda.synchronize()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [str(w.message).splitlines()[0] for w in seen if "synchroniz" in str(w.message).lower()]
            print(f"    synchronising calls in one step: {len(syncs)}", *syncs[:5], sep="\n      ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
