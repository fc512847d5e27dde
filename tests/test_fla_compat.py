"""dgps.fla_compat against fla-core 0.6.0: same signatures as FLA's chunk functions, same numbers as its naives.

For each entry point: FLA's public signature (parameter names, order, kinds and defaults, read from the source of
fla/ops/<op>/chunk.py with `ast`, so fla's Triton modules are never imported) equals ours; and on float32 inputs
(B, T, H, K = V small, the kernels run under TRITON_INTERPRET=1) our outputs and final states agree with FLA's
naive recurrent reference called on the same arguments (relative error by norm ≤ 1e-5), and the gradients of a
random linear loss with respect to every input and initial state agree with autograd through the naive
(≤ 1e-4). Naive argument orders follow docs/chunk_forms.md §9 (β before g in GDN, head-first DeltaNet, g before g_atk
in PKDA). Where a naive lacks a feature the chunk API has (GVA, cu_seqlens, in-kernel gates or L2 norm), the
reference is built around it from plain torch: keys repeated per value head, one naive call per sequence, the
gate/β/L2 maps applied before the call.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (tests/conftest.py does the same)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dgps  # noqa: E402
from dgps import fla_compat as fc  # noqa: E402
from dgps.runtime import fla_compat as impl  # noqa: E402

_FLA = importlib.util.find_spec("fla")
if _FLA is None or not _FLA.submodule_search_locations or importlib.util.find_spec("einops") is None:
    pytest.skip("fla-core 0.6.0 (and einops) is not installed: `pip install -e .[fla]`", allow_module_level=True)
_FLA_ROOT = Path(next(iter(_FLA.submodule_search_locations)))

OUT_TOL = 1e-5
GRAD_TOL = 1e-4
T = 33
D = 16


def _naive(op: str) -> ModuleType:
    """fla/ops/<op>/naive.py, loaded from its file (it imports only torch and einops; `import fla` is slow)."""
    path = _FLA_ROOT / "ops" / op / "naive.py"
    spec = importlib.util.spec_from_file_location(f"_fla_compat_naive_{op}", path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------------------------
# Signatures


def _fla_params(fn: str) -> list[tuple[str, str, object]]:
    """(name, kind, default) of FLA's public function, from its source."""
    path = _FLA_ROOT.parent / impl.FLA_SIGNATURES_FROM[fn]
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
    a = node.args
    assert not a.posonlyargs and not a.kwonlyargs and a.vararg is None
    defaults = [inspect.Parameter.empty] * (len(a.args) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    out = [(p.arg, "POSITIONAL_OR_KEYWORD", d) for p, d in zip(a.args, defaults, strict=True)]
    if a.kwarg is not None:
        out.append((a.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return out


@pytest.mark.parametrize("fn", sorted(impl.FLA_SIGNATURES_FROM))
def test_signature_matches_fla(fn):
    ours = [(p.name, p.kind.name, p.default) for p in inspect.signature(getattr(fc, fn)).parameters.values()]
    assert ours == _fla_params(fn)


def test_public_alias():
    assert sorted(fc.__all__) == sorted(impl.__all__)
    assert all(getattr(fc, n) is getattr(impl, n) for n in fc.__all__)
    assert fc.chunk_gdn is fc.chunk_gated_delta_rule


# ------------------------------------------------------------------------------------------------------------
# Inputs and the comparison


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=_gen(seed))).requires_grad_()


def unit_keys(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=_gen(seed)), dim=-1).requires_grad_()


def log_gate(*shape: int, seed: int) -> torch.Tensor:
    """Log decays in about [-1.3, -0.05]: logsigmoid of shifted normal draws."""
    return F.logsigmoid(torch.randn(*shape, generator=_gen(seed)) + 2.0).requires_grad_()


def unit(*shape: int, seed: int) -> torch.Tensor:
    return torch.sigmoid(torch.randn(*shape, generator=_gen(seed))).requires_grad_()


def rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return ((ours.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def check(ours: Callable[[], tuple], ref: Callable[[], tuple], leaves: dict[str, torch.Tensor], seed: int = 0) -> None:
    """Outputs (None where the reference has None) and gradients of a random linear loss through every leaf."""
    out, want = ours(), ref()
    assert len(out) == len(want)
    assert all(x.dtype == torch.float32 for x in out if x is not None)
    for i, (x, y) in enumerate(zip(out, want, strict=True)):
        assert (x is None) == (y is None), f"output {i}: ours {type(x).__name__}, FLA {type(y).__name__}"
        if y is not None:
            err = rel(x, y)
            print(f"output {i}: {err:.2e}")
            assert err <= OUT_TOL, f"output {i}: relative error {err:.2e}"
    ws = [None if y is None else torch.randn(y.shape, generator=_gen(1000 + seed + i), dtype=torch.float32)
          for i, y in enumerate(want)]
    names = [n for n, t in leaves.items() if t.requires_grad]
    tensors = [leaves[n] for n in names]

    def grads(outs: tuple) -> tuple[torch.Tensor, ...]:
        loss = sum((w * o).sum() for w, o in zip(ws, outs, strict=True) if w is not None)
        return torch.autograd.grad(loss, tensors, allow_unused=True)

    g_ours, g_ref = grads(out), grads(want)
    for n, a, b in zip(names, g_ours, g_ref, strict=True):
        assert b is not None, f"the reference does not depend on {n}"
        assert a is not None, f"no gradient for {n}"
        err = rel(a, b)
        print(f"d{n}: {err:.2e}")
        assert err <= GRAD_TOL, f"gradient of {n}: relative error {err:.2e}"


def per_sequence(call: Callable[..., tuple], cu: list[int], seq: dict[str, torch.Tensor], states: dict[str, torch.Tensor]
                 ) -> tuple:
    """A naive without cu_seqlens, run once per packed sequence; outputs concatenated (o on T, states on N)."""
    outs = []
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        outs.append(call(**{n: x[:, a:b] for n, x in seq.items()}, **{n: s[i:i + 1] for n, s in states.items()}))
    return tuple(torch.cat([o[j] for o in outs], dim=1 if j == 0 else 0) for j in range(len(outs[0])))


# ------------------------------------------------------------------------------------------------------------
# Simple GLA, GLA


def test_simple_gla():
    B, H = 2, 2
    x = dict(q=randn(B, T, H, D, seed=1), k=randn(B, T, H, D, seed=2), v=randn(B, T, H, D, seed=3),
             g=log_gate(B, T, H, seed=4), initial_state=randn(B, H, D, D, seed=5, scale=0.5))
    ref = _naive("simple_gla").naive_recurrent_simple_gla
    check(lambda: fc.chunk_simple_gla(**x, scale=0.3, output_final_state=True),
          lambda: ref(x["q"], x["k"], x["v"], x["g"], scale=0.3, initial_state=x["initial_state"], output_final_state=True),
          x)


def test_simple_gla_g_gamma_varlen_state_v_first():
    H, cu = 2, [0, 12, T]
    x = dict(q=randn(1, T, H, D, seed=11), k=randn(1, T, H, D, seed=12), v=randn(1, T, H, D, seed=13),
             g_gamma=(-torch.rand(H, generator=_gen(14)) - 0.05).requires_grad_(),
             h0=randn(2, H, D, D, seed=15, scale=0.5))  # [N, H, V, K]: state_v_first
    naive = _naive("simple_gla").naive_recurrent_simple_gla

    def ours():
        o, ht = fc.chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=x["g_gamma"], initial_state=x["h0"],
                                    output_final_state=True, state_v_first=True, cu_seqlens=torch.tensor(cu))
        return o, ht

    def ref():
        g = x["g_gamma"].view(1, 1, H).expand(1, T, H)

        def one(q, k, v, g, initial_state):
            o, s = naive(q, k, v, g, initial_state=initial_state, output_final_state=True)
            return o, s.transpose(-1, -2)
        return per_sequence(one, cu, dict(q=x["q"], k=x["k"], v=x["v"], g=g), dict(initial_state=x["h0"].transpose(-1, -2)))

    check(ours, ref, x)


def test_gla():
    B, H = 2, 2
    x = dict(q=randn(B, T, H, D, seed=21), k=randn(B, T, H, D, seed=22), v=randn(B, T, H, D, seed=23),
             g=log_gate(B, T, H, D, seed=24), initial_state=randn(B, H, D, D, seed=25, scale=0.5))
    ref = _naive("gla").naive_recurrent_gla  # scale hard-coded K^-1/2: our default
    check(lambda: fc.chunk_gla(**x, output_final_state=True),
          lambda: ref(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"], output_final_state=True), x)


# ------------------------------------------------------------------------------------------------------------
# DeltaNet, Gated DeltaNet


def _head_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


def test_delta_rule():
    B, H = 2, 2
    x = dict(q=randn(B, T, H, D, seed=31), k=unit_keys(B, T, H, D, seed=32), v=randn(B, T, H, D, seed=33),
             beta=unit(B, T, H, seed=34), initial_state=randn(B, H, D, D, seed=35, scale=0.5))
    naive = _naive("delta_rule").delta_rule_recurrence  # head-first [B, H, T, d], scale K^-1/2

    def ref():
        o, s = naive(*(_head_first(x[n]) for n in ("q", "k", "v", "beta")), initial_state=x["initial_state"],
                     output_final_state=True)
        return _head_first(o), s

    check(lambda: fc.chunk_delta_rule(**x, output_final_state=True), ref, x)


def test_delta_rule_l2norm_varlen():
    H, cu = 2, [0, 20, T]
    x = dict(q=randn(1, T, H, D, seed=41), k=randn(1, T, H, D, seed=42), v=randn(1, T, H, D, seed=43),
             beta=unit(1, T, H, seed=44), h0=randn(2, H, D, D, seed=45, scale=0.5))
    naive = _naive("delta_rule").delta_rule_recurrence

    def one(q, k, v, beta, initial_state):
        o, s = naive(*(_head_first(t) for t in (q, k, v, beta)), initial_state=initial_state, output_final_state=True)
        return _head_first(o), s

    check(lambda: fc.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], initial_state=x["h0"], output_final_state=True,
                                      use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(cu)),
          lambda: per_sequence(one, cu, dict(q=F.normalize(x["q"], dim=-1), k=F.normalize(x["k"], dim=-1), v=x["v"],
                                             beta=x["beta"]), dict(initial_state=x["h0"])),
          x)


def _gva(t: torch.Tensor, G: int) -> torch.Tensor:
    return t.repeat_interleave(G, dim=2)


def test_gated_delta_rule_gva_l2norm():
    B, H, HV = 2, 1, 2
    x = dict(q=randn(B, T, H, D, seed=51), k=randn(B, T, H, D, seed=52), v=randn(B, T, HV, D, seed=53),
             g=log_gate(B, T, HV, seed=54), beta=unit(B, T, HV, seed=55), initial_state=randn(B, HV, D, D, seed=56, scale=0.5))
    naive = _naive("gated_delta_rule").naive_recurrent_gated_delta_rule  # beta before g; no GVA, no L2 norm
    check(lambda: fc.chunk_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, scale=0.2),
          lambda: naive(_gva(F.normalize(x["q"], dim=-1), 2), _gva(F.normalize(x["k"], dim=-1), 2), x["v"], x["beta"],
                        x["g"], scale=0.2, initial_state=x["initial_state"], output_final_state=True),
          x)


