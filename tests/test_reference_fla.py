"""Differential tests: the reference derived from each spec against FLA 0.6.0's naive recurrent references.

This is the check that our reading of the canonical recurrence (README, "The spec language") is the field's:
same float64 inputs, outputs and final states (S, and PGDN/PKDA's statistic A) agree to 1e-10 of the output's
size. Argument conventions follow docs/chunk_forms.md §9 (β before g in GDN, head-first DeltaNet, g before g_atk
in PKDA, FLA's state h = Sᵀ, which is also the layout our states use).

The naive references are loaded straight from their files (`fla/ops/<op>/naive.py`): they import only torch,
torch.nn.functional and einops, and this skips `import fla`, which pulls in every Triton kernel (~15 s).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

import dgps

SPECS = Path(__file__).resolve().parent.parent / "specs"
TOL = 1e-10

_FLA = importlib.util.find_spec("fla")
if _FLA is None or not _FLA.submodule_search_locations or importlib.util.find_spec("einops") is None:
    pytest.skip("fla-core 0.6.0 (and einops) is not installed: `pip install -e .[fla]` to run the FLA differential tests",
                allow_module_level=True)
_FLA_OPS = Path(next(iter(_FLA.submodule_search_locations))) / "ops"


def _naive(op: str) -> ModuleType:
    path = _FLA_OPS / op / "naive.py"
    spec = importlib.util.spec_from_file_location(f"_fla_naive_{op.replace('/', '_')}", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Float64Torch:
    """Stands in for the `torch` module inside a naive reference: `torch.float` / `torch.float32` are float64.

    Several FLA naives cast their inputs to fp32 (`.to(torch.float32)`, `.to(torch.float)`, `dtype=torch.float32`),
    which would cap agreement at ~1e-7. Rather than loosen the tolerance, the naive module's global name `torch`
    is replaced by this proxy during the call; everything but the two dtype names delegates to the real torch.
    """

    float = torch.float64
    float32 = torch.float64

    def __getattr__(self, name: str):
        return getattr(torch, name)


@pytest.fixture
def float64_naive(monkeypatch):
    """Call a naive reference in float64: patch its module's `torch` (see _Float64Torch) and, for the naives
    that cast with the tensor method `x.float()`, make `Tensor.float` return float64 for the duration."""

    def call(mod: ModuleType, fn: str, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(mod, "torch", _Float64Torch())
            m.setattr(torch.Tensor, "float", lambda self, *a, **kw: self.to(torch.float64))
            out = getattr(mod, fn)(*args, **kwargs)
        for x in (out,) if isinstance(out, torch.Tensor) else out:
            assert x is None or x.dtype == torch.float64, f"{fn} still computed in {x.dtype}"
        return out

    return call


def load(name: str, normalize_eps: float | None = None) -> dgps.Recurrence:
    """A spec from specs/; with `normalize_eps`, the variant whose L2 norm is x/√(Σx² + eps).

    FLA's naive GDN takes q, k as given and its naive PGDN normalises with F.normalize (x/max(‖x‖, 1e-12)),
    while our specs normalise with eps = 1e-6 under the square root (the fused kernels' convention). That
    shifts unit-norm inputs by a factor (1 + 1e-6)^-1/2, ~5e-7, so pre-normalised inputs cannot reach 1e-10
    against the stock spec; the variant with eps = 1e-30 agrees to rounding with F.normalize.
    """
    text = (SPECS / f"{name}.dgps").read_text()
    if normalize_eps is not None:
        assert "normalize q, k\n" in text, name
        text = text.replace("normalize q, k\n", f"normalize q, k, eps = {normalize_eps!r}\n")
    return dgps.load(text, filename=f"{name}.dgps")


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Max abs error relative to the size (max abs) of FLA's tensor."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype == torch.float64
    return ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-300)).item()


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    err = rel_err(ours, theirs)
    print(f"{what}: {err:.2e}")  # shown with `pytest -s`: the measured agreement
    assert err < TOL, f"{what}: relative error {err:.3e} vs FLA"


def state0(N: int, HV: int, dk: int, dv: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(10_000 + seed)
    return 0.5 * torch.randn(N, HV, dk, dv, generator=gen, dtype=torch.float64)


def a_state0(N: int, H: int, dk: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(20_000 + seed)
    return torch.rand(N, H, dk, generator=gen, dtype=torch.float64) * 2.0


B, T, H, DK, DV = 2, 12, 2, 8, 6
SEEDS = [0, 1]


@pytest.mark.parametrize("seed", SEEDS)
def test_simple_gla(float64_naive, seed):
    rec = load("simple_gla")
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    scale = 0.37  # naive_recurrent_simple_gla takes a scale: check it is the same factor
    ours = rec.reference(**x, initial_state=S0, output_final_state=True, scale=scale)
    o, S = float64_naive(_naive("simple_gla"), "naive_recurrent_simple_gla", x["q"], x["k"], x["v"], x["g"],
                         scale=scale, initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_gla(float64_naive, seed):
    rec = load("gla")
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    # naive_recurrent_gla hard-codes scale = K^-1/2, which is our default
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    o, S = float64_naive(_naive("gla"), "naive_recurrent_gla", x["q"], x["k"], x["v"], x["g"],
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_deltanet(float64_naive, seed):
    rec = load("deltanet")
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    # delta_rule_recurrence is head-first ([B, H, T, d]; β [B, H, T]) with the scale fixed to K^-1/2
    hf = [x[n].transpose(1, 2).contiguous() for n in ("q", "k", "v", "beta")]
    o, S = float64_naive(_naive("delta_rule"), "delta_rule_recurrence", *hf,
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o.transpose(1, 2), "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_gdn(float64_naive, seed):
    rec = load("gdn", normalize_eps=1e-30)
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    # FLA's naive GDN does no L2 norm (the fused kernels do it with use_qk_l2norm_in_kernel): feed it normalised q, k.
    # Note the order: β before g.
    q, k = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    o, S = float64_naive(_naive("gated_delta_rule"), "naive_recurrent_gated_delta_rule", q, k, x["v"],
                         x["beta"], x["g"], initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_gdn_fused_gate(float64_naive, seed):
    rec = load("gdn_fused_gate", normalize_eps=1e-30)
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    # FLA's GatedDeltaNet layer computes the gates outside the kernel; do it by hand here
    g = -x["A_log"].exp() * F.softplus(x["a"] + x["dt_bias"])
    beta = torch.sigmoid(x["b"])
    q, k = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    o, S = float64_naive(_naive("gated_delta_rule"), "naive_recurrent_gated_delta_rule", q, k, x["v"], beta, g,
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_kda_gva(float64_naive, seed):
    rec = load("kda")
    HV = 2 * H  # grouped value heads: two value heads share each q/k head
    x = rec.random_inputs(B, T, H, DK, DV, HV=HV, seed=seed)
    assert x["g"].shape == (B, T, HV, DK) and x["beta"].shape == (B, T, HV)
    S0 = state0(B, HV, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    o, S = float64_naive(_naive("kda"), "naive_recurrent_kda", x["q"], x["k"], x["v"], x["g"], x["beta"],
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_gdn2(float64_naive, seed):
    rec = load("gdn2")
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    o, S = float64_naive(_naive("gdn2"), "naive_recurrent_gdn2", x["q"], x["k"], x["v"], x["g"], x["b"], x["w"],
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


def _pgdn_inputs(seed: int, HV: int):
    rec = load("pgdn", normalize_eps=1e-30)
    x = rec.random_inputs(B, T, H, DK, DV, HV=HV, seed=seed)
    # the centre μ is a learned per-key-head parameter: use distinct values, not the default −0.2
    x["mu"] = torch.tensor([-0.2, 0.7][:H], dtype=torch.float64)
    return rec, x


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("HV", [H, 2 * H])
def test_pgdn(float64_naive, seed, HV):
    rec, x = _pgdn_inputs(seed, HV)
    S0, A0 = state0(B, HV, DK, DV, seed), a_state0(B, H, DK, seed)
    ours = rec.reference(**x, initial_state={"S": S0, "A": A0}, output_final_state=True)
    # L2 normalisation happens inside the naive (F.normalize); g_atk before g, beta_atk before beta
    o, S, A = float64_naive(_naive("precond_gated_delta_rule"), "naive_recurrent_precond_gated_delta_rule",
                            x["q"], x["k"], x["v"], x["gP"], x["g"], x["betaP"], x["beta"],
                            initial_state=S0.clone(), initial_A_state=A0.clone(), output_final_state=True,
                            x=1.5, eps=1e-6, log_atk_scale=x["mu"])
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")
    assert_close(ours.final_state["A"], A, "A")


def test_pgdn_varlen(float64_naive):
    """FLA's naive PGDN also takes cu_seqlens: packed sequences with per-sequence initial states."""
    rec = load("pgdn", normalize_eps=1e-30)
    cu = torch.tensor([0, 5, 6, 13, 20])
    N, HV = len(cu) - 1, 2 * H
    x = rec.random_inputs(1, int(cu[-1]), H, DK, DV, HV=HV, seed=3)
    S0, A0 = state0(N, HV, DK, DV, 3), a_state0(N, H, DK, 3)
    ours = rec.reference(**x, initial_state={"S": S0, "A": A0}, output_final_state=True, cu_seqlens=cu)
    o, S, A = float64_naive(_naive("precond_gated_delta_rule"), "naive_recurrent_precond_gated_delta_rule",
                            x["q"], x["k"], x["v"], x["gP"], x["g"], x["betaP"], x["beta"],
                            initial_state=S0.clone(), initial_A_state=A0.clone(), output_final_state=True,
                            log_atk_scale=x["mu"], cu_seqlens=cu)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")
    assert_close(ours.final_state["A"], A, "A")


@pytest.mark.parametrize("seed", SEEDS)
def test_pkda(float64_naive, seed):
    rec = load("pkda")
    # naive_recurrent_precond_kda has no GVA (it indexes one head count throughout): HV = H
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    x["mu"] = torch.tensor([0.3, -0.9][:H], dtype=torch.float64)
    S0, A0 = state0(B, H, DK, DV, seed), a_state0(B, H, DK, seed)
    ours = rec.reference(**x, initial_state={"S": S0, "A": A0}, output_final_state=True)
    # note the order here: g before g_atk; no L2 norm inside (and none in our pkda spec)
    o, S, A = float64_naive(_naive("precond_kda"), "naive_recurrent_precond_kda",
                            x["q"], x["k"], x["v"], x["g"], x["gP"], x["betaP"], x["beta"],
                            initial_state=S0.clone(), initial_A_state=A0.clone(), output_final_state=True,
                            x=1.5, eps=1e-6, log_atk_scale=x["mu"])
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")
    assert_close(ours.final_state["A"], A, "A")


def test_float64_proxy_matters(float64_naive):
    """The proxy is what makes 1e-10 reachable: the unpatched naive (fp32 inside) misses it, the patched one meets it.

    This keeps the tolerance honest: if a future FLA dropped the fp32 casts, or the patch stopped reaching them,
    this would say so instead of the comparisons silently testing something else.
    """
    rec = load("kda")
    x = rec.random_inputs(B, T, H, DK, DV, seed=0)
    ours = rec.reference(**x).o
    mod = _naive("kda")
    o32, _ = mod.naive_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])
    o64, _ = float64_naive(mod, "naive_recurrent_kda", x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert rel_err(ours, o32.to(torch.float64)) > 1e-9
    assert rel_err(ours, o64) < TOL


# Systems beyond the brief's list that FLA also has a naive reference for: the same check, for free.


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_attention(float64_naive, seed):
    rec = load("la")
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    o, S = float64_naive(_naive("linear_attn"), "naive_recurrent_linear_attn", x["q"], x["k"], x["v"],
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


@pytest.mark.parametrize("seed", SEEDS)
def test_retnet(float64_naive, seed):
    rec = load("retnet")
    heads = 3  # γ_h = 1 − 2^(−5−h) depends on the head index: use a few
    x = rec.random_inputs(B, T, heads, DK, DV, seed=seed)
    ours = rec.reference(**x)
    # naive_retention is parallel (no state) and head-first
    o = float64_naive(_naive("retention"), "naive_retention", *(x[n].transpose(1, 2) for n in ("q", "k", "v")))
    assert_close(ours.o, o.transpose(1, 2), "o")


def test_pdn_is_pgdn_without_decay(float64_naive):
    """PDN (no decay) against FLA's naive PGDN with g = 0."""
    rec = load("pdn", normalize_eps=1e-30)
    x = rec.random_inputs(B, T, H, DK, DV, HV=2 * H, seed=5)
    x["mu"] = torch.tensor([0.1, -0.5], dtype=torch.float64)
    S0, A0 = state0(B, 2 * H, DK, DV, 5), a_state0(B, H, DK, 5)
    ours = rec.reference(**x, initial_state={"S": S0, "A": A0}, output_final_state=True)
    o, S, A = float64_naive(_naive("precond_gated_delta_rule"), "naive_recurrent_precond_gated_delta_rule",
                            x["q"], x["k"], x["v"], x["gP"], torch.zeros_like(x["beta"]), x["betaP"], x["beta"],
                            initial_state=S0.clone(), initial_A_state=A0.clone(), output_final_state=True,
                            log_atk_scale=x["mu"])
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")
    assert_close(ours.final_state["A"], A, "A")


def test_mamba2_is_simple_gla_with_dt(float64_naive):
    """Mamba2's SSD recurrence is simple GLA with g = −exp(A_log)·Δ and the input scaled by Δ (scale 1)."""
    rec = load("mamba2")
    x = rec.random_inputs(B, T, H, DK, DV, seed=6)
    S0 = state0(B, H, DK, DV, 6)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True)
    dt = F.softplus(x["a"] + x["dt_bias"])
    g = -x["A_log"].exp() * dt
    o, S = float64_naive(_naive("simple_gla"), "naive_recurrent_simple_gla", x["q"], x["k"] * dt.unsqueeze(-1), x["v"],
                         g, scale=1.0, initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o, "o")
    assert_close(ours.final_state["S"], S, "S")


def _rwkv7_naive_args(x: dict[str, torch.Tensor], eps: float | None) -> tuple[torch.Tensor, ...]:
    """FLA's dplr_recurrence arguments for our RWKV-7 inputs: [B, H, T, D] layout, alpha = a = −κ̂ (the erase
    read), beta = b = κ̂ ⊙ ι (where it writes), gk = w (log decay). κ̂ is formed here, outside the spec:
    with `eps` as x/√(Σx² + eps) (the spec's l2norm), with None as RWKV-7's F.normalize (x / ‖x‖)."""
    kappa = x["kappa"]
    if eps is None:
        khat = torch.nn.functional.normalize(kappa, dim=-1)
    else:
        khat = kappa / torch.sqrt((kappa * kappa).sum(-1, keepdim=True) + eps)
    # contiguous: given transposed views, the naive's output buffer (zeros_like(v)) comes back scrambled
    return tuple(t.transpose(1, 2).contiguous() for t in (x["q"], x["k"], x["v"], -khat, khat * x["iclr"], x["w"]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", ["spec", "F.normalize"])
def test_rwkv7(float64_naive, seed, variant):
    """RWKV-7 (specs/rwkv7_dplr.dgps) against FLA's naive generalized-delta-rule recurrence
    (fla/ops/generalized_delta_rule/dplr/naive.py: dplr_recurrence), the same inputs in float64.

    dplr_recurrence computes S ← S·exp(gk) + β (αᵀ S) + k vᵀ (S = [dk, dv], the erase reads the undecayed
    state, as FLA's fused RWKV-7 kernel with a = −kk, b = kk·a) and hard-codes the read scale dk^-1/2, which
    we pass as `scale` (the spec's own is 1.0, RWKV-7's r is unscaled). The 'F.normalize' variant checks the
    removal key against RWKV-7's own normalisation, with the spec's eps set to 1e-30 (see `load`)."""
    text = (SPECS / "rwkv7_dplr.dgps").read_text()
    if variant == "F.normalize":
        assert "l2norm(kappa)" in text
        text = text.replace("l2norm(kappa)", "l2norm(kappa, 1e-30)")
    rec = dgps.load(text, filename="rwkv7_dplr.dgps")
    x = rec.random_inputs(B, T, H, DK, DV, seed=seed)
    S0 = state0(B, H, DK, DV, seed)
    ours = rec.reference(**x, initial_state=S0, output_final_state=True, scale=DK ** -0.5)
    q, k, v, alpha, beta, gk = _rwkv7_naive_args(x, 1e-6 if variant == "spec" else None)
    o, S = float64_naive(_naive("generalized_delta_rule/dplr"), "dplr_recurrence", q, k, v, alpha, beta, gk,
                         initial_state=S0.clone(), output_final_state=True)
    assert_close(ours.o, o.transpose(1, 2), "o")
    assert_close(ours.final_state["S"], S, "S")
