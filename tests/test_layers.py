"""DGPSLayer (runtime/layers.py) and the associative-recall example (examples/associative_recall.py).

(a) for several specs the layer's output, final states and every parameter gradient through the Triton
    kernels equal the same layer with the spec's float64 sequential reference in place of the kernels;
(b) CCQ's λ gate starts at λ ≈ 0.01 with a zero weight;
(c) the example model learns multi-query associative recall (well below the no-memory floor), and the
    same criterion fails when the recurrence output is zeroed; a model step through the kernels (with
    the routes made live) matches the reference-backed model in loss and every gradient.

Under TRITON_INTERPRET=1 the kernels are slow (seconds per call at these sizes), so the long training
run uses the reference backend; (a) and the model-step test tie the kernel path to it.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from dgps.runtime.layers import LAMBDA_INIT, DGPSLayer

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"


def _example():
    name = "dgps_example_associative_recall"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "associative_recall.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(autouse=True)
def _one_thread():
    # tiny ops: extra intra-op threads only add contention on a small CPU machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _grads(layer: DGPSLayer, h: torch.Tensor, cler_in: torch.Tensor | None, w: torch.Tensor):
    y, state, extras = layer(h, cler_in=cler_in, use_cache=True)
    loss = (y * w).sum()
    if "cler" in extras:  # make the kernel's route output part of the loss directly as well
        loss = loss + extras["cler"].square().sum()
    named = [(n, p) for n, p in layer.named_parameters()] + [("hidden", h)]
    if cler_in is not None:
        named.append(("cler_in", cler_in))
    grads = torch.autograd.grad(loss, [t for _, t in named])  # allow_unused=False: every parameter is used
    return y.detach(), {k: s.detach() for k, s in state["rec"].items()}, dict(zip([n for n, _ in named], grads,
                                                                                     strict=True))


LAYER_SPECS = ["gdn", "kda", "pgdn", "ccq_gdn", "clvr_gdn", "cler_h_gdn", "gla", "gdn2"]


# keep_states (the backward runs no state pass again) with the fused state pass + output and with per-channel decay
@pytest.mark.parametrize(("name", "keep_states"), [(n, False) for n in LAYER_SPECS] + [("gdn", True), ("kda", True)])
def test_layer_kernel_matches_reference(name: str, keep_states: bool) -> None:
    torch.manual_seed(0)
    B, T, d, H, dk, dv = 2, 16, 32, 2, 16, 16
    HV = 4 if name == "pgdn" else 2  # grouped value heads with per-key-head PDN gates
    layer = DGPSLayer(SPECS / f"{name}.dgps", d, H, dk, dv, num_v_heads=HV, keep_states=keep_states)
    h = torch.randn(B, T, d, requires_grad=True)
    w = torch.randn(B, T, d)
    cler_in = torch.randn(B, T, HV, dv, requires_grad=True) if layer.route == "residual" else None

    y_k, s_k, g_k = _grads(layer, h, cler_in, w)
    layer.backend = "reference"  # float64 sequential reference in place of the kernels
    y_r, s_r, g_r = _grads(layer, h, cler_in, w)

    assert y_k.shape == (B, T, d) and y_k.dtype == torch.float32
    torch.testing.assert_close(y_k, y_r.float(), rtol=1e-4, atol=1e-4)
    assert set(s_k) == set(s_r)
    for k in s_k:
        torch.testing.assert_close(s_k[k].float(), s_r[k].float(), rtol=1e-4, atol=1e-4, msg=f"state {k}")
    for n, g in g_k.items():
        assert g is not None and torch.isfinite(g).all(), f"{name}: gradient of {n} is missing or not finite"
        scale = g_r[n].abs().max().item() + 1e-6
        torch.testing.assert_close(g, g_r[n].to(g.dtype), rtol=1e-3, atol=1e-4 * max(scale, 1.0),
                                   msg=lambda m, n=n: f"{name}: gradient of {n}: {m}")
    if layer.route in ("value", "residual"):
        assert float(layer.route_proj.weight.detach().abs().max()) == 0.0  # zero-initialised ...
        assert g_k["route_proj.weight"].abs().max() > 0  # ... and trained
    if layer.route == "residual":
        assert g_k["cler_gamma"].abs() > 0


def test_layer_decode_continues_the_sequence() -> None:
    """use_cache: a prefix forward, then decode steps with the cached states (recurrent kernel, conv caches)
    give the same outputs as one forward over the whole sequence."""
    torch.manual_seed(1)
    layer = DGPSLayer(SPECS / "ccq_gdn.dgps", 32, 2, 16, 16)
    h = torch.randn(1, 12, 32)
    with torch.no_grad():
        full, _, _ = layer(h)
        y1, state, _ = layer(h[:, :9], use_cache=True)
        ys = [y1]
        for t in range(9, 12):
            y, state, _ = layer(h[:, t:t + 1], past_state=state, use_cache=True)
            ys.append(y)
    torch.testing.assert_close(torch.cat(ys, dim=1), full, rtol=1e-4, atol=1e-4)


def test_layer_packed_sequences_do_not_mix() -> None:
    """cu_seqlens: a packed batch (short convolution and recurrence restart per sequence) equals the
    sequences run one by one."""
    torch.manual_seed(2)
    layer = DGPSLayer(SPECS / "pgdn.dgps", 32, 2, 16, 16, backend="reference")
    a, b = torch.randn(1, 5, 32), torch.randn(1, 7, 32)
    packed, state, _ = layer(torch.cat([a, b], dim=1), cu_seqlens=torch.tensor([0, 5, 12]), use_cache=True)
    ya, sa, _ = layer(a, use_cache=True)
    yb, sb, _ = layer(b, use_cache=True)
    torch.testing.assert_close(packed, torch.cat([ya, yb], dim=1), rtol=1e-5, atol=1e-5)
    for n in state["rec"]:
        torch.testing.assert_close(state["rec"][n], torch.cat([sa["rec"][n], sb["rec"][n]]), rtol=1e-5, atol=1e-5)
    for n in state["conv"]:
        torch.testing.assert_close(state["conv"][n], torch.cat([sa["conv"][n], sb["conv"][n]]))


def test_layer_cp_refuses_the_reference_backend() -> None:
    """Context parallelism chains the kernel path's slices; the sequential reference has no such entry, so a layer
    built on it refuses a cp_group before any collective (tests/test_context_parallel.py runs the kernel path,
    short convolutions included, on gloo groups)."""
    layer = DGPSLayer(SPECS / "gdn.dgps", 32, 2, 16, 16, backend="reference")
    layer.cp_group = object()  # never reached: the check comes first
    with pytest.raises(NotImplementedError, match="cp_group=...\\) needs backend='kernel'"):
        layer(torch.randn(1, 4, 32))


@pytest.mark.parametrize("name", ["ccq_gdn", "ccq_gla"])
def test_ccq_lambda_starts_at_one_percent(name: str) -> None:
    torch.manual_seed(0)
    layer = DGPSLayer(SPECS / f"{name}.dgps", 32, 2, 16, 16, backend="reference")
    assert layer.lambda_inputs == ("lam",)
    proj = layer.gate_proj["lam"]
    assert float(proj.weight.detach().abs().max()) == 0.0  # W_λ zero-initialised
    lam = layer.gates(torch.randn(2, 8, 32) * 10)["lam"]
    assert lam.shape == (2, 8, 2)
    torch.testing.assert_close(lam, torch.full_like(lam, LAMBDA_INIT), rtol=1e-3, atol=1e-5)


def test_ccq_lambda_init_through_a_spec_side_sigmoid() -> None:
    """When the spec applies the map itself (`read curvature(sigmoid(l))` with l free), λ still starts at 0.01."""
    text = (SPECS / "ccq_gdn.dgps").read_text().replace("input lam  : token unit", "input l    : token")
    text = text.replace("curvature(lam, centered)", "curvature(sigmoid(l), centered)")
    layer = DGPSLayer(text, 32, 2, 16, 16, backend="reference")
    lam = torch.sigmoid(layer.gates(torch.randn(2, 8, 32))["l"])
    torch.testing.assert_close(lam, torch.full_like(lam, LAMBDA_INIT), rtol=1e-3, atol=1e-5)


# -- the example -------------------------------------------------------------------------------------

STEPS = 200


def _learned(losses: list[float], n_values: int = 8) -> bool:
    """Loss well down from its start and far below log(n_values), the best loss without any memory."""
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    return last < 0.7 * first and last < 0.5 * math.log(n_values)


def test_associative_recall_trains() -> None:
    ar = _example()
    losses = ar.main("specs/gdn.dgps", steps=STEPS, seed=0, backend="reference", verbose=False)
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert _learned(losses), f"first-20 {sum(losses[:20]) / 20:.3f}, last-20 {sum(losses[-20:]) / 20:.3f}"


def test_associative_recall_criterion_fails_without_the_recurrence() -> None:
    """The same run with the recurrence output replaced by zeros must not pass the criterion."""
    ar = _example()

    def zero_recurrence(model) -> None:  # noqa: ANN001
        for block in model.blocks:
            run = block.mixer._recurrence

            def zeroed(*args, _run=run, **kwargs):  # noqa: ANN002, ANN003, ANN202
                out = _run(*args, **kwargs)
                out.o = torch.zeros_like(out.o)
                return out

            block.mixer._recurrence = zeroed

    losses = ar.main("specs/gdn.dgps", steps=STEPS, seed=0, backend="reference", verbose=False,
                     model_hook=zero_recurrence)
    assert not _learned(losses)
    assert sum(losses[-20:]) / 20 > 0.9 * math.log(8)  # stuck at the no-memory floor


def test_recall_model_step_kernel_matches_reference() -> None:
    """One training step's loss and every gradient of a 2-layer CLER model, kernels vs reference, with the
    zero-initialised route projections and Γ set non-zero so the route's backward is exercised."""
    ar = _example()
    torch.manual_seed(0)
    model = ar.RecallModel(str(SPECS / "cler_h_gdn.dgps"), vocab=16, d=32, n_layers=2, heads=2, head_dim=16)
    with torch.no_grad():
        for block in model.blocks:
            block.mixer.route_proj.weight.normal_(0, 0.1)
            block.mixer.cler_gamma.fill_(0.5)
    ids, labels = ar.make_batch(2, 4, 8, 8, 8, torch.Generator().manual_seed(0))

    def step():  # noqa: ANN202
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 16), labels.reshape(-1), ignore_index=-100)
        # the lowest routable layer has no lower residual to take, so its Γ is the one unused parameter
        names = [n for n, _ in model.named_parameters() if n != "blocks.0.mixer.cler_gamma"]
        params = dict(model.named_parameters())
        return loss.detach(), dict(zip(names, torch.autograd.grad(loss, [params[n] for n in names]), strict=True))

    loss_k, g_k = step()
    for block in model.blocks:
        block.mixer.backend = "reference"
    loss_r, g_r = step()
    torch.testing.assert_close(loss_k, loss_r.float(), rtol=1e-5, atol=1e-5)
    for n, g in g_k.items():
        assert torch.isfinite(g).all(), n
        scale = max(g_r[n].abs().max().item(), 1.0)
        torch.testing.assert_close(g, g_r[n].to(g.dtype), rtol=1e-3, atol=1e-4 * scale, msg=lambda m, n=n: f"{n}: {m}")
    assert g_k["blocks.1.mixer.cler_gamma"].abs() > 0


def test_example_picks_a_backend_that_finishes_on_the_cpu() -> None:
    """Run as a script with no --backend, the example trains on the reference without a GPU and says so."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(ROOT / "examples" / "associative_recall.py"), "--steps", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.stdout.splitlines()[0]
    assert first.startswith("backend: kernel" if torch.cuda.is_available() else "backend: reference (no GPU"), first
    assert "step    1" in r.stdout
