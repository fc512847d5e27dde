"""What CUDA graphs take off a step: the same call eager and replayed from a graph, in one process, interleaved rounds.

  train-tiny  a training step (forward + backward) at B 1 T 256 H 2 D 128, where the wall clock is the host's
  train       the same at a training shape (--shape, default the reference B 4 T 4096 H 16 D 128)
  decode      one token's decode step at B 1 H 16 D 128 (the state updated in place), the inference loop's unit

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
            "decode": (_decode(rec, pkg, 16, 128), 500),
        }
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
