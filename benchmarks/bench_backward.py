"""Forward+backward benchmark and full-size gradient check: dgps next to FLA, in the same run.

    FLA_DISABLE_BACKEND_DISPATCH=1 python benchmarks/bench_backward.py [--systems ...] [--json OUT]

For each system at B=4, T=4096, H=16, dk=dv=128, bf16: median time of forward+backward (loss
<o, dO> + <S_T, dS_T>) for dgps and for FLA's chunk op; the gradients of both against a float64
reference computed from the dgps spec (the sequential reference, checkpointed every `--segment`
tokens through its own state continuation so full-size autograd fits in memory).

fla-core 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 (its issue #640 guard in
fla/ops/common/chunk_o.py). `--bypass-fla-guard` (default on) lifts that guard to take timings and
reports the accuracy FLA's gradients reach that way; the output marks every such number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_forward import fla_ops, rel  # noqa: E402

GATED = {"gdn", "kda", "gla", "simple_gla", "gdn2", "pgdn", "pkda"}


def fla_extra_ops() -> dict:
    from fla.ops.precond_kda import chunk_precond_kda

    return {
        "pkda": lambda x: chunk_precond_kda(x["q"], x["k"], x["v"], x["g"], x["gP"], x["betaP"], x["beta"],
                                            output_final_state=True, log_atk_scale=x["mu"]),
    }


def reference_o_and_grads(rec, x: dict[str, torch.Tensor], do: torch.Tensor, dS: torch.Tensor | None = None,  # noqa: ANN001
                          segment: int = 256) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """float64 o and gradients of <o, dO> (+ <S_T, dS>) through the sequential reference, checkpointed by segment
    (the states carry between segments, so autograd at T = 4096 fits in memory)."""
    xr = {k: v.detach().double().requires_grad_(True) for k, v in x.items()}
    T = x["q"].shape[1]
    names = list(xr)

    def run(a: int, b: int, states: dict, *tensors: torch.Tensor):  # noqa: ANN202
        inp = {n: (t if rec.ir.input(n).is_param else t[:, a:b]) for n, t in zip(names, tensors, strict=True)}
        out = rec.reference(**inp, initial_state=states or None, output_final_state=True)
        return out.o, out.final_state

    states: dict = {}
    outs = []
    for a in range(0, T, segment):
        o, states = checkpoint(run, a, min(T, a + segment), states, *xr.values(), use_reentrant=False)
        outs.append(o)
    o = torch.cat(outs, 1)
    loss = (o * do.double()).sum()
    if dS is not None:
        loss = loss + (states["S"] * dS.double()).sum()
    loss.backward()
    return o.detach(), {n: t.grad for n, t in xr.items()}


def reference_grads(rec, x: dict[str, torch.Tensor], do: torch.Tensor, dS: torch.Tensor,  # noqa: ANN001
                    segment: int) -> dict[str, torch.Tensor]:
    """float64 gradients of <o, dO> + <S_T, dS> through the sequential reference, checkpointed by segment."""
    return reference_o_and_grads(rec, x, do, dS, segment)[1]


def kernel_times(step) -> dict[str, float]:  # noqa: ANN001
    """CUDA time per kernel name (ms, summed over launches) of one call of `step`, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" or getattr(ev, "self_device_time_total", 0) > 0:
            t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
            if t:
                times[ev.key[:60]] = round(t / 1000, 3)
    return dict(sorted(times.items(), key=lambda kv: -kv[1])[:14])


