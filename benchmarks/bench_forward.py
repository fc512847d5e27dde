"""Forward benchmark: dgps-generated kernels next to FLA's hand-written ones, in the same run.

    FLA_DISABLE_BACKEND_DISPATCH=1 python benchmarks/bench_forward.py [--systems gdn kda ...] [--json OUT]

For each system: median time (triton.testing.do_bench) of dgps's forward and FLA's chunk op on the
same bf16 inputs at B=4, T=4096, H=16, dk=dv=128; the ratio dgps/FLA; both outputs' relative error
against the float64 sequential reference derived from the dgps spec (on the GPU, same rounded inputs);
and the ratio to the memory floor (bytes that must move: inputs read once, output and final state
written once, over the measured device copy bandwidth) and to a matmul floor (chunk-form FLOPs over
the measured bf16 matmul rate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def fla_ops() -> dict[str, Callable]:
    """FLA 0.6.0 entry points, called with the argument order and conventions of its public API."""
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gdn2 import chunk_gdn2
    from fla.ops.gla import chunk_gla
    from fla.ops.kda import chunk_kda
    from fla.ops.precond_gated_delta_rule import chunk_precond_gated_delta_rule
    from fla.ops.simple_gla import chunk_simple_gla

    return {
        "gdn": lambda x: chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True,
                                                output_final_state=True),
        "kda": lambda x: chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True),
        "gla": lambda x: chunk_gla(x["q"], x["k"], x["v"], x["g"], output_final_state=True),
        "simple_gla": lambda x: chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], output_final_state=True),
        "deltanet": lambda x: chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], output_final_state=True),
        "gdn2": lambda x: chunk_gdn2(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], output_final_state=True),
        "pgdn": lambda x: chunk_precond_gated_delta_rule(
            x["q"], x["k"], x["v"], x["gP"], x["g"], x["betaP"], x["beta"], output_final_state=True,
            use_qk_l2norm_in_kernel=True, log_atk_scale=x["mu"]),
    }


def chunk_flops(name: str, B: int, T: int, H: int, dk: int, dv: int, C: int = 64) -> float:
    """Matmul FLOPs of the chunk form (2 per multiply-add): intra scores, state pass and output."""
    n = B * H * T
    flops = 2 * n * C * dk + 2 * n * C * dv  # Q·Kᵀ scores and scores·V within chunks
    flops += 2 * n * dk * dv * 2  # state update Kᵀ·U and read Q·H
    if name not in ("gla", "simple_gla", "la", "retnet"):  # delta family: K·Kᵀ, the WY solve, W·H
        flops += 2 * n * C * dk + 2 * n * C * (dk + dv) + 2 * n * dk * dv + n * C * C // 3
    return float(flops)


def measure_ceilings() -> tuple[float, float]:
    import triton.testing

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda x=x, y=y: y.copy_(x), warmup=10, rep=50, return_mode="median")
    copy_bw = 2 * x.numel() / (ms * 1e-3)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = triton.testing.do_bench(lambda a=a, b=b: a @ b, warmup=10, rep=50, return_mode="median")
    mm_rate = 2 * 8192**3 / (ms * 1e-3)
    return copy_bw, mm_rate


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def main() -> int:
    import triton
    import triton.testing

    import dgps

    p = argparse.ArgumentParser()
    p.add_argument("--systems", nargs="+", default=["gdn", "kda", "gla", "deltanet", "gdn2", "pgdn"])
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--json", default=None)
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--no-reference", action="store_true")
    args = p.parse_args()
    B, T, H, D = args.B, args.T, args.H, args.D
    copy_bw, mm_rate = measure_ceilings()
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "copy_bandwidth_GBps": copy_bw / 1e9,
        "bf16_matmul_TFLOPs": mm_rate / 1e12,
        "shape": f"B={B} T={T} H={H} dk=dv={D} bf16",
    }
    try:
        import fla

        env["fla"] = fla.__version__
    except ImportError:
        env["fla"] = None
    print(json.dumps(env, indent=1), flush=True)
    fla_fns = {} if args.no_fla else fla_ops()
    rows = []
    for name in args.systems:
        rec = dgps.load(str(ROOT / "specs" / f"{name}.dgps"))
        pkg = dgps.compile(rec)
        x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda")
        row = {"system": name, "dgps_path": pkg.METADATA["forward"]}
        t0 = time.time()
        out = pkg.forward(**x, output_final_state=True)
        torch.cuda.synchronize()
        row["dgps_cold_s"] = time.time() - t0
        row["dgps_ms"] = triton.testing.do_bench(lambda pkg=pkg, x=x: pkg.forward(**x, output_final_state=True),
                                                 warmup=25, rep=200, return_mode="median")
        nbytes = sum(t.numel() * t.element_size() for t in x.values())
        nbytes += out.o.numel() * 2 + B * H * D * D * 4
        row["floor_mem_ms"] = nbytes / copy_bw * 1e3
        row["floor_mm_ms"] = chunk_flops(name, B, T, H, D, D) / mm_rate * 1e3
        row["dgps_over_mem_floor"] = row["dgps_ms"] / row["floor_mem_ms"]
        if name in fla_fns:
            t0 = time.time()
            fo = fla_fns[name](x)
            torch.cuda.synchronize()
            row["fla_cold_s"] = time.time() - t0
            fn = fla_fns[name]
            row["fla_ms"] = triton.testing.do_bench(lambda fn=fn, x=x: fn(x), warmup=25, rep=200, return_mode="median")
            row["dgps_over_fla"] = row["dgps_ms"] / row["fla_ms"]
        if not args.no_reference:
            ref = rec.reference(**{k: v.double() for k, v in x.items()}, output_final_state=True)
            row["dgps_err_o"] = rel(out.o, ref.o)
            row["dgps_err_S"] = rel(out.final_state["S"], ref.final_state["S"])
            if name in fla_fns:
                row["fla_err_o"] = rel(fo[0], ref.o)
                row["fla_err_S"] = rel(fo[1], ref.final_state["S"])
            del ref
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    hdr = f"{'system':<10} {'path':<9} {'dgps ms':>8} {'FLA ms':>8} {'dgps/FLA':>8} {'mem floor':>9} {'x floor':>7} " \
          f"{'err o':>9} {'FLA err o':>9}"
    print(hdr)
    for r in rows:
        print(f"{r['system']:<10} {r['dgps_path']:<9} {r['dgps_ms']:>8.3f} {r.get('fla_ms', float('nan')):>8.3f} "
              f"{r.get('dgps_over_fla', float('nan')):>8.2f} {r['floor_mem_ms']:>9.3f} {r['dgps_over_mem_floor']:>7.1f} "
              f"{r.get('dgps_err_o', float('nan')):>9.2e} {r.get('fla_err_o', float('nan')):>9.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
