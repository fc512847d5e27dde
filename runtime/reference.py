"""The sequential reference, derived from the IR: token by token, any dtype, autograd throughout.

Nothing here knows a system by name. Every step is the canonical recurrence (README, "The spec language"),
with the parts read off the IR:

    S̄_t = S_{t-1} D_t;  precond stats;  S_t = S̄_t + f (eᵀ X) + w v'ᵀ  (h = Sᵀ layout);  o_t = scale · S_tᵀ q'_t

States use FLA's layout: S is stored as h = Sᵀ, [N, HV, dk, dv]. Per-key-head statistics (CCQ, exact
P, a diag statistic whose inputs are all per key head) are computed per value head, which is exact
because grouped value heads see the same key, and returned per key head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sympy as sp
import torch

from ..compiler.ir import HEAD_INDEX, IR, KTILDE, STAT
from .evaluate import evaluate
from .reductions import reduce_channels
from .tensors import Dims, TensorError, check_cu_seqlens, check_inputs


@dataclass
class RecurrenceOutput:
    """o: [B, T, HV, dv]; final_state: dict of states (None unless asked); route: [B, T, HV, dv] or None."""

    o: torch.Tensor
    final_state: dict[str, torch.Tensor] | None = None
    route: torch.Tensor | None = None


def state_shapes(ir: IR, dims: Dims, N: int) -> dict[str, tuple[int, ...]]:
    H, HV, dk, dv = dims.H, dims.HV, dims.dk, dims.dv
    shapes: dict[str, tuple[int, ...]] = {"S": (N, HV, dk, dv)}
    if ir.precond.kind == "diag":
        assert ir.precond.diag is not None
        shapes["A"] = (N, H if ir.precond.diag.heads == "key" else HV, dk)
    if ir.precond.kind == "exact":
        shapes["P"] = (N, H, dk, dk)
    if ir.read.kind == "curvature":
        shapes.update(C=(N, H, dk, dk), m=(N, H, dk), n=(N,))
    return shapes


_ZERO: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def zero_state(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero state of `shape` that holds one element: a cached one-element zero expanded (stride 0). What the chunk
    kernels read as "no initial state" (is_zero_state: they start from zero and read nothing); anywhere else a
    `.contiguous()` makes it real zeros."""
    device = torch.device(device)
    key = (device, dtype)
    z = _ZERO.get(key)
    if z is None:
        z = _ZERO[key] = torch.zeros(1, dtype=dtype, device=device)
    return z.expand(shape)


def is_zero_state(t: torch.Tensor) -> bool:
    """Whether `t` is a zero_state (not merely zeros: an expanded view of the cached zero)."""
    z = _ZERO.get((t.device, t.dtype))
    return z is not None and t.data_ptr() == z.data_ptr() and not any(t.stride())


def initial_states(ir: IR, dims: Dims, N: int, given: torch.Tensor | Mapping[str, torch.Tensor] | None,
                   dtype: torch.dtype, device: torch.device, lazy: bool = False) -> dict[str, torch.Tensor]:
    """Complete the initial states: zeros, except P_0 = I / λ; check the shapes of what was given. `lazy`: each
    zero state a zero_state (one element, expanded), so that no zeros are formed for a state nobody gave: a
    training step formed two per call (the package's S_0 and the backward's final-state adjoint)."""
    shapes = state_shapes(ir, dims, N)
    if given is None:
        given = {}
    elif isinstance(given, torch.Tensor):
        given = {"S": given}
    elif not isinstance(given, Mapping):
        raise TensorError(f"{ir.name}: initial_state must be a tensor (the state S, {list(shapes['S'])}) or a dict of "
                          f"states {{name: tensor}} with names from {list(shapes)}; got {type(given).__name__}")
    unknown = sorted(set(given) - set(shapes))
    if unknown:
        raise TensorError(f"{ir.name}: unknown initial state(s) {unknown}; this spec carries {list(shapes)}")
    out = {}
    for name, shape in shapes.items():
        x = given.get(name)
        if x is None:
            if name == "P":
                assert ir.precond.lam is not None
                eye = torch.eye(dims.dk, dtype=dtype, device=device) / ir.precond.lam
                x = eye.expand(shape).clone()
            else:
                x = zero_state(shape, dtype, device) if lazy else torch.zeros(shape, dtype=dtype, device=device)
        elif not isinstance(x, torch.Tensor):
            raise TensorError(f"{ir.name}: initial state `{name}` must be a torch.Tensor {list(shape)}, got {type(x).__name__}")
        elif tuple(x.shape) != shape:
            raise TensorError(f"{ir.name}: initial state `{name}` has shape {list(x.shape)}, expected {list(shape)}")
        out[name] = x
    return out