def main() -> int:
    import triton
    import triton.testing

    import dgps

    p = argparse.ArgumentParser()
    p.add_argument("--systems", nargs="+",
                   default=["gdn", "kda", "gla", "simple_gla", "deltanet", "gdn2", "pgdn", "pkda", "ccq_gdn"])
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--segment", type=int, default=256)
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--no-bypass-fla-guard", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true", help="per-kernel CUDA times of one dgps (and FLA) fwd+bwd step")
    args = p.parse_args()
    B, T, H, D = args.B, args.T, args.H, args.D
    if not args.no_bypass_fla_guard:
        import fla.ops.common.chunk_o as fla_chunk_o

        fla_chunk_o.IS_NVIDIA_HOPPER = False  # lifts the #640 guard; numbers taken this way are marked
    fla_fns = {} if args.no_fla else {**fla_ops(), **fla_extra_ops()}
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "shape": f"B={B} T={T} H={H} dk=dv={D} bf16",
           "fla_guard_bypassed": not args.no_bypass_fla_guard}
    print(json.dumps(env), flush=True)
    rows = []
    for name in args.systems:
        rec = dgps.load(str(ROOT / "specs" / f"{name}.dgps"))
        pkg = dgps.compile(rec)
        x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda")
        gen = torch.Generator(device="cuda").manual_seed(1)
        do = torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
        dS = torch.randn(B, H, D, D, device="cuda", generator=gen) * 0.01
        row = {"system": name, "dgps_forward_path": pkg.METADATA["forward"], "dgps_backward_path": pkg.METADATA["backward"]}

        def dgps_step(x=x, pkg=pkg, do=do, dS=dS) -> dict[str, torch.Tensor]:
            xg = {k: v.detach().requires_grad_(True) for k, v in x.items()}
            out = pkg.forward(**xg, output_final_state=True)
            torch.autograd.backward([out.o, out.final_state["S"]], [do, dS])
            return {k: v.grad for k, v in xg.items()}

        t0 = time.time()
        grads = dgps_step()
        torch.cuda.synchronize()
        row["dgps_cold_s"] = time.time() - t0
        row["dgps_fwd_ms"] = triton.testing.do_bench(lambda pkg=pkg, x=x: pkg.forward(**x, output_final_state=True),
                                                     warmup=10, rep=100, return_mode="median")
        row["dgps_fwdbwd_ms"] = triton.testing.do_bench(dgps_step, warmup=5, rep=50, return_mode="median")
        fla_grads = None
        if name in fla_fns:
            fn = fla_fns[name]

            def fla_step(fn=fn, x=x, do=do, dS=dS) -> dict[str, torch.Tensor]:
                xg = {k: v.detach().requires_grad_(True) for k, v in x.items()}
                o, S = fn(xg)[:2]
                torch.autograd.backward([o, S], [do, dS])
                return {k: v.grad for k, v in xg.items()}

            try:
                t0 = time.time()
                fla_grads = fla_step()
                torch.cuda.synchronize()
                row["fla_cold_s"] = time.time() - t0
                row["fla_fwdbwd_ms"] = triton.testing.do_bench(fla_step, warmup=5, rep=50, return_mode="median")
                row["dgps_over_fla_fwdbwd"] = row["dgps_fwdbwd_ms"] / row["fla_fwdbwd_ms"]
                row["fla_guard_bypassed"] = name in GATED and not args.no_bypass_fla_guard
            except Exception as e:  # noqa: BLE001 - report FLA's refusal instead of dying
                row["fla_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if args.profile:
            row["dgps_kernels_ms"] = kernel_times(dgps_step)
            if fla_grads is not None:
                row["fla_kernels_ms"] = kernel_times(fla_step)
        if not args.no_reference:
            ref = reference_grads(rec, x, do, dS, args.segment)
            row["dgps_grad_err"] = {k: rel(grads[k], ref[k]) for k in ref if grads.get(k) is not None}
            if fla_grads is not None:
                row["fla_grad_err"] = {k: rel(fla_grads[k], ref[k]) for k in ref if fla_grads.get(k) is not None}
            del ref
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # after every system, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
        torch.cuda.empty_cache()
    by = {r["system"]: r for r in rows}
    for sysname, base in (("ccq_gdn", "gdn"), ("pgdn", "gdn"), ("pkda", "kda")):
        if sysname in by and base in by:
            by[sysname][f"overhead_over_{base}_fwdbwd"] = by[sysname]["dgps_fwdbwd_ms"] / by[base]["dgps_fwdbwd_ms"] - 1
    print(f"{'system':<10} {'dgps fwd':>9} {'dgps f+b':>9} {'FLA f+b':>9} {'ratio':>6}  max grad err dgps / FLA")
    for r in rows:
        de = max(r.get("dgps_grad_err", {}).values(), default=float("nan"))
        fe = max(r.get("fla_grad_err", {}).values(), default=float("nan"))
        print(f"{r['system']:<10} {r['dgps_fwd_ms']:>9.2f} {r['dgps_fwdbwd_ms']:>9.2f} "
              f"{r.get('fla_fwdbwd_ms', float('nan')):>9.2f} {r.get('dgps_over_fla_fwdbwd', float('nan')):>6.2f}  "
              f"{de:.2e} / {fe:.2e}{' (FLA guard bypassed)' if r.get('fla_guard_bypassed') else ''}")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
