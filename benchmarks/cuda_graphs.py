"""What CUDA graphs take off a step: the same call eager and replayed from a graph, in one process, interleaved rounds.

  train-tiny  a training step (forward + backward) at B 1 T 256 H 2 D 128, where the wall clock is the host's
  train       the same at a training shape (--shape, default the reference B 4 T 4096 H 16 D 128), graphed through
              torch.cuda.make_graphed_callables (which copies inputs in and gradients out of static buffers)
  train-whole the same step captured whole with torch.cuda.graph over static leaves: a replay writes o and each leaf's
              .grad where the capture put them, no copies (the pattern of a fully captured training loop)
  decode      one token's decode step at B 1 H 16 D 128 (the state updated in place), the inference loop's unit
  fla-decode  FLA's fused_recurrent_gated_delta_rule on the same token (gdn only, when fla-core is importable)

Replays are checked equal to the eager calls (tests/test_cuda_graphs.py checks the same more widely).

    . benchmarks/device_env.sh && python3 benchmarks/cuda_graphs.py gdn kda [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import dgps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_overhead import _per_call_us  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _train(rec, pkg, shape: tuple[int, int, int, int]) -> tuple[Callable, Callable]:  # noqa: ANN001
    B, T, H, D = shape
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda", on_device=True)
    names = list(x)

    def o_of(*tensors: torch.Tensor) -> torch.Tensor:
        return pkg.forward(**dict(zip(names, tensors, strict=True))).o

    leaves = tuple(t.detach().requires_grad_(True) for t in x.values())
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")
    graphed = torch.cuda.make_graphed_callables(o_of, tuple(t.detach().clone().requires_grad_(True) for t in leaves))
    check_e, check_g = o_of(*leaves), graphed(*leaves)
    assert torch.equal(check_e, check_g), "replayed o differs from the eager call's"
    return (lambda: o_of(*leaves).backward(do)), (lambda: graphed(*leaves).backward(do))


def _train_whole(rec, pkg, shape: tuple[int, int, int, int]) -> tuple[Callable, Callable]:  # noqa: ANN001
    B, T, H, D = shape
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda", on_device=True)
    leaves = {n: t.detach().requires_grad_(True) for n, t in x.items()}
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")

    def step() -> None:
        for t in leaves.values():
            t.grad = None  # as zero_grad(set_to_none=True): the capture allocates each .grad in the graph's pool
        pkg.forward(**leaves).o.backward(do)

    side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph's documentation asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    eager_grads = {n: t.grad.clone() for n, t in leaves.items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    for n, t in leaves.items():
        assert torch.equal(t.grad, eager_grads[n]), f"replayed d{n} differs from the eager step's"
    return step, graph.replay


def _fla_decode(H: int, D: int) -> tuple[Callable, Callable] | None:
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k = (torch.nn.functional.normalize(torch.randn(1, 1, H, D, device="cuda", generator=gen), dim=-1)
            .to(torch.bfloat16) for _ in range(2))
    v = torch.randn(1, 1, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 1, H, device="cuda", generator=gen) + 3).to(torch.bfloat16)
    beta = torch.rand(1, 1, H, device="cuda", generator=gen).to(torch.bfloat16)
    state = torch.randn(1, H, D, D, device="cuda", generator=gen) / D

    def call() -> None:
        with torch.no_grad():
            fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return call, graph.replay


def _decode(rec, pkg, H: int, D: int) -> tuple[Callable, Callable]:  # noqa: ANN001
    prompt = rec.random_inputs(1, 64, H, D, D, dtype=torch.bfloat16, seed=1, device="cuda", on_device=True)
    tok = rec.random_inputs(1, 1, H, D, D, dtype=torch.bfloat16, seed=2, device="cuda", on_device=True)
    with torch.no_grad():
        state = pkg.forward(**prompt, output_final_state=True).final_state
        for _ in range(3):
            pkg.decode(**tok, state=state)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pkg.decode(**tok, state=state)

    def eager() -> None:
        with torch.no_grad():
            pkg.decode(**tok, state=state)

    return eager, graph.replay


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="+")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--json")
    a = p.parse_args()
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": a.shape, "specs": {}}
    for spec in a.specs:
        rec = dgps.load((ROOT / "specs" / f"{spec}.dgps").read_text())
        pkg = importlib.import_module(f"dgps.generated.{spec}")
        cases = {
            "train-tiny": (_train(rec, pkg, (1, 256, 2, 128)), 200),
            "train": (_train(rec, pkg, tuple(a.shape)), 20),
            "train-whole": (_train_whole(rec, pkg, tuple(a.shape)), 20),
            "decode": (_decode(rec, pkg, 16, 128), 500),
        }
        fla = _fla_decode(16, 128) if spec == "gdn" else None
        if fla is not None:
            cases["fla-decode"] = (fla, 500)
        row = {}
        for case, ((eager, graphed), n) in cases.items():
            times: dict[str, list[float]] = {"eager": [], "graph": []}
            for _ in range(a.rounds):
                times["eager"].append(_per_call_us(eager, n))
                times["graph"].append(_per_call_us(graphed, n))
            row[case] = {k: statistics.median(v) for k, v in times.items()}
            print(f"{spec:12s} {case:10s} eager {row[case]['eager']:9.1f} us  graph {row[case]['graph']:9.1f} us  "
                  f"({row[case]['graph'] / row[case]['eager']:.2f})", flush=True)
        out["specs"][spec] = row
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