def test_gated_delta_rule_fused_gate_beta_sigmoid_varlen():
    H, cu = 2, [0, 15, T]
    x = dict(q=randn(1, T, H, D, seed=61), k=unit_keys(1, T, H, D, seed=62), v=randn(1, T, H, D, seed=63),
             g=randn(1, T, H, seed=64), beta=randn(1, T, H, seed=65), A_log=randn(H, seed=66, scale=0.5),
             dt_bias=randn(H, seed=67, scale=0.5), h0=randn(2, H, D, D, seed=68, scale=0.5))
    naive = _naive("gated_delta_rule").naive_recurrent_gated_delta_rule

    def ours():
        return fc.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"],
                                         output_final_state=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                         state_v_first=True, cu_seqlens=torch.tensor(cu), use_gate_in_kernel=True,
                                         A_log=x["A_log"], dt_bias=x["dt_bias"])

    def ref():
        g = -x["A_log"].exp() * F.softplus(x["g"] + x["dt_bias"])
        beta = 2 * torch.sigmoid(x["beta"])

        def one(q, k, v, beta, g, initial_state):
            o, s = naive(q, k, v, beta, g, initial_state=initial_state, output_final_state=True)
            return o, s.transpose(-1, -2)
        return per_sequence(one, cu, dict(q=x["q"], k=x["k"], v=x["v"], beta=beta, g=g),
                            dict(initial_state=x["h0"].transpose(-1, -2)))

    check(ours, ref, x)


