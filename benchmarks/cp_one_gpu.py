"""Context parallelism on ONE GPU shared by 2 processes: the 2-rank CP call against the unsharded call, and its cost.

    python benchmarks/cp_one_gpu.py                  # gdn, kda; B = 1, T = 8192 per rank, H = 16, dk = dv = 128, bf16
    python benchmarks/cp_one_gpu.py --systems gdn pgdn --T 16384 --reps 9 --calls
    python benchmarks/cp_one_gpu.py --world 4 --T 4096                 # 4 processes: the middle ranks' transitions
    python benchmarks/cp_one_gpu.py --device cpu --T 128 --D 32 --H 2 --reps 2 --warmup 0    # the interpreter (CPU)
    python benchmarks/cp_one_gpu.py --world 8 --gpu-per-rank --T 32768   # a multi-GPU host: NCCL, one GPU per rank
    python benchmarks/cp_one_gpu.py --layout zigzag      # FLA's zigzag slices (cp_layout="zigzag": the token relayout)

torch.multiprocessing spawns --world processes with a gloo group on the one device (gloo takes CUDA tensors; NCCL
refuses two ranks on one GPU); the sequence [B, world x T] is cut in slices of T tokens. Per system:

(a) exactness. Every rank draws the same inputs for the whole sequence (log gates scaled by --gate-scale, so that
    the slices' transition products M stay away from 0) and random initial states; each runs the unsharded call
    (forward and backward against fixed random gradients of o and of the final states) and its slice with cp_group.
    Compared on rank 0 (each rank checks its own slice; rank 0 prints and reports the worst over the ranks): o, the
    final states (summed over the ranks: each row is filled where its sequence ends) and every gradient (the slice's
    inputs; the params' and the initial states' summed over the ranks), as max |CP - ref| / max |ref| ("max") and
    ||CP - ref|| / ||ref|| ("norm"), the worst over the ranks; also against the unsharded call in fp32, and, for
    scale, "floor": the unsharded call in --dtype against the same call in fp32, on the same slices (the CP call
    should be about as far from fp32 as that).
    With 2 ranks the chain carries rank 0's final state alone (the last rank's transition is never read, so none is
    formed): CP computes what the unsharded call does, and the errors are expected to be 0 (they were, under the
    interpreter). --world 3 or more runs the transition passes (M) and both reverse state passes of the middle ranks.
(b) cost: median wall time over --reps repetitions (after --warmup) of the forward and of forward + backward:
    "cp"    every rank at once, each on its slice (from a barrier to the last rank's synchronize: they share the
            GPU, so this is what one GPU does for the whole sequence through CP);
    "plain" rank 0 alone, the plain call of one slice (T tokens), the others waiting;
    "full"  rank 0 alone, the unsharded call (world x T tokens): the same tokens as "cp", without CP;
    --calls: also "cp_calls", CP through whole package calls (the path before the intra-chunk work was shared;
             DGPS_CP_CALLS=1 selects it everywhere).
Prints progress to stderr and one JSON line to stdout (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
ALL = slice(None)  # every token


def _rel(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    a, b = a.detach().double(), b.detach().double()
    return {"max": float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)),
            "norm": float((a - b).norm() / b.norm().clamp_min(1e-30))}


def _loss(out, do: torch.Tensor, dfin: dict[str, torch.Tensor], sel: Any = ALL) -> torch.Tensor:  # noqa: ANN001
    loss = (out.o.float() * do[:, sel]).sum()
    for n, g in dfin.items():
        loss = loss + (out.final_state[n].float() * g).sum()
    return loss


def _leaves(pkg, x: dict, h0: dict, sel: Any = ALL) -> tuple[dict, dict]:  # noqa: ANN001
    """Leaf copies of the inputs' tokens `sel` (a slice or an index tensor; params whole) and of the initial states,
    requiring grad."""
    params = {d.name for d in pkg.IR.inputs if d.is_param}
    xs = {n: (t if n in params else t[:, sel]).detach().clone().requires_grad_() for n, t in x.items()}
    hs = {n: s.detach().clone().requires_grad_(n != "n") for n, s in h0.items()}
    return xs, hs


def _call(pkg, xs: dict, hs: dict, do, dfin, sel=ALL, group=None, backward=True, layout="contiguous"):  # noqa: ANN001, ANN202
    """One call, forward and (backward) backward into the leaves' .grad."""
    for t in (*xs.values(), *hs.values()):
        t.grad = None
    kw = {"cp_layout": layout} if group is not None else {}
    if not backward:
        with torch.no_grad():
            return pkg.forward(**xs, initial_state=hs, output_final_state=True, cp_group=group, **kw)
    out = pkg.forward(**xs, initial_state=hs, output_final_state=True, cp_group=group, **kw)
    _loss(out, do, dfin, sel).backward()
    return out


