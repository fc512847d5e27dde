"""The per-channel interaction's chunk-form key block (codegen/launch.py CHUNK_FORM_KEY_BLOCK, the kernel's BKF) swept
in one process: each system's forward and training step through FLA's signature (dgps.fla_compat, bench_fla.py's
inputs, whose gentle gates take the chunk form), one width after another in interleaved rounds, medians, and the
interaction kernel's own time (torch.profiler, one forward) at each width. Results are checked equal in shape and
close (relative 1e-2 in bf16) to the first width's, so a width that computes something else is not timed as faster.

    . benchmarks/device_env.sh && python3 benchmarks/chunk_form_block.py kda gla gdn2 precond_kda [--widths 16 32 64]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fla import calls, fwd_bwd, make_inputs  # noqa: E402


def _set_width(width: int) -> None:
    from dgps.codegen import launch
    from dgps.runtime import autotune

    launch.CHUNK_FORM_KEY_BLOCK = width
    # a changed launch setting, as a tune is: the generated hosts form their call geometries (and so their launch
    # lists and the launcher's compiled kernels per list) again
    autotune.forget()


def _interaction_ms(f) -> float:  # noqa: ANN001
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            f()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if "chunk_interaction" in e.key]
    return sum(e.device_time_total for e in ev) / 5 / 1e3 if ev else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("systems", nargs="+")
    p.add_argument("--widths", nargs="+", type=int, default=[16, 32, 64])
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    import dgps.fla_compat as dgps_fla

    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": a.shape, "systems": {}}
    for system in a.systems:
        x = make_inputs(system, *a.shape)
        fn = calls(dgps_fla)[system]
        fwd = functools.partial(fn, x)
        do = torch.randn_like(x["v"])
        first = None
        for w in a.widths:  # compile each width, check it against the first
            _set_width(w)
            with torch.no_grad():
                o = fwd().float()
            torch.cuda.synchronize()
            if first is None:
                first = o
            err = ((o - first).norm() / first.norm()).item()
            assert torch.isfinite(o).all() and err < 1e-2, (system, w, err)
        times: dict[str, list[float]] = {}
        for _ in range(a.reps):
            for w in a.widths:
                _set_width(w)
                with torch.no_grad():
                    times.setdefault(f"fwd_{w}", []).append(
                        triton.testing.do_bench(fwd, warmup=10, rep=60, return_mode="median"))
                step = fwd_bwd(fn, x, do)
                times.setdefault(f"step_{w}", []).append(
                    triton.testing.do_bench(step, warmup=5, rep=60, return_mode="median"))
        row = {k: statistics.median(v) for k, v in times.items()}
        for w in a.widths:
            _set_width(w)
            with torch.no_grad():
                row[f"interaction_{w}"] = _interaction_ms(fwd)
        out["systems"][system] = row
        print(system, " ".join(f"BKF {w}: fwd {row[f'fwd_{w}']:.3f} step {row[f'step_{w}']:.3f} "
                               f"interaction {row[f'interaction_{w}']:.3f} |" for w in a.widths), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
