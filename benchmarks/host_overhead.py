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


def _per_call_us(f, n: int = 400) -> float:  # noqa: ANN001
    import time

    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def breakdown(system: str, H: int, D: int) -> dict[str, float]:
    """Host µs per call of each layer of the dgps forward at B=1, T=256 (kernels of a few µs, so host-bound)."""
    import dgps.fla_compat as dgps_fla
    import dgps.runtime.fla_compat as compat

    x = make_inputs(system, 1, 256, H, D)
    f = calls(dgps_fla)[system]
    seen: dict = {}
    run = compat._run

    def spy(fn, spec, inputs, **kw):  # noqa: ANN001, ANN202
        seen.update(spec=spec, inputs={n: t for n, t in inputs.items() if t is not None})
        return run(fn, spec, inputs, **kw)

    compat._run = spy
    f(x)
    compat._run = run
    pkg = compat.compiled(seen["spec"])
    inputs = seen["inputs"]
    chunk = pkg.chunk
    out = {"fla_compat": _per_call_us(lambda: f(x)), "pkg.forward": _per_call_us(lambda: pkg.forward(**inputs))}
    out["chunk_forward"] = _per_call_us(lambda: chunk.chunk_forward(inputs, initial_state=None))
    launch = chunk._Run.launch
    chunk._Run.launch = lambda self, kernels: None
    try:
        out["chunk_forward_without_launches"] = _per_call_us(lambda: chunk.chunk_forward(inputs, initial_state=None))
    finally:
        chunk._Run.launch = launch
    # one Triton launch alone, through JITFunction.__getitem__ (the path the package takes)
    captured: list = []

    def grab(self, kernels):  # noqa: ANN001, ANN202
        captured.append(kernels)
        return launch(self, kernels)

    chunk._Run.launch = grab
    orig_getitem = type(chunk.chunk_state_pass_kernel).__getitem__
    calls_seen: list = []

    def getitem(self, grid):  # noqa: ANN001, ANN202
        fn = orig_getitem(self, grid)
        return lambda **kw: calls_seen.append((fn, kw)) or fn(**kw)

    type(chunk.chunk_state_pass_kernel).__getitem__ = getitem
    try:
        chunk.chunk_forward(inputs, initial_state=None)
    finally:
        chunk._Run.launch = launch
        type(chunk.chunk_state_pass_kernel).__getitem__ = orig_getitem
    for i, (fn, kw) in enumerate(calls_seen):
        out[f"launch_{i}_{len(kw)}args"] = _per_call_us(lambda fn=fn, kw=kw: fn(**kw))
    # the custom-op dispatch alone: an op of the same arity whose body allocates the outputs
    tensors = list(inputs.values())
    n_in = len(tensors)

    @torch.library.custom_op(f"dgps_host_probe::{system}", mutates_args=())
    def probe(ts: list[torch.Tensor], scale: float, keep: bool) -> list[torch.Tensor]:
        return [torch.empty_like(ts[0]) for _ in range(n_in)]

    out["custom_op_probe"] = _per_call_us(lambda: probe(tensors, 1.0, False))
    out["torch_empty_x10"] = _per_call_us(lambda: [torch.empty(1024, device="cuda") for _ in range(10)])
    return {k: round(v, 1) for k, v in out.items()}


def memory_ab(system: str, shape: list[int]) -> dict:
    """Peak memory of one training step, eager (autograd.Function) against the custom ops (the path
    torch.compile traces; forced here by reporting that torch is compiling)."""
    from bench_fla import fwd_bwd, peak_mib

    import dgps.fla_compat as dgps_fla

    f = calls(dgps_fla)[system]
    x = make_inputs(system, *shape)
    do = torch.randn_like(x["v"])
    out = {}
    real = torch.compiler.is_compiling
    for label, compiling in (("eager", False), ("custom_op", True), ("eager_again", False)):
        torch.compiler.is_compiling = (lambda: True) if compiling else real
        try:
            step = fwd_bwd(f, x, do)
            step()
            out[label] = round(peak_mib(step), 1)
        finally:
            torch.compiler.is_compiling = real
    return out