# ------------------------------------------------------------------------------------------------------------
# KDA, GDN2


def test_kda_gva():
    B, H, HV = 1, 2, 4
    x = dict(q=randn(B, T, H, D, seed=71), k=unit_keys(B, T, H, D, seed=72), v=randn(B, T, HV, D, seed=73),
             g=log_gate(B, T, HV, D, seed=74), beta=unit(B, T, HV, seed=75),
             initial_state=randn(B, HV, D, D, seed=76, scale=0.5))
    naive = _naive("kda").naive_recurrent_kda  # supports GVA
    check(lambda: fc.chunk_kda(**x, output_final_state=True),
          lambda: naive(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True),
          x)


def test_kda_disable_recompute_keeps_the_states(monkeypatch: pytest.MonkeyPatch):
    """disable_recompute=True: the same numbers against FLA's naive, and the backward launches no state pass (the
    forward kept H_n and U, as FLA's does)."""
    B, H = 1, 2
    x = dict(q=randn(B, T, H, D, seed=81), k=unit_keys(B, T, H, D, seed=82), v=randn(B, T, H, D, seed=83),
             g=log_gate(B, T, H, D, seed=84), beta=unit(B, T, H, seed=85),
             initial_state=randn(B, H, D, D, seed=86, scale=0.5))
    launched: list[str] = []
    chunk = impl.compiled(impl._spec("fla_kda", "FLA chunk_kda", ["input q, k : key", "input v : value",
                                                                 "input g : key_channel log_gate",
                                                                 "input beta : token unit"], [], False,
                                     ["decay vector(g)", "gain beta", "solve delta"])).chunk
    launch = chunk._Run.launch

    def record(self, kernels):  # noqa: ANN001, ANN202
        launched.extend(k[0] for k in kernels)
        return launch(self, kernels)

    monkeypatch.setattr(chunk._Run, "launch", record)
    naive = _naive("kda").naive_recurrent_kda
    check(lambda: fc.chunk_kda(**x, output_final_state=True, disable_recompute=True),
          lambda: naive(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True),
          x)
    assert launched.count("state_pass") == 1, launched  # the forward's; the default backward runs it again
    launched.clear()
    out, _ = fc.chunk_kda(**x, output_final_state=True)
    out.sum().backward()
    assert launched.count("state_pass") == 2, launched


def test_kda_lower_bound_gate_l2norm_beta_sigmoid_varlen():
    H, cu = 2, [0, 9, T]
    x = dict(q=randn(1, T, H, D, seed=81), k=randn(1, T, H, D, seed=82), v=randn(1, T, H, D, seed=83),
             g=randn(1, T, H, D, seed=84), beta=randn(1, T, H, seed=85), A_log=randn(H, seed=86, scale=0.5),
             dt_bias=randn(H * D, seed=87, scale=0.5), h0=randn(2, H, D, D, seed=88, scale=0.5))
    naive = _naive("kda").naive_recurrent_kda

    def ours():
        return fc.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True,
                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                            safe_gate=True, lower_bound=-5.0, cu_seqlens=torch.tensor(cu), A_log=x["A_log"],
                            dt_bias=x["dt_bias"])

    def ref():
        g = -5.0 * torch.sigmoid(x["A_log"].exp().view(H, 1) * (x["g"] + x["dt_bias"].view(H, D)))
        return per_sequence(lambda **a: naive(**a, output_final_state=True), cu,
                            dict(q=F.normalize(x["q"], dim=-1), k=F.normalize(x["k"], dim=-1), v=x["v"], g=g,
                                 beta=torch.sigmoid(x["beta"])), dict(initial_state=x["h0"]))

    check(ours, ref, x)


def test_gdn2():
    B, H = 2, 2
    x = dict(q=randn(B, T, H, D, seed=91), k=unit_keys(B, T, H, D, seed=92), v=randn(B, T, H, D, seed=93),
             g=log_gate(B, T, H, D, seed=94), b=unit(B, T, H, D, seed=95), w=unit(B, T, H, D, seed=96),
             initial_state=randn(B, H, D, D, seed=97, scale=0.5))
    naive = _naive("gdn2").naive_recurrent_gdn2
    check(lambda: fc.chunk_gdn2(**x, output_final_state=True, scale=0.4),
          lambda: naive(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], scale=0.4, initial_state=x["initial_state"],
                        output_final_state=True),
          x)


