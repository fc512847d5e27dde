"""Properties of the sequential reference that hold for any inputs (hypothesis draws shapes and seeds).

Each property is a statement about what a spec *means* (README, "The spec language"), checked independently of how the
reference computes it: the ridge-regression identity for exact ATQ/ATK, the CCQ contraction, packing
(cu_seqlens), continuation from returned states, grouped value heads, gradients, extreme gates and errors.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dgps
from dgps.runtime.reference import state_shapes
from dgps.runtime.tensors import Dims

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"
ALL_SPECS = sorted(p.stem for p in SPECS_DIR.glob("*.dgps"))
# keeps hypothesis fast and deterministic in CI
FAST = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def load(name: str) -> dgps.Recurrence:
    return dgps.load(SPECS_DIR / f"{name}.dgps")


def close(ours: torch.Tensor | None, want: torch.Tensor | None, tol: float, what: str) -> None:
    """max |ours − want| ≤ tol · max |want| (exact equality when want is all zeros)."""
    assert (ours is None) == (want is None), what
    if want is None:
        return
    assert ours.shape == want.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(want.shape)}"
    err = (ours - want).abs().max().item()
    size = want.abs().max().item()
    assert err <= tol * size, f"{what}: max abs error {err:.3e} (size {size:.3e}, tol {tol:g})"


def random_states(rec: dgps.Recurrence, dims: Dims, N: int, seed: int) -> dict[str, torch.Tensor]:
    """Valid initial states for every state the spec carries.

    S is arbitrary; a diagonal statistic A is positive; P is an inverse Gram (λI + Σ kkᵀ)^-1 and C, m, n
    are the running sums of a random prefix of unit keys, so every state is one the recurrence can reach.
    """
    gen = torch.Generator().manual_seed(seed + 7919)
    ir = rec.ir
    out: dict[str, torch.Tensor] = {}
    for name, shape in state_shapes(ir, dims, N).items():
        if name == "S":
            out[name] = 0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "A":
            out[name] = 0.1 + 2 * torch.rand(shape, generator=gen, dtype=torch.float64)
        elif name == "P":
            keys = F.normalize(torch.randn(*shape[:2], 3, dims.dk, generator=gen, dtype=torch.float64), dim=-1)
            gram = ir.precond.lam * torch.eye(dims.dk, dtype=torch.float64) + keys.transpose(-1, -2) @ keys
            out[name] = torch.linalg.inv(gram)
    if "C" in ir.state_names:
        counts = torch.randint(1, 5, (N,), generator=gen)
        keys = F.normalize(torch.randn(N, dims.H, 4, dims.dk, generator=gen, dtype=torch.float64), dim=-1)
        mask = (torch.arange(4).reshape(1, 1, 4, 1) < counts.reshape(N, 1, 1, 1)).to(torch.float64)
        keys = keys * mask
        out["C"] = keys.transpose(-1, -2) @ keys
        out["m"] = keys.sum(2)
        out["n"] = counts.to(torch.float64)
    return out


def time_slice(rec: dgps.Recurrence, x: dict[str, torch.Tensor], a: int, b: int) -> dict[str, torch.Tensor]:
    """Tokens [a, b) of every per-token input; per-head params are not sliced."""
    return {d.name: x[d.name] if d.is_param else x[d.name][:, a:b] for d in rec.ir.inputs}


def batch_slice(x: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    return {n: s[i:i + 1] for n, s in x.items()}


shapes = st.fixed_dictionaries(dict(
    H=st.integers(1, 2), G=st.integers(1, 2), dk=st.integers(2, 8), dv=st.integers(2, 8),
    seed=st.integers(0, 2**31 - 1),
))


# --- exact ATQ ≡ exact ATK ≡ ridge regression ----------------------------------------------------------------


@settings(FAST, max_examples=30)
@given(shp=shapes, B=st.integers(1, 2), T=st.integers(1, 24), key_scale=st.floats(0.2, 3.0))
def test_exact_atq_equals_atk_equals_ridge(shp, B, T, key_scale):
    atq, atk = load("exact_atq"), load("exact_atk")
    H, G, dk, dv = shp["H"], shp["G"], shp["dk"], shp["dv"]
    HV = H * G
    x = atq.random_inputs(B, T, H, dk, dv, HV=HV, seed=shp["seed"])
    x["k"] = x["k"] * key_scale  # the identity holds for any keys, not only unit ones
    o_q = atq.reference(**x, output_final_state=True)
    o_k = atk.reference(**x, output_final_state=True)
    close(o_k.o, o_q.o, 1e-10, "ATK vs ATQ")

    lam = atq.ir.precond.lam
    assert lam is not None and lam == atk.ir.precond.lam
    scale = dk ** -0.5
    q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))  # [B, heads, T, d]
    q, k = q.repeat_interleave(G, 1), k.repeat_interleave(G, 1)
    eye = torch.eye(dk, dtype=torch.float64)
    ridge = []
    for t in range(T):
        K, V = k[:, :, :t + 1], v[:, :, :t + 1]
        gram = lam * eye + K.transpose(-1, -2) @ K
        y = torch.linalg.solve(gram, q[:, :, t].unsqueeze(-1))  # (λI + Σ kkᵀ)^-1 q_t
        ridge.append(scale * (V.transpose(-1, -2) @ (K @ y)).squeeze(-1))  # (Σ v kᵀ) y
    ridge = torch.stack(ridge, dim=1)
    close(o_q.o, ridge, 1e-10, "ATQ vs ridge")
    close(o_k.o, ridge, 1e-10, "ATK vs ridge")

    P = torch.linalg.inv(lam * torch.eye(dk, dtype=torch.float64) + x["k"].transpose(1, 2).transpose(-1, -2)
                         @ x["k"].transpose(1, 2))
    close(o_q.final_state["P"], P, 1e-10, "ATQ final P")
    close(o_k.final_state["P"], P, 1e-10, "ATK final P")
    # ATQ's state is the plain sum Σ k vᵀ (h layout); ATK's is the ridge solution P_T Σ k vᵀ
    kv = k.transpose(-1, -2) @ v
    close(o_q.final_state["S"], kv, 1e-10, "ATQ final S")
    close(o_k.final_state["S"], P.repeat_interleave(G, 1) @ kv, 1e-10, "ATK final S")


# --- CCQ: the corrected query never grows --------------------------------------------------------------------

def _ccq_probe(centered: bool) -> dgps.Recurrence:
    """No decay, additive write: with S_0 = I, v = 0 and scale 1 the state stays I and o_t = q̂_t."""
    return dgps.load(f"""