def compare_bound(system: str, shape: list[int]) -> dict:
    """o and every gradient with runtime/launcher.py's direct launches and with Triton's bound path (bitwise), and
    the tiny-shape / full-shape forward and forward+backward wall clock of both, interleaved."""
    import statistics

    import triton.testing

    import dgps.fla_compat as dgps_fla
    from dgps.runtime import launcher

    f = calls(dgps_fla)[system]
    out: dict = {}
    for label, (B, T) in (("tiny", (1, 256)), ("full", tuple(shape[:2]))):
        x = make_inputs(system, B, T, shape[2], shape[3])
        do = torch.randn_like(x["v"])
        results = {}
        for bound in (True, False):
            launcher.BOUND_ONLY = bound
            leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
            o = f(leaves)
            o.backward(do)
            o2 = f(leaves)  # a second call: the direct path is taken from the second call of a geometry on
            results[bound] = [o, o2] + [leaves[k].grad for k in sorted(leaves)]
        out[f"{label}_bitwise_equal"] = all(torch.equal(a, b) for a, b in zip(results[True], results[False], strict=True))

        def step(x=x, do=do) -> None:
            leaves = {k: v.detach().requires_grad_(True) for k, v in x.items()}
            f(leaves).backward(do)

        times: dict[str, list[float]] = {}
        for _ in range(5):
            for bound in (True, False):
                launcher.BOUND_ONLY = bound
                tag = "bound" if bound else "direct"
                times.setdefault(f"{label}_fwd_{tag}", []).append(
                    triton.testing.do_bench(lambda x=x: f(x), warmup=10, rep=50, return_mode="median"))
                times.setdefault(f"{label}_fwdbwd_{tag}", []).append(
                    triton.testing.do_bench(step, warmup=5, rep=50, return_mode="median"))
        out.update({k: round(statistics.median(v), 4) for k, v in times.items()})
    launcher.BOUND_ONLY = False
    return out


def main() -> int:
    import triton.testing

    import dgps.fla_compat as dgps_fla

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=["kda", "gdn"])
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128])
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--breakdown", action="store_true", help="per layer of the dgps call, at the tiny shape")
    p.add_argument("--memory-ab", action="store_true",
                   help="peak memory of a training step through the eager autograd.Function and the custom ops")
    p.add_argument("--compare-bound", action="store_true",
                   help="dgps's direct launches against Triton's bound path: bitwise-equal results, host time")
    args = p.parse_args()
    if args.memory_ab:
        for system in args.systems:
            print(system, "peak MiB", json.dumps(memory_ab(system, args.shape)), flush=True)
    if args.compare_bound:
        for system in args.systems:
            print(system, "direct vs bound launches", json.dumps(compare_bound(system, args.shape)), flush=True)
    if args.breakdown:
        for system in args.systems:
            print(system, "host µs per call", json.dumps(breakdown(system, args.shape[2], args.shape[3])), flush=True)
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
            row[f"{side}_tiny_ms"] = triton.testing.do_bench(lambda f=f, x=tiny: f(x), warmup=20, rep=200,
                                                             return_mode="median")
            row[f"{side}_full_ms"] = triton.testing.do_bench(lambda f=f, x=full: f(x), warmup=10, rep=100,
                                                             return_mode="median")
            row[f"{side}_full_kernels_ms"] = kernel_sum_ms(f, full)
        print(system, json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
        if args.cprofile:
            f = sides["dgps"][system]
            do = torch.randn_like(tiny["v"])

            def step(f=f, x=tiny, do=do) -> None:
                leaves = {k: v.detach().requires_grad_(True) for k, v in x.items()}
                f(leaves).backward(do)

            step()
            torch.cuda.synchronize()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                step()
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