def test_gdn2_fused_gate_l2norm_varlen():
    H, cu = 2, [0, 30, T]
    x = dict(q=randn(1, T, H, D, seed=101), k=randn(1, T, H, D, seed=102), v=randn(1, T, H, D, seed=103),
             g=randn(1, T, H, D, seed=104), b=unit(1, T, H, D, seed=105), w=unit(1, T, H, D, seed=106),
             A_log=randn(H, seed=107, scale=0.5), dt_bias=randn(H * D, seed=108, scale=0.5))
    naive = _naive("gdn2").naive_recurrent_gdn2

    def ref():
        g = -x["A_log"].exp().view(H, 1) * F.softplus(x["g"] + x["dt_bias"].view(H, D))
        return per_sequence(lambda **a: naive(**a, output_final_state=True), cu,
                            dict(q=F.normalize(x["q"], dim=-1), k=F.normalize(x["k"], dim=-1), v=x["v"], g=g, b=x["b"],
                                 w=x["w"]), {})

    check(lambda: fc.chunk_gdn2(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"], output_final_state=True,
                                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, cu_seqlens=torch.tensor(cu),
                                A_log=x["A_log"], dt_bias=x["dt_bias"]),
          ref, x)


# ------------------------------------------------------------------------------------------------------------
# PGDN, PKDA


def test_precond_gated_delta_rule_gva():
    B, H, HV = 1, 2, 4
    x = dict(q=randn(B, T, H, D, seed=111), k=randn(B, T, H, D, seed=112), v=randn(B, T, HV, D, seed=113),
             g_atk=log_gate(B, T, H, seed=114), g=log_gate(B, T, HV, seed=115), beta_atk=unit(B, T, H, seed=116),
             beta=unit(B, T, HV, seed=117), initial_state=randn(B, HV, D, D, seed=118, scale=0.5),
             initial_A_state=(0.1 * torch.rand(B, H, D, generator=_gen(119))).requires_grad_(),
             log_atk_scale=(-0.2 + 0.3 * torch.randn(H, generator=_gen(120))).requires_grad_())
    naive = _naive("precond_gated_delta_rule").naive_recurrent_precond_gated_delta_rule  # L2-normalises q, k itself
    check(lambda: fc.chunk_precond_gated_delta_rule(**x, output_final_state=True, x=1.7, eps=1e-5),
          lambda: naive(**x, output_final_state=True, x=1.7, eps=1e-5), x)


def test_precond_gated_delta_rule_varlen_no_l2norm():
    H, cu = 2, [0, 17, T]
    x = dict(q=randn(1, T, H, D, seed=121), k=unit_keys(1, T, H, D, seed=122), v=randn(1, T, H, D, seed=123),
             g_atk=log_gate(1, T, H, seed=124), g=log_gate(1, T, H, seed=125), beta_atk=unit(1, T, H, seed=126),
             beta=unit(1, T, H, seed=127), initial_state=randn(2, H, D, D, seed=128, scale=0.5))
    naive = _naive("precond_gated_delta_rule")
    # The naive always L2-normalises q and k (F.normalize); without the in-kernel norm the reference is the naive
    # with F.normalize made the identity (its only use of F).
    naive.F = SimpleNamespace(normalize=lambda t, p=2, dim=-1: t)
    check(lambda: fc.chunk_precond_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=False,
                                                    cu_seqlens=torch.tensor(cu)),
          lambda: naive.naive_recurrent_precond_gated_delta_rule(**x, output_final_state=True, cu_seqlens=torch.tensor(cu)),
          x)


def test_precond_kda():
    B, H = 2, 2
    x = dict(q=randn(B, T, H, D, seed=131), k=randn(B, T, H, D, seed=132), v=randn(B, T, H, D, seed=133),
             g=log_gate(B, T, H, D, seed=134), g_atk=log_gate(B, T, H, seed=135), beta_atk=unit(B, T, H, seed=136),
             beta=unit(B, T, H, seed=137), initial_state=randn(B, H, D, D, seed=138, scale=0.5),
             initial_A_state=(0.1 * torch.rand(B, H, D, generator=_gen(139))).requires_grad_(),
             log_atk_scale=(-0.2 + 0.3 * torch.randn(H, generator=_gen(140))).requires_grad_())
    naive = _naive("precond_kda").naive_recurrent_precond_kda  # g before g_atk; no L2 norm (FLA's chunk always has it)
    check(lambda: fc.chunk_precond_kda(**x, output_final_state=True, scale=0.3),
          lambda: naive(**{**x, "q": F.normalize(x["q"], dim=-1), "k": F.normalize(x["k"], dim=-1)}, scale=0.3,
                        output_final_state=True),
          x)