def random_states(ir: IR, dims: Dims, N: int, seed: int) -> dict[str, torch.Tensor]:
    """Random reachable initial states (fp32), for tests and checks: S arbitrary, A positive, P an inverse
    Gram, C, m, n the sums of three unit keys."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed + 7919)
    keys = F.normalize(torch.randn(N, dims.H, 3, dims.dk, generator=gen, dtype=torch.float64), dim=-1)
    out: dict[str, torch.Tensor] = {}
    for name, shape in state_shapes(ir, dims, N).items():
        if name == "S":
            out[name] = 0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "A":
            out[name] = 0.1 + 2 * torch.rand(shape, generator=gen, dtype=torch.float64)
        elif name == "P":
            assert ir.precond.lam is not None
            gram = ir.precond.lam * torch.eye(dims.dk, dtype=torch.float64) + keys.transpose(-1, -2) @ keys
            out[name] = torch.linalg.inv(gram)
        elif name == "C":
            out[name] = keys.transpose(-1, -2) @ keys
        elif name == "m":
            out[name] = keys.sum(-2)
        else:
            out[name] = torch.full(shape, 3.0, dtype=torch.float64)
    return {k: v.float() for k, v in out.items()}


def _expand_heads(x: torch.Tensor, G: int, axis: int) -> torch.Tensor:
    return x if G == 1 else x.repeat_interleave(G, dim=axis)


def _l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def build_env(ir: IR, x: Mapping[str, torch.Tensor], dims: Dims, dtype: torch.dtype,
              param_probes: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Bind every input symbol to a tensor that broadcasts over [B, T, HV, channel]. `param_probes`: per param, a
    [B, T, HV, channels] tensor added to its broadcast value (zeros, whose gradient is each token's share of the
    param's gradient)."""
    env: dict[str, torch.Tensor] = {}
    for d in ir.inputs:
        t = x[d.name].to(dtype)
        if d.is_param:
            t = _expand_heads(t, dims.G if d.heads == "key" else 1, 0)
            t = t.reshape(1, 1, dims.HV, -1)
            if param_probes is not None and d.name in param_probes:
                t = t + param_probes[d.name].to(dtype)
        else:
            t = _expand_heads(t, dims.G if d.heads == "key" else 1, 2)
            if d.vector is None:
                t = t.unsqueeze(-1)
        env[d.name] = t
    for name in ir.normalize:
        env[name] = _l2norm(env[name], ir.norm_eps)
    env[HEAD_INDEX.name] = torch.arange(dims.HV, dtype=dtype, device=env["q"].device).reshape(1, 1, dims.HV, 1)
    for r in ir.reductions:  # in dependence order; each reads the (normalised) inputs and earlier reductions
        env[r.name] = reduce_channels(r, _full(evaluate(r.arg, env, env["q"]), env["q"]))
    return env