recurrence ccq_probe
  input q, k : key
  input v    : value
  input lam  : token unit
  normalize q, k
  solve additive
  read  curvature(lam, {'centered' if centered else 'uncentered'})
end
""")


@pytest.mark.parametrize("centered", [True, False], ids=["centered", "uncentered"])
@settings(FAST, max_examples=30)
@given(shp=shapes, B=st.integers(1, 2), T=st.integers(1, 24),
       lam_const=st.one_of(st.none(), st.floats(1e-3, 1 - 1e-9)), spread=st.sampled_from([1.0, 0.3, 1e-3]))
def test_ccq_corrected_query_never_grows(centered, shp, B, T, lam_const, spread):
    rec = _ccq_probe(centered)
    H, G, d = shp["H"], shp["G"], shp["dk"]
    HV = H * G
    x = rec.random_inputs(B, T, H, d, d, HV=HV, seed=shp["seed"])
    # `spread` < 1 bunches the keys around one direction, where C̄ has an eigenvalue near 1 and the bound is tight
    x["k"] = x["k"][:, :1] + spread * x["k"]
    if lam_const is not None:
        x["lam"] = torch.full_like(x["lam"], lam_const)
    x["v"] = torch.zeros_like(x["v"])
    S0 = torch.eye(d, dtype=torch.float64).expand(B, HV, d, d).clone()
    o = rec.reference(**x, initial_state=S0, scale=1.0).o  # [B, T, HV, d] = q̂

    # q̂ from the CCQ paper's formula: q − λ(C̄q − μμᵀq), C̄, μ the 1/t means over j ≤ t of the normalised keys
    def l2(z):
        return z * torch.rsqrt((z * z).sum(-1, keepdim=True) + 1e-6)

    q, k = l2(x["q"]).repeat_interleave(G, 2), l2(x["k"]).repeat_interleave(G, 2)
    t = torch.arange(1, T + 1, dtype=torch.float64).reshape(1, T, 1, 1)
    C = torch.cumsum(k.unsqueeze(-1) * k.unsqueeze(-2), dim=1) / t.unsqueeze(-1)
    mu = torch.cumsum(k, dim=1) / t
    corr = (C @ q.unsqueeze(-1)).squeeze(-1)
    if centered:
        corr = corr - mu * (mu * q).sum(-1, keepdim=True)
    qhat = q - x["lam"].unsqueeze(-1) * corr
    close(o, qhat, 1e-12, "o_t vs q̂_t")

    grow = o.norm(dim=-1) / q.norm(dim=-1)
    assert grow.max().item() <= 1 + 1e-12, f"‖q̂‖/‖q‖ reached {grow.max().item()!r}"


# --- packed batches and continuation, for every spec ---------------------------------------------------------


@pytest.mark.parametrize("name", ALL_SPECS)
@settings(FAST, max_examples=8)
@given(shp=shapes, lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3), with_init=st.booleans())
def test_varlen_equals_separate_runs(name, shp, lengths, with_init):
    rec = load(name)
    H, G, dk, dv = shp["H"], shp["G"], shp["dk"], shp["dv"]
    HV, T, N = H * G, sum(lengths), len(lengths)
    x = rec.random_inputs(1, T, H, dk, dv, HV=HV, seed=shp["seed"])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    init = random_states(rec, Dims(1, T, H, HV, dk, dv), N, shp["seed"]) if with_init else None
    packed = rec.reference(**x, initial_state=init, output_final_state=True, cu_seqlens=cu)

    outs, routes, finals = [], [], []
    for i in range(N):
        a, b = int(cu[i]), int(cu[i + 1])
        one = rec.reference(**time_slice(rec, x, a, b), initial_state=batch_slice(init, i) if init else None,
                            output_final_state=True)
        outs.append(one.o)
        routes.append(one.route)
        finals.append(one.final_state)
    close(packed.o, torch.cat(outs, dim=1), 1e-12, "o")
    close(packed.route, None if routes[0] is None else torch.cat(routes, dim=1), 1e-12, "route")
    assert set(packed.final_state) == set(rec.ir.state_names)
    for s in rec.ir.state_names:
        close(packed.final_state[s], torch.cat([f[s] for f in finals], dim=0), 1e-12, f"final {s}")


@pytest.mark.parametrize("name", ALL_SPECS)
@settings(FAST, max_examples=8)
@given(shp=shapes, B=st.integers(1, 2), T=st.integers(2, 24), cut=st.floats(0, 1), with_init=st.booleans())
def test_chunked_continuation(name, shp, B, T, cut, with_init):
    rec = load(name)
    H, G, dk, dv = shp["H"], shp["G"], shp["dk"], shp["dv"]
    HV = H * G
    T1 = min(T - 1, 1 + int(cut * (T - 1)))
    x = rec.random_inputs(B, T, H, dk, dv, HV=HV, seed=shp["seed"])
    init = random_states(rec, Dims(B, T, H, HV, dk, dv), B, shp["seed"]) if with_init else None
    whole = rec.reference(**x, initial_state=init, output_final_state=True)
    first = rec.reference(**time_slice(rec, x, 0, T1), initial_state=init, output_final_state=True)
    second = rec.reference(**time_slice(rec, x, T1, T), initial_state=first.final_state, output_final_state=True)
    close(torch.cat([first.o, second.o], dim=1), whole.o, 1e-12, "o")
    if whole.route is not None:
        close(torch.cat([first.route, second.route], dim=1), whole.route, 1e-12, "route")
    assert set(whole.final_state) == set(rec.ir.state_names)
    for s in rec.ir.state_names:
        close(second.final_state[s], whole.final_state[s], 1e-12, f"final {s}")


# --- grouped value heads -------------------------------------------------------------------------------------

GVA_SPECS = ["gdn", "kda", "gdn2", "pgdn", "pkda", "ccq_gla", "exact_atk", "mamba2", "cler_h_gdn"]


@pytest.mark.parametrize("name", GVA_SPECS)
@settings(FAST, max_examples=6)
@given(shp=shapes, B=st.integers(1, 2), T=st.integers(1, 16), with_init=st.booleans())
def test_gva_equals_copied_key_heads(name, shp, B, T, with_init):
    """HV = G·H value heads on H key heads equals HV independent heads, each given a copy of its key head."""
    rec = load(name)
    H, dk, dv = shp["H"], shp["dk"], shp["dv"]
    G = 2
    HV = H * G
    x = rec.random_inputs(B, T, H, dk, dv, HV=HV, seed=shp["seed"])
    init = random_states(rec, Dims(B, T, H, HV, dk, dv), B, shp["seed"]) if with_init else None
    grouped = rec.reference(**x, initial_state=init, output_final_state=True)

    def copy_heads(val: torch.Tensor, axis: int) -> torch.Tensor:
        return val.repeat_interleave(G, dim=axis)

    xc = {d.name: copy_heads(x[d.name], 0 if d.is_param else 2) if d.heads == "key" else x[d.name] for d in rec.ir.inputs}
    key_head_states = {s for s, shape in state_shapes(rec.ir, Dims(B, T, H, HV, dk, dv), B).items()
                       if len(shape) > 1 and shape[1] == H and G > 1 and s != "S"}
    initc = None if init is None else {s: copy_heads(t, 1) if s in key_head_states else t for s, t in init.items()}
    copied = rec.reference(**xc, initial_state=initc, output_final_state=True)
    close(grouped.o, copied.o, 1e-12, "o")
    close(grouped.route, copied.route, 1e-12, "route")
    for s in rec.ir.state_names:
        want = copied.final_state[s]
        got = grouped.final_state[s]
        if s in key_head_states:
            got = copy_heads(got, 1)  # one copy per key head; the copied run carries G identical ones
        close(got, want, 1e-12, f"final {s}")


# --- routes --------------------------------------------------------------------------------------------------

ROUTE_SPECS = [n for n in ALL_SPECS if load(n).ir.route != "none"]


@pytest.mark.parametrize("name", ROUTE_SPECS)
def test_route_is_write_value_or_residual(name):
    """CLVR returns v_t; CLER-H returns r_t = v_t − S̄_t k_t, with S̄_t the decayed state before the write,
    which is read here from a run of the first t − 1 tokens (k normalised as the spec says)."""
    rec = load(name)
    B, T, H, HV, dk, dv = 2, 7, 1, 2, 4, 3
    x = rec.random_inputs(B, T, H, dk, dv, HV=HV, seed=4)
    S0 = random_states(rec, Dims(B, T, H, HV, dk, dv), B, 4)["S"]
    route = rec.reference(**x, initial_state=S0).route
    assert route is not None and route.shape == x["v"].shape
    if rec.ir.route == "value":
        close(route, x["v"], 0.0, "route vs v")
        return
    # the explicit r_t below assumes the library's route specs: L2-normalised keys (eps 1e-6), decay exp(g)
    assert rec.ir.normalize == ("q", "k") and rec.ir.norm_eps == 1e-6 and rec.ir.decay.kind in ("scalar", "vector")
    assert str(rec.ir.decay.log_gate) == "g", rec.ir.decay.log_gate
    k = x["k"] * torch.rsqrt((x["k"] ** 2).sum(-1, keepdim=True) + 1e-6)
    k = k.repeat_interleave(HV // H, 2)
    for t in range(T):
        S = S0 if t == 0 else rec.reference(**time_slice(rec, x, 0, t), initial_state=S0, output_final_state=True
                                            ).final_state["S"]
        g = x["g"][:, t]
        S_bar = S * g.exp().reshape(*g.shape[:2], -1, 1)  # scalar or per key channel: decays the key rows of h
        r = x["v"][:, t] - torch.einsum("bhkv,bhk->bhv", S_bar, k[:, t])
        close(route[:, t], r, 1e-12, f"route at t={t}")


# --- gradients -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_SPECS)
def test_gradcheck(name):
    """Gradients w.r.t. every floating input and every initial state (but the count n), through o, route and
    the final states."""
    rec = load(name)
    B, T, H, dk, dv = 1, 3 + ALL_SPECS.index(name) % 3, 1, 3, 3
    x = rec.random_inputs(B, T, H, dk, dv, seed=11)
    init = random_states(rec, Dims(B, T, H, H, dk, dv), B, seed=11)
    in_names = list(x)
    st_names = [s for s in init if s != "n"]
    fixed = {s: init[s] for s in init if s == "n"}
    leaves = [x[n].clone().requires_grad_() for n in in_names] + [init[s].clone().requires_grad_() for s in st_names]

    def f(*ts):
        inputs = dict(zip(in_names, ts[:len(in_names)], strict=True))
        states = {**dict(zip(st_names, ts[len(in_names):], strict=True)), **fixed}
        out = rec.reference(**inputs, initial_state=states, output_final_state=True)
        extra = [] if out.route is None else [out.route]
        return (out.o, *extra, *(out.final_state[s] for s in st_names))

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-6)


# --- extreme but legal gates ---------------------------------------------------------------------------------

DECAYING = [n for n in ALL_SPECS if load(n).ir.decay.kind in ("scalar", "vector")
            or load(n).ir.precond.kind == "diag" and load(n).ir.precond.diag.decay is not None]


@pytest.mark.parametrize("name", DECAYING)
@settings(FAST, max_examples=4)
@given(shp=shapes, B=st.integers(1, 2), T=st.integers(1, 24))
def test_strong_decay_is_finite(name, shp, B, T):
    """Log-gates uniform in [−100, 0] (and fused-gate pre-activations pushed as far) give finite outputs,
    states and gradients."""
    rec = load(name)
    H, G, dk, dv = shp["H"], shp["G"], shp["dk"], shp["dv"]
    HV = H * G
    x = rec.random_inputs(B, T, H, dk, dv, HV=HV, seed=shp["seed"])
    gen = torch.Generator().manual_seed(shp["seed"])
    touched = []
    for d in rec.ir.inputs:
        val = x[d.name]
        if d.domain == "log_gate":
            x[d.name] = -100 * torch.rand(val.shape, generator=gen, dtype=torch.float64)
        elif d.name == "A_log":  # fused gates: g = −exp(A_log)·softplus(a + dt_bias), as strong as −100·20
            x[d.name] = torch.log(100 * torch.rand(val.shape, generator=gen, dtype=torch.float64))
        elif d.name == "a" and "A_log" in x:
            x[d.name] = -5 + 25 * torch.rand(val.shape, generator=gen, dtype=torch.float64)
        else:
            continue
        touched.append(d.name)
    assert touched, f"{name} decays but has no gate input to push"
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    init = random_states(rec, Dims(B, T, H, HV, dk, dv), B, shp["seed"])
    S0 = init["S"].clone().requires_grad_()
    out = rec.reference(**leaves, initial_state={**init, "S": S0}, output_final_state=True)
    results = {"o": out.o, "route": out.route, **out.final_state}
    for what, t in results.items():
        assert t is None or torch.isfinite(t).all(), f"{what} is not finite"
    loss = out.o.square().sum() + out.final_state["S"].square().sum()
    grads = torch.autograd.grad(loss, [*leaves.values(), S0], allow_unused=True)
    for n, g in zip([*leaves, "S0"], grads, strict=True):
        assert g is None or torch.isfinite(g).all(), f"d/d{n} is not finite"


# --- bad tensors ---------------------------------------------------------------------------------------------


def _gla_inputs(**over):
    rec = load("gla")
    x = rec.random_inputs(1, 5, 2, 4, 3, seed=0)
    x.update(over)
    return rec, {n: t for n, t in x.items() if t is not None}


@pytest.mark.parametrize("case,needles", [
    ("g_wrong_shape", ["`g`", "[B, T, HV, dk]", "[1, 5, 2, 4]", "[1, 5, 2, 3]"]),
    ("g_missing", ["`g`", "missing", "[B, T, HV, dk]", "[1, 5, 2, 4]"]),
    ("q_missing", ["`q`", "missing", "[B, T, H, dk]"]),
    ("q_3d", ["q", "[B, T, H, dk]"]),
    ("v_heads", ["HV=3", "H=2"]),
    ("v_time", ["v", "[B=1, T=5, HV, dv]"]),
    ("unknown", ["gk", "unknown"]),
    ("S0_shape", ["`S`", "[1, 2, 4, 3]", "[1, 2, 3, 4]"]),
    ("S0_name", ["unknown initial state", "P", "['S']"]),
])
def test_tensor_errors(case, needles):
    rec, x = _gla_inputs()
    kw = {}
    if case == "g_wrong_shape":
        x["g"] = x["g"][..., :3]
    elif case == "g_missing":
        del x["g"]
    elif case == "q_missing":
        del x["q"]
    elif case == "q_3d":
        x["q"] = x["q"][0]
    elif case == "v_heads":
        x["v"] = torch.zeros(1, 5, 3, 3, dtype=torch.float64)
    elif case == "v_time":
        x["v"] = x["v"][:, :4]
    elif case == "unknown":
        x["gk"] = x["g"]
    elif case == "S0_shape":
        kw["initial_state"] = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    elif case == "S0_name":
        kw["initial_state"] = {"P": torch.zeros(1, 2, 4, 4, dtype=torch.float64)}
    with pytest.raises(dgps.TensorError) as err:
        rec.reference(**x, **kw)
    for needle in needles:
        assert needle in str(err.value), f"{needle!r} not in {str(err.value)!r}"


@pytest.mark.parametrize("case,needles", [
    ("q_numpy", ["`q`", "torch.Tensor", "[B, T, H, dk]", "ndarray"]),
    ("g_numpy", ["`g`", "torch.Tensor", "ndarray"]),
    ("cu_list", ["cu_seqlens", "torch.Tensor", "[N + 1]", "list"]),
    ("cu_bool", ["cu_seqlens", "integer", "[N + 1]"]),
    ("S0_list", ["initial_state", "[1, 2, 4, 3]", "list"]),
    ("S0_entry_list", ["`S`", "torch.Tensor", "[1, 2, 4, 3]", "list"]),
])
def test_non_tensor_arguments(case, needles):
    """Arguments that are not tensors at all get a TensorError too, not an AttributeError from deep inside."""
    rec, x = _gla_inputs()
    kw = {}
    if case == "q_numpy":
        x["q"] = x["q"].numpy()
    elif case == "g_numpy":
        x["g"] = x["g"].numpy()
    elif case == "cu_list":
        kw["cu_seqlens"] = [0, 2, 5]
    elif case == "cu_bool":
        kw["cu_seqlens"] = torch.tensor([False, True])
    elif case == "S0_list":
        kw["initial_state"] = [[0.0]]
    elif case == "S0_entry_list":
        kw["initial_state"] = {"S": [[0.0]]}
    with pytest.raises(dgps.TensorError) as err:
        rec.reference(**x, **kw)
    for needle in needles:
        assert needle in str(err.value), f"{needle!r} not in {str(err.value)!r}"


def test_seen_inputs_pass_only_what_the_check_passed():
    """check_inputs passes a seen (spec, name, shape, dtype, device) signature without the walk (runtime/tensors.py):
    a valid call seen before must not let through anything the full check refuses, and a call leaving a param to its
    default is filled in every time."""
    from dgps.runtime import tensors

    rec, x = _gla_inputs()
    ok, dims = tensors.check_inputs(rec.ir, x)
    again, dims2 = tensors.check_inputs(rec.ir, x)  # the seen path
    assert dims2 == dims and list(again) == list(ok) and all(again[n] is ok[n] for n in ok)
    for bad, needle in ((dict(x, v=x["v"][:, :, :1]), "HV"), (dict(x, g=x["g"][..., :1]), "`g`"),
                        (dict(x, g=x["g"].to(torch.int64)), "floating"), (dict(x, gk=x["g"]), "unknown")):
        with pytest.raises(dgps.TensorError, match=needle):
            tensors.check_inputs(rec.ir, bad)
    pg = load("pgdn")
    y = pg.random_inputs(1, 4, 1, 4, 3, seed=0)
    y.pop("mu")
    for _ in range(2):  # the default is built on every call, never kept as a seen signature
        filled, _ = tensors.check_inputs(pg.ir, y)
        assert "mu" in filled and "mu" not in y


def test_param_wrong_shape_names_it():
    rec = load("pgdn")
    x = rec.random_inputs(1, 4, 1, 4, 3, HV=2, seed=0)
    x["mu"] = torch.zeros(2, dtype=torch.float64)  # μ is per key head: [H] = [1], not [HV]
    with pytest.raises(dgps.TensorError) as err:
        rec.reference(**x)
    msg = str(err.value)
    assert "`mu`" in msg and "[H]" in msg and "[1]" in msg, msg


@pytest.mark.parametrize("cu,B,needles", [
    ([0, 2, 5], 2, ["cu_seqlens", "B = 1", "B = 2"]),
    ([1, 2, 5], 1, ["cu_seqlens", "start at 0", "T = 5"]),
    ([0, 2, 4], 1, ["cu_seqlens", "end at T = 5"]),
    ([0, 3, 3, 5], 1, ["cu_seqlens", "strictly increasing"]),
    ([0, 4, 2, 5], 1, ["cu_seqlens", "strictly increasing"]),
    ([0.0, 2.0, 5.0], 1, ["cu_seqlens", "integer", "[N + 1]"]),
    ([[0, 2, 5]], 1, ["cu_seqlens", "1-D", "[N + 1]"]),
    ([0], 1, ["cu_seqlens", "[N + 1]"]),
])
def test_bad_cu_seqlens(cu, B, needles):
    rec = load("gla")
    x = rec.random_inputs(B, 5, 2, 4, 3, seed=0)
    with pytest.raises(dgps.TensorError) as err:
        rec.reference(**x, cu_seqlens=torch.tensor(cu))
    for needle in needles:
        assert needle in str(err.value), f"{needle!r} not in {str(err.value)!r}"


def test_initial_states_must_match_sequences():
    """With cu_seqlens, initial states are per sequence: N of them, not B."""
    rec = load("gla")
    x = rec.random_inputs(1, 5, 2, 4, 3, seed=0)
    with pytest.raises(dgps.TensorError) as err:
        rec.reference(**x, cu_seqlens=torch.tensor([0, 2, 5]), initial_state=torch.zeros(1, 2, 4, 3, dtype=torch.float64))
    assert "`S`" in str(err.value) and "[2, 2, 4, 3]" in str(err.value), str(err.value)


# A per-head param inside a per-channel decay (KDA's A_log form): its gradient is a sum over every token and channel,
# whose shares can cancel to a small total.
PARAM_IN_DECAY = """recurrence param_in_decay
  input q, k : key
  input v : value
  input x : key_channel free
  param A_log : head free
  decay vector(-exp(0.5 * tanh(A_log)) * softplus(x))
  solve delta