def test_precond_kda_fused_gate_transposed_state():
    B, H = 1, 2
    x = dict(q=randn(B, T, H, D, seed=141), k=randn(B, T, H, D, seed=142), v=randn(B, T, H, D, seed=143),
             g=randn(B, T, H, D, seed=144), g_atk=log_gate(B, T, H, seed=145), beta_atk=unit(B, T, H, seed=146),
             beta=unit(B, T, H, seed=147), h0=randn(B, H, D, D, seed=148, scale=0.5),  # [N, H, V, K]
             A_log=randn(H, seed=149, scale=0.5), dt_bias=randn(H * D, seed=150, scale=0.5))
    naive = _naive("precond_kda").naive_recurrent_precond_kda

    def ours():
        return fc.chunk_precond_kda(x["q"], x["k"], x["v"], x["g"], x["g_atk"], x["beta_atk"], x["beta"],
                                    initial_state=x["h0"], output_final_state=True, use_gate_in_kernel=True,
                                    transpose_state_layout=True, A_log=x["A_log"], dt_bias=x["dt_bias"])

    def ref():
        g = -x["A_log"].exp().view(H, 1) * F.softplus(x["g"] + x["dt_bias"].view(H, D))
        o, s, a = naive(F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1), x["v"], g, x["g_atk"], x["beta_atk"],
                        x["beta"], initial_state=x["h0"].transpose(-1, -2), output_final_state=True)
        return o, s.transpose(-1, -2), a

    check(ours, ref, x)


# ------------------------------------------------------------------------------------------------------------
# Returns without final states, options dgps does not honour, bad arguments (no kernel runs)


def test_no_final_state_returns_none():
    q, k, v = torch.randn(1, 4, 1, D), F.normalize(torch.randn(1, 4, 1, D), dim=-1), torch.randn(1, 4, 1, D)
    g, beta = F.logsigmoid(torch.randn(1, 4, 1)), torch.rand(1, 4, 1)
    o, ht = fc.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, scale=0.2)
    assert o.shape == v.shape and ht is None
    ones = torch.ones(1, 4, 1)
    out = fc.chunk_precond_gated_delta_rule(q, k, v, 0 * ones, g, ones, beta, use_qk_l2norm_in_kernel=False)
    assert out[0].shape == v.shape and out[1:] == (None, None)


@pytest.mark.parametrize("fn, kwargs, needle", [
    ("chunk_kda", {"return_intermediate_states": True}, "return_intermediate_states"),
    ("chunk_kda", {"use_graph": True}, "use_graph"),
    ("chunk_gdn2", {"return_intermediate_states": True}, "return_intermediate_states"),
    ("chunk_precond_gated_delta_rule", {"cp_context": object()}, "cp_context"),
    ("chunk_precond_kda", {"return_intermediate_states": True}, "return_intermediate_states"),
])
def test_unsupported_options(fn, kwargs, needle):
    q = torch.randn(1, 4, 1, D)
    args = {"chunk_gated_delta_rule": 2, "chunk_kda": 2, "chunk_gdn2": 3, "chunk_precond_gated_delta_rule": 4,
            "chunk_precond_kda": 4}[fn]
    with pytest.raises(NotImplementedError, match=needle):
        getattr(fc, fn)(q, q, q, *([q] * args), **kwargs)


@pytest.mark.parametrize("fn", ["chunk_gated_delta_rule", "chunk_kda"])
def test_cp_context_must_be_flas(fn):
    # GDN and KDA take FLA's cp_context (tests/test_context_parallel.py runs them on gloo); anything else is refused
    q = torch.randn(1, 4, 1, D)
    with pytest.raises(TypeError, match="FLACPContext"):
        getattr(fc, fn)(q, q, q, q if fn == "chunk_kda" else q[..., 0], q[..., 0], cp_context=object())