def _run(pkg, x: dict, h0: dict, do, dfin, sel=ALL, group=None, layout="contiguous"):  # noqa: ANN001, ANN202
    xs, hs = _leaves(pkg, x, h0, sel)
    return _call(pkg, xs, hs, do, dfin, sel, group, layout=layout), xs, hs


def _tokens(rank: int, world: int, T: int, layout: str, device: torch.device) -> Any:
    """This rank's tokens of the world x T sequence: its contiguous slice, or (zigzag) parts rank and
    2·world − 1 − rank of 2·world."""
    if layout == "contiguous":
        return slice(rank * T, (rank + 1) * T)
    P, back = T // 2, 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * P, (rank + 1) * P), torch.arange(back * P, (back + 1) * P)]).to(device)


def _time(fn, sync, reps: int, warmup: int, barrier=None) -> float:  # noqa: ANN001
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        if barrier is not None:
            barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _system(name: str, a: argparse.Namespace, rank: int, dev: torch.device) -> dict:
    import importlib

    from dgps.runtime.api import random_inputs
    from dgps.runtime.reference import random_states, state_shapes
    from dgps.runtime.tensors import Dims

    pkg = importlib.import_module(f"dgps.generated.{name}")
    ir = pkg.IR
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    T2 = a.world * a.T
    sel = _tokens(rank, a.world, a.T, a.layout, dev)
    x32 = random_inputs(ir, a.B, T2, a.H, a.D, a.D, dtype=torch.float32, seed=a.seed)
    for d in ir.inputs:  # weak decay: M stays O(1) over the last tokens of a slice, so an error in it shows
        if d.domain == "log_gate" and not d.is_param:
            x32[d.name] = x32[d.name] * a.gate_scale
    x32 = {n: t.to(dev) for n, t in x32.items()}
    x = {n: t.to(dtype) for n, t in x32.items()}
    dims = Dims(a.B, T2, a.H, a.H, a.D, a.D)
    h0 = {n: s.float().to(dev) for n, s in random_states(ir, dims, a.B, seed=a.seed).items()}
    gen = torch.Generator().manual_seed(a.seed + 1)
    do = torch.randn(a.B, T2, a.H, a.D, generator=gen).to(dev)
    dfin = {n: torch.randn(s, generator=gen).to(dev) for n, s in state_shapes(ir, dims, a.B).items() if n != "n"}
    params = {d.name for d in ir.inputs if d.is_param}
    group = dist.group.WORLD

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # (a) exactness: the unsharded call (in the dtype, and in fp32 for the floor) and the CP call
    ref, rx, rh = _run(pkg, x, h0, do, dfin)
    ref32, rx32, rh32 = _run(pkg, x32, h0, do, dfin)
    out, xs, hs = _run(pkg, x, h0, do, dfin, sel=sel, group=group, layout=a.layout)
    sync()
    errs, errs32, floor = {}, {}, {}

    def compare(key: str, ours: torch.Tensor, want: torch.Tensor, want32: torch.Tensor) -> None:
        # the floor on the same part as the CP comparison (a rank's slice of a per-token tensor)
        errs[key], errs32[key], floor[key] = _rel(ours, want), _rel(ours, want32), _rel(want, want32)

    compare("o", out.o, ref.o[:, sel], ref32.o[:, sel])
    for n, s in out.final_state.items():
        total = s.detach().clone()
        dist.all_reduce(total, group=group)
        compare("final_" + n, total, ref.final_state[n], ref32.final_state[n])
    for n, t in xs.items():
        g = t.grad.detach().clone()
        if n in params:
            dist.all_reduce(g, group=group)
            compare("d" + n, g, rx[n].grad, rx32[n].grad)
        else:
            compare("d" + n, g, rx[n].grad[:, sel], rx32[n].grad[:, sel])
    for n, s in hs.items():
        if s.grad is None or rh[n].grad is None:
            continue
        g = s.grad.detach().clone()
        dist.all_reduce(g, group=group)
        compare("dh0_" + n, g, rh[n].grad, rh32[n].grad)
    del ref, rx, rh, ref32, rx32, rh32, out, xs, hs
    for table in (errs, errs32, floor):  # each rank compared its own slice: the worst over the ranks
        for k, e in table.items():
            t = torch.tensor([e["max"], e["norm"]], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            table[k] = {"max": float(t[0]), "norm": float(t[1])}
    worst = max(e["max"] for e in errs.values())
    if rank == 0:
        print(f"{name:<10} CP vs unsharded ({a.dtype}) worst max-rel {worst:.2e}: "
              + " ".join(f"{k}={v['max']:.1e}/{v['norm']:.1e}" for k, v in errs.items()), file=sys.stderr, flush=True)
        print(f"{'':<10} CP {a.dtype} vs unsharded fp32: "
              + " ".join(f"{k}={v['max']:.1e}/{v['norm']:.1e}" for k, v in errs32.items()), file=sys.stderr, flush=True)
        print(f"{'':<10} unsharded {a.dtype} vs fp32 (floor): "
              + " ".join(f"{k}={v['max']:.1e}/{v['norm']:.1e}" for k, v in floor.items()), file=sys.stderr, flush=True)

    # (b) cost
    def barrier() -> None:
        dist.barrier(group=group)

    ms: dict[str, float] = {}
    reps, warm = a.reps, a.warmup
    from dgps.runtime import cp as cp_mod

    paths = [("cp", True)] + ([("cp_calls", False)] if a.calls else [])
    xs, hs = _leaves(pkg, x, h0, sel)
    for label, kernel_path in paths:
        cp_mod.KERNEL_PATH = kernel_path
        try:
            ms[f"{label}_fwd"] = _time(lambda: _call(pkg, xs, hs, do, dfin, sel, group, backward=False,
                                                     layout=a.layout), sync, reps, warm, barrier)
            ms[f"{label}_step"] = _time(lambda: _call(pkg, xs, hs, do, dfin, sel, group, layout=a.layout), sync, reps,
                                        warm, barrier)
        finally:
            cp_mod.KERNEL_PATH = True
    for label, part_sel in (("plain", slice(0, a.T)), ("full", ALL)):
        barrier()
        if rank == 0:
            ys, gs = _leaves(pkg, x, h0, part_sel)
            for part, bwd in (("fwd", False), ("step", True)):
                ms[f"{label}_{part}"] = _time(lambda ys=ys, gs=gs, ps=part_sel, bwd=bwd: _call(
                    pkg, ys, gs, do, dfin, ps, backward=bwd), sync, reps, warm)
            del ys, gs
        barrier()
    res = {"errors_vs_unsharded": errs, "errors_vs_unsharded_fp32": errs32, "floor_unsharded_vs_fp32": floor,
           "worst_max_rel": worst,
           "ms": {k: round(v, 4) for k, v in ms.items()}}
    if rank == 0:
        res["ratios"] = {"cp_step / full_step": ms["cp_step"] / ms["full_step"],
                         "cp_fwd / full_fwd": ms["cp_fwd"] / ms["full_fwd"],
                         f"cp_step / ({a.world} plain_step)": ms["cp_step"] / (a.world * ms["plain_step"])}
        if a.calls:
            res["ratios"]["cp_calls_step / cp_step"] = ms["cp_calls_step"] / ms["cp_step"]
            res["ratios"]["cp_calls_fwd / cp_fwd"] = ms["cp_calls_fwd"] / ms["cp_fwd"]
        print(f"{'':<10} ms: " + " ".join(f"{k}={v:.3f}" for k, v in ms.items()), file=sys.stderr, flush=True)
    return res


def _worker(rank: int, a: argparse.Namespace, port: int, out_path: str) -> None:
    if a.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(ROOT / "tests"))
        try:
            import conftest  # noqa: F401 - the interpreter speed-up of the test suite
        except ImportError:
            pass
    dev = torch.device(a.device)
    if dev.type == "cuda":
        # every rank on the one device, or (--gpu-per-rank, a multi-GPU host) rank r on GPU r
        dev = torch.device("cuda", rank if a.gpu_per_rank else (dev.index or 0))
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False  # the chain's fp32 matmuls (docs/context_parallel.md)
    dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world)
    results = {}
    for name in a.systems:
        results[name] = _system(name, a, rank, dev)
    if rank == 0:
        gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (TRITON_INTERPRET=1)"
        line = {"bench": "cp_one_gpu", "device": gpu, "world": a.world, "backend": a.backend, "layout": a.layout,
                "gpu_per_rank": a.gpu_per_rank,
                "shape": {"B": a.B, "T_per_rank": a.T, "H": a.H, "dk": a.D, "dv": a.D, "dtype": a.dtype,
                          "gate_scale": a.gate_scale}, "reps": a.reps, "systems": results,
                "torch": torch.__version__}
        Path(out_path).write_text(json.dumps(line))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", nargs="+", default=["gdn", "kda"])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--T", type=int, default=8192, help="tokens per rank (the sequence has world x T)")
    p.add_argument("--world", type=int, default=2, help="processes sharing the one device (4: the middle ranks' "
                   "transition products and both reverse state passes run)")
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=128, help="dk = dv")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--gate-scale", type=float, default=0.05)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", action="store_true", help="also time CP through whole package calls")
    p.add_argument("--device", default="cuda", help="cuda (one GPU, both ranks) or cpu (the interpreter)")
    p.add_argument("--gpu-per-rank", action="store_true",
                   help="a multi-GPU host: rank r on GPU r (with --backend nccl, the default then)")
    p.add_argument("--backend", default=None, help="gloo (default: ranks sharing one GPU, or the CPU) or nccl")
    p.add_argument("--layout", default="contiguous", choices=("contiguous", "zigzag"),
                   help="the ranks' slices: contiguous, or FLA's zigzag (T per rank must be even)")
    a = p.parse_args()
    a.backend = a.backend or ("nccl" if a.gpu_per_rank else "gloo")
    if a.gpu_per_rank and (a.device == "cpu" or torch.cuda.device_count() < a.world):
        p.error(f"--gpu-per-rank needs {a.world} GPUs; this host has {torch.cuda.device_count()}")
    if a.device != "cpu" and not torch.cuda.is_available():
        p.error("no CUDA device: run with --device cpu (the interpreter, tiny shapes)")
    if a.reps < 1 or a.world < 2:
        p.error("--reps must be at least 1 and --world at least 2")
    if a.layout == "zigzag" and a.T % 2:
        p.error("--layout zigzag needs an even --T (two parts per rank)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"cp_one_gpu_{os.getpid()}.json")
    mp.spawn(_worker, args=(a, port, out_path), nprocs=a.world, join=True)
    print(Path(out_path).read_text())
    os.unlink(out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