end
"""


@pytest.mark.parametrize("heads", ["head", "key_head"])
def test_param_probes_are_each_tokens_share(heads: str) -> None:
    """reference(param_probes=...): the probes' gradients are the tokens' shares of a param's gradient — they add up
    to it, and their magnitudes bound it — with packed sequences and value heads grouped under key heads."""
    from dgps.runtime.reference import reference

    rec = dgps.load(PARAM_IN_DECAY.replace("head free", "head free key_head" if heads == "key_head" else "head free"))
    x = rec.random_inputs(1, 40, 2, 8, 6, HV=4, dtype=torch.float64, seed=1)
    x = {k: v.requires_grad_() for k, v in x.items()}
    probe = torch.zeros(1, 40, 4, 1, dtype=torch.float64, requires_grad=True)
    out = reference(rec.ir, x, cu_seqlens=torch.tensor([0, 13, 40]), param_probes={"A_log": probe})
    (out.o * torch.randn_like(out.o)).sum().backward()
    group = 2 if heads == "key_head" else 1  # value heads per param entry
    total = probe.grad.sum((0, 1)).reshape(-1, group).sum(1)
    size = probe.grad.abs().sum((0, 1)).reshape(-1, group).sum(1)
    grad = x["A_log"].grad.reshape(-1)
    torch.testing.assert_close(total, grad, rtol=1e-12, atol=1e-14)
    assert (grad.abs() <= size + 1e-14).all()


def test_a_params_gradient_is_measured_against_its_shares() -> None:
    """verify_gradients holds a param's gradient to ‖kernel − ref‖ / ‖Σ_tokens |share|‖: with these inputs the shares
    cancel to a total hundreds of times smaller than themselves, and the fp32 kernels' error relative to that total
    (~4e-4, the spec fuzzer's failure of 2026-12-05) says nothing about the kernels, whose error against the shares is
    an fp32 one, like every other gradient's."""
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")
    from dgps.runtime.compile import compile as compile_spec
    from dgps.runtime.verify import verify_gradients

    rec = dgps.load(PARAM_IN_DECAY)
    rows = {r.output: r for r in verify_gradients(rec, compile_spec(rec), B=1, T=70, H=1, dk=8, dv=20, HV=1, seed=3)}
    assert all(r.ok for r in rows.values()), rows
    assert rows["dA_log"].error < 1e-5