def test_bad_arguments():
    q, g, beta = torch.randn(2, 8, 2, D), torch.zeros(2, 8, 2), torch.ones(2, 8, 2)
    with pytest.raises(dgps.TensorError, match="same shape"):
        fc.chunk_gated_delta_rule(q, q[:, :, :1], q, g, beta)
    with pytest.raises(dgps.TensorError, match="multiple"):
        fc.chunk_gated_delta_rule(q, q, torch.randn(2, 8, 3, D), g, beta)
    with pytest.raises(dgps.TensorError, match="B = 1"):
        fc.chunk_gated_delta_rule(q, q, q, g, beta, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(TypeError, match="A_lgo"):
        fc.chunk_gated_delta_rule(q, q, q, g, beta, use_gate_in_kernel=True, A_lgo=torch.zeros(2))
    with pytest.raises(ValueError, match="A_log"):
        fc.chunk_gated_delta_rule(q, q, q, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="use_beta_sigmoid_in_kernel"):
        fc.chunk_gated_delta_rule(q, q, q, g, beta, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="lower_bound"):
        fc.chunk_kda(q, q, q, q, beta, use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2))
    with pytest.raises(dgps.TensorError, match="dt_bias"):
        fc.chunk_kda(q, q, q, q, beta, use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(3))
    with pytest.raises(dgps.TensorError, match="g_gamma"):
        fc.chunk_simple_gla(q, q, q, g_gamma=torch.zeros(3))
    with pytest.raises(dgps.TensorError, match="log_atk_scale"):
        fc.chunk_precond_gated_delta_rule(q, q, q, g, g, beta, beta, log_atk_scale=torch.zeros(3))
    with pytest.raises(dgps.TensorError, match="beta"):  # the compiled package's own check names the tensor
        fc.chunk_gated_delta_rule(q, q, q, g, beta[:, :, :1])


# ------------------------------------------------------------------------------------------------------------
# Generalized delta rule "dplr" (RWKV-7: a = −κ̂, b = κ̂ ⊙ ι)


def _rwkv7_like(B: int, T_: int, H: int, seed: int) -> dict[str, torch.Tensor]:
    kap = F.normalize(torch.randn(B, T_, H, D, generator=_gen(seed)), dim=-1)
    iclr = torch.sigmoid(torch.randn(B, T_, H, D, generator=_gen(seed + 1)))
    return dict(q=randn(B, T_, H, D, seed=seed + 2), k=randn(B, T_, H, D, seed=seed + 3, scale=0.5),
                v=randn(B, T_, H, D, seed=seed + 4), a=(-kap).requires_grad_(), b=(kap * iclr).requires_grad_(),
                gk=log_gate(B, T_, H, D, seed=seed + 5))


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_chunk_dplr_delta_rule(varlen):
    """Against FLA's naive dplr_recurrence (head-first, scale K^-1/2, S ← S·exp(gk) + b (aᵀ S) + k vᵀ): o, the final
    state and every gradient (q, k, v, a, b, gk, initial state); with cu_seqlens the naive runs once per sequence."""
    naive = _naive("generalized_delta_rule/dplr").dplr_recurrence
    names = ("q", "k", "v", "a", "b", "gk")

    def one(q, k, v, a, b, gk, initial_state):  # noqa: ANN001, ANN202
        o, s = naive(*(_head_first(t) for t in (q, k, v, a, b, gk)), initial_state=initial_state,
                     output_final_state=True)
        return _head_first(o), s

    if varlen:
        cu = [0, 20, 70, 90]
        x = _rwkv7_like(1, 90, 2, seed=81)
        x["initial_state"] = randn(3, 2, D, D, seed=88, scale=0.5)
        check(lambda: fc.chunk_dplr_delta_rule(*(x[n] for n in names), initial_state=x["initial_state"],
                                               output_final_state=True, cu_seqlens=torch.tensor(cu)),
              lambda: per_sequence(one, cu, {n: x[n] for n in names}, dict(initial_state=x["initial_state"])), x)
    else:
        x = _rwkv7_like(2, 100, 2, seed=71)
        x["initial_state"] = randn(2, 2, D, D, seed=78, scale=0.5)
        check(lambda: fc.chunk_dplr_delta_rule(*(x[n] for n in names), initial_state=x["initial_state"],
                                               output_final_state=True),
              lambda: one(*(x[n] for n in names), x["initial_state"]), x)
