"""CUDA graph capture of the generated packages: an inference forward, a decode step and a training step
(torch.cuda.make_graphed_callables) captured once and replayed on new values give what the eager calls give, bit for
bit. A captured call must neither synchronise with the host nor read device values there, and every launch must go
to the capturing stream (runtime/launcher.py takes the current stream per launch); a replay reruns exactly the
captured kernels, so anything the host decided from one call's values would be stale here.

Capture needs CUDA, so these run on a GPU machine (`python -m pytest tests/test_cuda_graphs.py`); the timings are
`benchmarks/cuda_graphs.py`'s.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

import dgps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA graph capture)")

ROOT = Path(__file__).resolve().parent.parent
# the decay kinds and solves (gdn scalar delta, kda vector delta, simple_gla scalar additive) and the structures whose
# host code differs: PDN's statistic (pgdn), CCQ's curvature passes (ccq_gdn), the residual route (cler_h_gdn)
SPECS = ["gdn", "kda", "simple_gla", "pgdn", "ccq_gdn", "cler_h_gdn"]
B, T, H, D = 2, 200, 2, 128  # T not a multiple of the chunk: the tails are in the captured kernels too


def _setup(spec: str, seed: int = 0) -> tuple:
    rec = dgps.load((ROOT / "specs" / f"{spec}.dgps").read_text())
    pkg = importlib.import_module(f"dgps.generated.{spec}")
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=seed, device="cuda")
    return rec, pkg, x


def _fresh(rec, seed: int) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=seed, device="cuda")


@pytest.mark.parametrize("spec", SPECS)
def test_inference_forward_replays_as_eager(spec: str) -> None:
    rec, pkg, static = _setup(spec)
    names = list(static)
    with torch.no_grad():
        for _ in range(2):  # warm-up off the capture: compiles, caches the call's geometry
            pkg.forward(**static, output_final_state=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = pkg.forward(**static, output_final_state=True)
        for seed in (1, 2):
            new = _fresh(rec, seed)
            for n in names:
                static[n].copy_(new[n])
            graph.replay()
            want = pkg.forward(**new, output_final_state=True)
            assert torch.equal(out.o, want.o), f"{spec}: replayed o differs from the eager call's"
            for s in want.final_state:
                assert torch.equal(out.final_state[s], want.final_state[s]), f"{spec}: replayed final state {s}"


@pytest.mark.parametrize("spec", SPECS)
def test_training_step_replays_as_eager(spec: str) -> None:
    rec, pkg, x = _setup(spec)
    names = list(x)

    def o_of(*tensors: torch.Tensor) -> torch.Tensor:
        return pkg.forward(**dict(zip(names, tensors, strict=True))).o

    sample = tuple(t.detach().clone().requires_grad_(True) for t in x.values())
    graphed = torch.cuda.make_graphed_callables(o_of, sample)
    for seed in (1, 2):
        new = _fresh(rec, seed)
        do = torch.randn(B, T, *sample[names.index("v")].shape[2:], dtype=torch.bfloat16, device="cuda",
                         generator=torch.Generator("cuda").manual_seed(seed))
        got_in = tuple(t.detach().clone().requires_grad_(True) for t in new.values())
        got = graphed(*got_in)
        got.backward(do)
        want_in = tuple(t.detach().clone().requires_grad_(True) for t in new.values())
        want = o_of(*want_in)
        want.backward(do)
        assert torch.equal(got, want), f"{spec}: replayed o differs from the eager step's"
        for n, a, b in zip(names, got_in, want_in, strict=True):
            assert torch.equal(a.grad, b.grad), f"{spec}: replayed d{n} differs from the eager step's"


@pytest.mark.parametrize("spec", ["gdn", "kda", "simple_gla", "pgdn"])
def test_decode_replays_as_eager(spec: str) -> None:
    rec = dgps.load((ROOT / "specs" / f"{spec}.dgps").read_text())
    pkg = importlib.import_module(f"dgps.generated.{spec}")

    def tokens(seed: int) -> dict[str, torch.Tensor]:
        return rec.random_inputs(B, 1, H, D, D, dtype=torch.bfloat16, seed=seed, device="cuda")

    prompt = rec.random_inputs(B, 64, H, D, D, dtype=torch.bfloat16, seed=9, device="cuda")
    with torch.no_grad():
        start = pkg.forward(**prompt, output_final_state=True).final_state
        state = {s: v.clone() for s, v in start.items()}
        static = tokens(0)
        for _ in range(2):
            pkg.decode(**static, state=state)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = pkg.decode(**static, state=state)
        for s in state:
            state[s].copy_(start[s])
        eager_state = {s: v.clone() for s, v in start.items()}
        for seed in (1, 2, 3):  # three tokens: each replay advances the captured state in place
            new = tokens(seed)
            for n in static:
                static[n].copy_(new[n])
            graph.replay()
            want = pkg.decode(**new, state=eager_state)
            assert torch.equal(out.o, want.o), f"{spec}: replayed decode output differs (token {seed})"
            for s in state:
                assert torch.equal(state[s], eager_state[s]), f"{spec}: replayed decode state {s} (token {seed})"


def test_layer_training_step_replays_as_eager() -> None:
    """DGPSLayer (projections, short convolutions, gates, the kernels, the gated norm) graphed as a module."""
    from dgps.runtime.layers import DGPSLayer

    torch.manual_seed(0)
    layer = DGPSLayer(ROOT / "specs" / "gdn.dgps", 256, 2, 128, 128).cuda().to(torch.bfloat16)

    class _Out(torch.nn.Module):  # make_graphed_callables takes tensor outputs only: the layer's `out`
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.layer(hidden)[0]

    # two wrappers of the one layer: make_graphed_callables replaces the forward of the module it is given
    eager = _Out()
    graphed = torch.cuda.make_graphed_callables(
        _Out(), (torch.randn(B, T, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True),))
    for seed in (1, 2):
        gen = torch.Generator("cuda").manual_seed(seed)
        hidden = torch.randn(B, T, 256, dtype=torch.bfloat16, device="cuda", generator=gen)
        dy = torch.randn(B, T, 256, dtype=torch.bfloat16, device="cuda", generator=gen)
        grads = []
        for module in (graphed, eager):
            layer.zero_grad(set_to_none=True)
            h = hidden.clone().requires_grad_(True)
            y = module(h)
            y.backward(dy)
            grads.append((y.detach(), h.grad, {n: p.grad.clone() for n, p in layer.named_parameters()}))
        (y_g, dh_g, dp_g), (y_e, dh_e, dp_e) = grads
        assert torch.equal(y_g, y_e), "replayed layer output differs from the eager step's"
        assert torch.equal(dh_g, dh_e), "replayed d(hidden) differs"
        for n in dp_e:
            assert torch.equal(dp_g[n], dp_e[n]), f"replayed gradient of {n} differs"