def _full(val: torch.Tensor | float, like: torch.Tensor, ndim: int = 4) -> torch.Tensor:
    """A tensor for `val`: a float becomes a broadcastable [1] * ndim tensor."""
    if isinstance(val, torch.Tensor):
        # A constant subexpression (e.g. logsigmoid(0)) evaluates to a 0-d tensor: lift it to ndim.
        return val.reshape((1,) * (ndim - val.dim()) + tuple(val.shape)) if val.dim() < ndim else val
    return torch.full((1,) * ndim, float(val), dtype=like.dtype, device=like.device)


def _at(x: torch.Tensor, t: int) -> torch.Tensor:
    return x[:, 0] if x.shape[1] == 1 else x[:, t]


def _depends_on_step(expr: sp.Expr) -> bool:
    return bool(expr.free_symbols & {KTILDE, STAT})


def _run(ir: IR, env: dict[str, torch.Tensor], dims: Dims, state: dict[str, torch.Tensor], scale: float,
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """One contiguous stretch [B, T] from `state`; returns o, the final states and the route output."""
    like = env["q"]
    G = dims.G
    T = env["q"].shape[1]
    e, f, vp, w = ir.solve.canonical()
    # Everything that does not read a recurrent state is evaluated for all tokens at once.
    pre = {name: _full(evaluate(ex, env, like), like)
           for name, ex in (("e", e), ("f", f), ("vp", vp), ("w", w)) if not _depends_on_step(ex)}
    g = _full(evaluate(ir.decay.log_gate, env, like), like) if ir.decay.log_gate is not None else None
    diag = ir.precond.diag
    if diag is not None:
        stat_inc = _full(evaluate(diag.stat, env, like), like)
        if diag.gain is not None:
            stat_inc = stat_inc * _full(evaluate(diag.gain, env, like), like)
        stat_decay = _full(evaluate(diag.decay, env, like), like) if diag.decay is not None else None
    route_value = _full(evaluate(ir.solve.target, env, like), like) if ir.route == "value" else None
    residual = ir.route == "residual"
    if residual:
        z = _full(evaluate(ir.solve.target, env, like), like)
        ehat = _full(evaluate(ir.solve.erase_key, env, like), like)
    lam = _full(evaluate(ir.read.lam, env, like), like) if ir.read.lam is not None else None

    S = state["S"]
    A = _expand_heads(state["A"], G if diag is not None and diag.heads == "key" else 1, 1) if "A" in state else None
    P = _expand_heads(state["P"], G, 1) if "P" in state else None
    C = _expand_heads(state["C"], G, 1) if "C" in state else None
    m = _expand_heads(state["m"], G, 1) if "m" in state else None
    n = state["n"] if "n" in state else None

    outs, routes = [], []
    for t in range(T):
        q_t, k_t = env["q"][:, t], env["k"][:, t]
        step = {name: _at(val, t) for name, val in env.items()}
        S_prev = S
        if g is not None:
            gt = _at(g, t)
            S = S * torch.exp(gt).unsqueeze(-1)  # [B,HV,dk or 1,1]: decays the key rows of h
        qp = q_t
        ktilde = k_t
        if diag is not None:
            assert A is not None
            inc = _at(stat_inc, t).expand_as(k_t)
            A = A * torch.exp(_at(stat_decay, t)) + inc if stat_decay is not None else A + inc
            scale_vec = _full(evaluate(diag.map, {**step, STAT.name: A}, like), like, 3)
            if ir.precond.placement == "write_key":
                ktilde = scale_vec * k_t
            else:
                qp = scale_vec * q_t
        if P is not None:
            Pk = torch.einsum("bhij,bhj->bhi", P, k_t)
            d = 1 + (k_t * Pk).sum(-1, keepdim=True)
            P = P - torch.einsum("bhi,bhj->bhij", Pk, Pk) / d.unsqueeze(-1)
            if ir.precond.placement == "write_key":
                ktilde = Pk / d
            else:
                qp = torch.einsum("bhij,bhj->bhi", P, q_t)
        vals = {}
        for name, ex in (("e", e), ("f", f), ("vp", vp), ("w", w)):
            if name in pre:
                vals[name] = _at(pre[name], t)
            else:
                vals[name] = _full(evaluate(ex, {**step, KTILDE.name: ktilde}, like), like, 3)
        if not ir.structure.additive:
            X = S if ir.solve.erase_reads == "decayed" else S_prev
            Xe = torch.einsum("bhkv,bhk->bhv", X, vals["e"].expand_as(k_t))
            S_bar = S
            S = S + vals["f"].expand_as(k_t).unsqueeze(-1) * Xe.unsqueeze(-2)
        else:
            S_bar = S
        vp_t = vals["vp"].expand(*S.shape[:2], dims.dv)
        S = S + vals["w"].expand_as(k_t).unsqueeze(-1) * vp_t.unsqueeze(-2)
        if residual:
            rt = _at(z, t).expand(*S.shape[:2], dims.dv) - torch.einsum(
                "bhkv,bhk->bhv", S_bar, _at(ehat, t).expand_as(k_t))
            routes.append(rt)
        elif route_value is not None:
            routes.append(_at(route_value, t).expand(*S.shape[:2], dims.dv))
        if C is not None:
            assert m is not None and n is not None and lam is not None
            C = C + torch.einsum("bhi,bhj->bhij", k_t, k_t)
            m = m + k_t
            n = n + 1
            nn_ = n.reshape(-1, 1, 1)
            corr = torch.einsum("bhij,bhj->bhi", C, q_t) / nn_
            if ir.read.centered:
                corr = corr - m * (m * q_t).sum(-1, keepdim=True) / nn_**2
            qp = q_t - _at(lam, t) * corr
        outs.append(scale * torch.einsum("bhkv,bhk->bhv", S, qp))
    final = {"S": S}
    if A is not None:
        final["A"] = A[:, ::G] if diag is not None and diag.heads == "key" else A
    if P is not None:
        final["P"] = P[:, ::G]
    if C is not None:
        final.update(C=C[:, ::G], m=m[:, ::G], n=n)
    route = torch.stack(routes, dim=1) if routes else None
    return torch.stack(outs, dim=1), final, route


def reference(ir: IR, inputs: Mapping[str, torch.Tensor], *,
              initial_state: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
              output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
              scale: float | None = None, dtype: torch.dtype | None = None,
              param_probes: Mapping[str, torch.Tensor] | None = None) -> RecurrenceOutput:
    """Run the spec token by token. Computes in `dtype` (default: q's dtype); returns in that dtype. `param_probes`:
    see build_env (how runtime/verify sizes a param's gradient by its tokens' shares)."""
    x, dims = check_inputs(ir, inputs)
    dtype = dtype or x["q"].dtype
    device = x["q"].device
    scale = scale if scale is not None else (ir.scale if ir.scale is not None else dims.dk ** -0.5)
    ranges = check_cu_seqlens(cu_seqlens, dims)
    N = len(ranges) if ranges else dims.B
    states = initial_states(ir, dims, N, initial_state, dtype, device)
    states = {k: s.to(dtype) for k, s in states.items()}
    env = build_env(ir, x, dims, dtype, param_probes)
    if not ranges:
        o, final, route = _run(ir, env, dims, states, scale)
    else:
        parts = []
        for i, (a, b) in enumerate(ranges):
            sub = {n: (val[:, a:b] if val.shape[1] == dims.T else val) for n, val in env.items()}
            st = {n: s[i:i + 1] for n, s in states.items()}
            parts.append(_run(ir, sub, dims, st, scale))
        o = torch.cat([p[0] for p in parts], dim=1)
        final = {n: torch.cat([p[1][n] for p in parts], dim=0) for n in parts[0][1]}
        route = torch.cat([p[2] for p in parts], dim=1) if parts[0][2] is not None else None
    return RecurrenceOutput(o, final if output_final_state else None, route)
