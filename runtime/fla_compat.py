"""FLA-compatible entry points: drop-in replacements for fla-core 0.6.0's chunk functions.

    from dgps.fla_compat import chunk_gated_delta_rule     # instead of: from fla.ops.gated_delta_rule import ...
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True)

Each function has the public signature of FLA's function of the same name (parameter names, order and
defaults; see `FLA_SIGNATURES_FROM`), takes FLA's layout (`q, k: [B, T, H, K]`, `v: [B, T, HV, V]`, states
`[N, HV, K, V]`, i.e. h = Sᵀ) and returns what FLA returns: `(o, final_state)`, or `(o, S, A)` for the
preconditioned systems, with `None` where FLA returns `None`. Internally each call builds the spec text of the
matching DGPS recurrence (a variant of the files in `specs/`: with or without `normalize q, k`, with a fused
gate such as `-exp(A_log) * softplus(g + dt_bias)`, ...), compiles it once (`dgps.compile`, cached by spec
text in this module and on disk) and calls the package's differentiable `forward`. Gradients flow to every
tensor argument, including the initial states and, with in-kernel gates, `A_log` and `dt_bias`.

Conventions shared by every function:

* In-kernel L2 normalisation is `x / sqrt(Σx² + 1e-6)`, the epsilon of FLA's fused kernels (FLA's naive
  references use `F.normalize`, which differs by O(1e-6 / |x|²)).
* `o` is returned in `q.dtype`; final states are float32, as in FLA.
* Grouped value heads (`HV` a multiple of `H`, value head `hv` reads key head `hv // (HV // H)`) work in every
  function. Where FLA itself requires `HV == H` (simple GLA, GLA, DeltaNet, GDN2, PKDA), GVA is an extension:
  the per-value-head gates then have `HV` heads.
* Values that enter the spec text (`x`, `eps`, `lower_bound`) and the option flags select the spec, so each
  distinct combination is compiled once per process (and cached on disk by `dgps.compile`).
* Bad shapes raise `dgps.TensorError` (a `ValueError`) naming the tensor and the expected shape.
* `**kwargs`: the keys FLA reads from `**kwargs` are accepted (`A_log`, `dt_bias`, `use_gate_in_kernel` for
  GDN; `chunk_size`; the deprecated `transpose_state_layout`); any other key raises `TypeError` (FLA
  ignores unknown keys silently; a misspelt `A_log` should not be ignored).

Options and how they are treated:

* honoured (part of the spec): `use_qk_l2norm_in_kernel`; `use_gate_in_kernel` with `A_log`, `dt_bias` and
  (KDA family) `lower_bound`; `use_beta_sigmoid_in_kernel`; `allow_neg_eigval` (β = 2·sigmoid(beta));
  simple GLA's `g_gamma` (added to `g` as a per-head log decay); PGDN/PKDA's `x`, `eps`, `log_atk_scale`.
* honoured (arguments of the call): `scale`, `initial_state`, `initial_A_state`, `output_final_state`,
  `cu_seqlens`; `state_v_first` / `transpose_state_layout` (states transposed to and from `[N, HV, V, K]`).
* honoured (memory for speed): `disable_recompute=True` (chunk_kda, chunk_gdn2, chunk_precond_kda,
  chunk_dplr_delta_rule) keeps the state pass's per-chunk states H_n and U from the forward for the backward, which
  then runs no state pass again (the package's `forward(..., keep_states=True)`; not with context parallelism).
* accepted, no effect (scheduling, memory or precision hints that do not change the math): `cu_seqlens_cpu`,
  `chunk_indices`, `chunk_size`, `solve_tril_precision`, `max_num_seqs` (FLA reads it only
  with `use_graph`), `safe_gate` (FLA's M=16 kernel path for gates in `[lower_bound, 0)`; FLA's validation of
  `lower_bound` is kept).
* context parallelism: `chunk_gated_delta_rule` and `chunk_kda` take FLA's `cp_context` (what
  `fla.ops.cp.build_cp_context` returns; contiguous layout: its group, local `cu_seqlens`, `is_first_rank` /
  `is_last_rank`; initial and final states per local sequence, as FLA's; zigzag layout: the global offsets gathered
  from every rank's `cu_seqlens`, `part_len`, `front_num_seqs`, `is_first_by_part`, no states, as FLA's); the others
  with `**kwargs` take the
  kwarg `cp_group` (a torch.distributed group; `cu_seqlens` then are the global pack's); chunk_gla and
  chunk_precond_gated_delta_rule (FLA signatures without `**kwargs`) take neither: call the package's
  `forward`. dgps.runtime.cp, docs/context_parallel.md.
* `NotImplementedError`: `cp_context` for the other systems (pass `cp_group`); `return_intermediate_states=True`
  (dgps does not expose per-chunk states); `use_graph=True` (no CUDA-graph varlen mode with zero-length
  padding sequences).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch

from .tensors import TensorError

__all__ = [
    "chunk_delta_rule",
    "chunk_dplr_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_gdn2",
    "chunk_gla",
    "chunk_kda",
    "chunk_precond_gated_delta_rule",
    "chunk_precond_kda",
    "chunk_simple_gla",
]

# Where each function's signature comes from (fla-core 0.6.0); tests compare against these.
FLA_SIGNATURES_FROM = {
    "chunk_simple_gla": "fla/ops/simple_gla/chunk.py",
    "chunk_dplr_delta_rule": "fla/ops/generalized_delta_rule/dplr/chunk.py",
    "chunk_gla": "fla/ops/gla/chunk.py",
    "chunk_delta_rule": "fla/ops/delta_rule/chunk.py",
    "chunk_gated_delta_rule": "fla/ops/gated_delta_rule/chunk.py",
    "chunk_kda": "fla/ops/kda/chunk.py",
    "chunk_gdn2": "fla/ops/gdn2/chunk.py",
    "chunk_precond_gated_delta_rule": "fla/ops/precond_gated_delta_rule/chunk.py",
    "chunk_precond_kda": "fla/ops/precond_kda/chunk.py",
}

L2_EPS = 1e-6  # FLA's fused l2norm: x / sqrt(sum(x^2) + 1e-6)

# ---------------------------------------------------------------------------------------------------------
# Spec text -> compiled package, once per process

_PACKAGES: dict[str, ModuleType] = {}
_LOCK = threading.Lock()


def compiled(spec: str) -> ModuleType:
    """The compiled package for `spec` (text), compiled on first use and kept for the process."""
    pkg = _PACKAGES.get(spec)
    if pkg is None:
        with _LOCK:
            pkg = _PACKAGES.get(spec)
            if pkg is None:
                from .compile import compile as _compile

                pkg = _PACKAGES[spec] = _compile(spec)
    return pkg


def _num(x: float, what: str) -> str:
    """A finite float as spec text (negative numbers parenthesised)."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{what} must be finite, got {x}")
    text = repr(x)
    return f"(-{text[1:]})" if text.startswith("-") else text


def _spec(name: str, comment: str, decls: list[str], lets: list[str], normalize: bool, slots: list[str]) -> str:
    lines = [f"# {comment} (generated by dgps.runtime.fla_compat)", f"recurrence {name}"]
    lines += [f"  {d}" for d in decls if d.startswith("input")] + [f"  {d}" for d in decls if d.startswith("param")]
    lines += [f"  let {e}" for e in lets]
    if normalize:
        lines.append(f"  normalize q, k, eps = {_num(L2_EPS, 'eps')}")
    lines += [f"  {s}" for s in slots]
    lines.append("end")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Argument checks and the shared call path


def _check_qkv(fn: str, q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int, int]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TensorError(f"{fn}: `{name}` must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise TensorError(f"{fn}: `{name}` must be 4-D [B, T, heads, dim]; got shape {list(x.shape)}")
    if q.shape != k.shape:
        raise TensorError(f"{fn}: q and k must have the same shape [B, T, H, K]; got q {list(q.shape)}, k {list(k.shape)}")
    B, T, H, K = q.shape
    if v.shape[:2] != q.shape[:2]:
        raise TensorError(f"{fn}: v must be [B={B}, T={T}, HV, V] like q; got {list(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV % H != 0:
        raise TensorError(f"{fn}: value heads HV={HV} must be a positive multiple of key heads H={H} (GVA)")
    return B, T, H, HV, K, V


def _no_cp(fn: str, cp_context: Any) -> None:
    if cp_context is not None:
        raise NotImplementedError(f"{fn}: FLA's `cp_context` is taken by chunk_gated_delta_rule and chunk_kda only (the "
                                  "systems FLA has CP for); pass `cp_group=group` with the global `cu_seqlens` instead")


def _cp(fn: str, cp_context: Any, kwargs: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """(group, FLA context or None) for dgps.runtime.cp, or None without context parallelism.

    FLA's context is read by its fields only (never importing fla): `group` (None: CP off, as FLA's
    `is_cp_enabled`), `cu_seqlens` (the local offsets), `is_first_rank`, `is_last_rank`, `layout`."""
    group = kwargs.get("cp_group")
    if cp_context is not None:
        if group is not None:
            raise ValueError(f"{fn}: pass either `cp_context` (FLA's) or `cp_group`, not both")
        missing = [a for a in ("group", "cu_seqlens", "is_first_rank", "is_last_rank") if not hasattr(cp_context, a)]
        if missing:
            raise TypeError(f"{fn}: `cp_context` must be FLA's FLACPContext (fla.ops.cp.build_cp_context); "
                            f"{type(cp_context).__name__} lacks {missing}")
        return (cp_context.group, cp_context)
    return (group, None) if group is not None else None


def _no_intermediate(fn: str, return_intermediate_states: bool) -> None:
    if return_intermediate_states:
        raise NotImplementedError(
            f"{fn}: `return_intermediate_states=True` is not supported by dgps (it does not expose per-chunk states)"
        )


def _kwargs(fn: str, kwargs: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    if "head_first" in kwargs:
        raise DeprecationWarning(f"{fn}: `head_first` is not supported: inputs must be [B, T, H, ...] (FLA removed it too)")
    unknown = sorted(set(kwargs) - set(allowed) - {"cp_group"})  # cp_group: every function (context parallelism)
    if unknown:
        raise TypeError(f"{fn}: unexpected keyword argument(s) {', '.join(unknown)}; "
                        f"accepted extra keywords: {', '.join(allowed) or 'none'}")
    return kwargs


def _v_first(fn: str, state_v_first: bool, kwargs: dict[str, Any]) -> bool:
    """FLA's deprecated alias `transpose_state_layout` for `state_v_first`."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(f"{fn}: pass either `state_v_first` or the deprecated `transpose_state_layout`, not both")
        return bool(kwargs["transpose_state_layout"])
    return bool(state_v_first)


def _state_in(fn: str, name: str, x: Any, v_first: bool) -> torch.Tensor | None:
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TensorError(f"{fn}: `{name}` must be a torch.Tensor or None, got {type(x).__name__}")
    if v_first:
        if x.dim() != 4:
            raise TensorError(f"{fn}: `{name}` must be [N, HV, V, K] (state_v_first); got shape {list(x.shape)}")
        return x.transpose(-1, -2)
    return x


def _run(fn: str, spec: str, inputs: Mapping[str, torch.Tensor | None], *, q: torch.Tensor,
         initial: Mapping[str, torch.Tensor | None], output_final_state: bool, cu_seqlens: torch.Tensor | None,
         scale: float | None, v_first: bool, cp: tuple[Any, Any] | None = None, keep_states: bool = False,
         ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    pkg = compiled(spec)
    states = {n: s for n, s in initial.items() if s is not None}
    given = {n: x for n, x in inputs.items() if x is not None}
    if cp is not None and cp[0] is None:  # FLA's context with CP off: its local offsets, a plain call
        cu_seqlens, cp = cp[1].cu_seqlens, None
    if cp is None:
        out = pkg.forward(**given, initial_state=states or None, output_final_state=output_final_state,
                          cu_seqlens=cu_seqlens, scale=scale, keep_states=keep_states)
    else:
        if keep_states:
            raise NotImplementedError(f"{fn}: `disable_recompute=True` with context parallelism (the context-parallel "
                                      "backward reruns its state passes)")
        from dgps.runtime import cp as cp_mod

        group, context = cp
        if context is not None and getattr(context, "layout", "contiguous") == "zigzag":
            # FLA's zigzag slices: the global offsets from every rank's context, then the relayout to contiguous
            # slices and back (runtime/cp.py: relayout). FLA's CP takes no states; neither does this path
            if states or output_final_state:
                raise NotImplementedError(f"{fn}: initial_state / output_final_state with a zigzag cp_context (FLA's "
                                          "context parallelism takes neither)")
            if q.shape[0] != 1:
                raise TensorError(f"{fn}: a zigzag cp_context takes the slice packed to B = 1; got B = {q.shape[0]}")
            cu_global = cp_mod.global_offsets_from_fla_zigzag(context, group, q.shape[1]).to(q.device)
            out = cp_mod.cp_forward(pkg, given, group=group, output_final_state=False, cu_seqlens=cu_global,
                                    scale=scale, cp_layout="zigzag")
        else:
            layout = None if context is None else cp_mod.layout_from_fla(context, q.shape[0], q.shape[1])
            out = cp_mod.cp_forward(pkg, given, group=group, initial_state=states or None,
                                    output_final_state=output_final_state, cu_seqlens=None if context else cu_seqlens,
                                    scale=scale, layout=layout)
    o = out.o if out.o.dtype == q.dtype else out.o.to(q.dtype)
    final = out.final_state
    if final is not None and v_first:
        final = {n: (s.transpose(-1, -2).contiguous() if n == "S" else s) for n, s in final.items()}
    return o, final


def _cu(cu_seqlens: Any, q: torch.Tensor, fn: str) -> torch.Tensor | None:
    if cu_seqlens is not None and isinstance(cu_seqlens, torch.Tensor) and q.shape[0] != 1:
        raise TensorError(f"{fn}: with `cu_seqlens` the batch must be packed to B = 1; got B = {q.shape[0]}")
    return cu_seqlens


# ---------------------------------------------------------------------------------------------------------
# Gates: spec fragments for FLA's log-space gates, in-kernel gate activations and β


def _gate(fn: str, kind: str, use_gate_in_kernel: bool, A_log: Any, dt_bias: Any, lower_bound: float | None,
          HV: int, K: int) -> tuple[list[str], list[str], str, dict[str, Any]]:
    """(decls, lets, gate expression name, extra inputs) for FLA's `g` (kind 'token' or 'key_channel').

    Without the in-kernel gate, `g` is the log decay. With it, `g` is raw and the decay is
    `-exp(A_log) * softplus(g + dt_bias)`, or with `lower_bound` (KDA family)
    `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))` (`A_log` optional there).
    """
    if not use_gate_in_kernel:
        return [f"input g : {kind} log_gate"], [], "g", {}
    decls, params, extra = [f"input g : {kind}"], [], {}
    z = "g"
    if dt_bias is not None:
        if not isinstance(dt_bias, torch.Tensor):
            raise TensorError(f"{fn}: `dt_bias` must be a torch.Tensor, got {type(dt_bias).__name__}")
        if kind == "token":
            params.append("param dt_bias : head")
            extra["dt_bias"] = dt_bias
        else:  # FLA passes the per-channel bias flat, [HV * K]
            if dt_bias.numel() != HV * K:
                raise TensorError(f"{fn}: `dt_bias` must have HV * K = {HV * K} elements ([HV * K] or [HV, K]); "
                                  f"got shape {list(dt_bias.shape)}")
            params.append("param dt_bias : key_channel")
            extra["dt_bias"] = dt_bias.reshape(HV, K)
        z = "g + dt_bias"
    if A_log is not None:
        if not isinstance(A_log, torch.Tensor):
            raise TensorError(f"{fn}: `A_log` must be a torch.Tensor [HV], got {type(A_log).__name__}")
        params.append("param A_log : head")
        extra["A_log"] = A_log.reshape(HV) if A_log.numel() == HV else A_log
    if lower_bound is not None:
        lb = float(lower_bound)
        if not lb < 0:
            raise ValueError(f"{fn}: `lower_bound` must be negative (a log decay), got {lower_bound}")
        arg = z if A_log is None else (f"exp(A_log) * ({z})" if z != "g" else "exp(A_log) * g")
        lets = [f"g_log = {_num(lb, 'lower_bound')} * sigmoid({arg})"]
    else:
        if A_log is None:
            raise ValueError(f"{fn}: `A_log` must be provided when `use_gate_in_kernel=True`"
                             + (" and `lower_bound` is not set" if kind == "key_channel" else ""))
        lets = [f"g_log = -exp(A_log) * softplus({z})"]
    decls += params
    return decls, lets, "g_log", extra


def _beta(fn: str, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> tuple[list[str], list[str], str]:
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError(f"{fn}: `allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`")
    if not use_beta_sigmoid_in_kernel:
        return ["input beta : token unit"], [], "beta"
    return ["input beta : token"], [f"beta_act = {'2 * ' if allow_neg_eigval else ''}sigmoid(beta)"], "beta_act"


def _safe_gate(fn: str, safe_gate: bool, use_gate_in_kernel: bool, lower_bound: float | None) -> None:
    """FLA's validation of the safe-gate path (which itself does not change the math)."""
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(f"{fn}: `lower_bound` must be specified when `safe_gate=True` and `use_gate_in_kernel=True`")
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"{fn}: `lower_bound` must be in the safe range [-5, 0), got {lower_bound}")


def _no_graph(fn: str, use_graph: bool) -> None:
    if use_graph:
        raise NotImplementedError(f"{fn}: `use_graph=True` (CUDA-graph varlen mode) is not supported by dgps")


# ---------------------------------------------------------------------------------------------------------
# The entry points


def chunk_simple_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Simple GLA (scalar-gated linear attention): `h_t = exp(g_t) h_{t-1} + k_t v_tᵀ`, `o_t = scale · h_tᵀ q_t`.

    `g`: log decay `[B, T, HV]`; `g_gamma`: data-independent per-head log decay `[HV]`. Both may be given
    (their sum is the decay, as in FLA's kernels, which apply each when present); with neither the recurrence
    is plain linear attention. Returns `(o [B, T, HV, V], final_state [N, HV, K, V] or None)`.
    `state_v_first` transposes the states; `cu_seqlens_cpu` and `chunk_size` (kwargs) have no effect.
    """
    fn = "chunk_simple_gla"
    _kwargs(fn, kwargs, ("chunk_size",))
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    if g_gamma is not None:
        if g is not None and isinstance(g, torch.Tensor) and tuple(g.shape) != (B, T, HV):
            raise TensorError(f"{fn}: `g` must be [B, T, HV] = {[B, T, HV]}; got {list(g.shape)}")
        if not isinstance(g_gamma, torch.Tensor) or g_gamma.numel() != HV:
            got = list(g_gamma.shape) if isinstance(g_gamma, torch.Tensor) else type(g_gamma).__name__
            raise TensorError(f"{fn}: `g_gamma` must be a per-head log decay [HV={HV}]; got {got}")
        gg = g_gamma.reshape(1, 1, HV).to(q.dtype).expand(B, T, HV)
        g = gg.contiguous() if g is None else g + gg
    decay = ["decay scalar(g)"] if g is not None else []
    spec = _spec("fla_simple_gla", "FLA chunk_simple_gla",
                 ["input q, k : key", "input v : value"] + (["input g : token log_gate"] if g is not None else []),
                 [], False, decay + ["solve additive"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "g": g}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, state_v_first)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=state_v_first, cp=_cp(fn, None, kwargs))
    return o, (final["S"] if final is not None else None)


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: int | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GLA: `h_t = Diag(exp(g_t)) h_{t-1} + k_t v_tᵀ` with `g` a per-key-channel log decay `[B, T, HV, K]`.

    Returns `(o, final_state or None)`. `state_v_first` transposes the states; `cu_seqlens_cpu` has no effect.
    FLA asserts a float32 `initial_state`; dgps accepts any floating dtype (the state is carried in float32).
    """
    fn = "chunk_gla"
    _check_qkv(fn, q, k, v)
    spec = _spec("fla_gla", "FLA chunk_gla", ["input q, k : key", "input v : value", "input g : key_channel log_gate"],
                 [], False, ["decay vector(g)", "solve additive"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "g": g}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, state_v_first)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=state_v_first, cp=None)  # FLA's signature has no **kwargs: no cp_group here
    return o, (final["S"] if final is not None else None)


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """DeltaNet: `h_t = h_{t-1} + β_t k_t (v_t − h_{t-1}ᵀ k_t)ᵀ`, `β: [B, T, HV]`.

    `use_qk_l2norm_in_kernel` normalises q and k (eps 1e-6). Unlike FLA (which rejects float32 inputs here),
    every floating dtype is accepted. Returns `(o, final_state or None)`; `chunk_size` (kwargs) and
    `cu_seqlens_cpu` have no effect.
    """
    fn = "chunk_delta_rule"
    _kwargs(fn, kwargs, ("chunk_size",))
    _check_qkv(fn, q, k, v)
    spec = _spec("fla_delta_rule", "FLA chunk_delta_rule",
                 ["input q, k : key", "input v : value", "input beta : token unit"], [],
                 bool(use_qk_l2norm_in_kernel), ["gain beta", "solve delta"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "beta": beta}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, False)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=False, cp=_cp(fn, None, kwargs))
    return o, (final["S"] if final is not None else None)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet: `h_t = exp(g_t) h_{t-1} + β_t k_t (v_t − exp(g_t) h_{t-1}ᵀ k_t)ᵀ`; g, β `[B, T, HV]`.

    Honoured: `use_qk_l2norm_in_kernel`; `use_beta_sigmoid_in_kernel` (β = sigmoid(beta)) and
    `allow_neg_eigval` (β = 2·sigmoid(beta), needs the former); kwargs `use_gate_in_kernel=True` with
    `A_log [HV]` and optional `dt_bias [HV]` (g = −exp(A_log)·softplus(g + dt_bias)); `state_v_first` (or the
    deprecated kwarg `transpose_state_layout`). No effect: `cu_seqlens_cpu`, `chunk_indices`, kwarg `chunk_size`.
    `cp_context` raises NotImplementedError. Returns `(o, final_state or None)`.
    """
    fn = "chunk_gated_delta_rule"
    kw = _kwargs(fn, kwargs, ("use_gate_in_kernel", "A_log", "dt_bias", "chunk_size", "transpose_state_layout"))
    v_first = _v_first(fn, state_v_first, kw)
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    use_gate = bool(kw.get("use_gate_in_kernel", False))
    gd, gl, gname, gx = _gate(fn, "token", use_gate, kw.get("A_log"), kw.get("dt_bias"), None, HV, K)
    bd, bl, bname = _beta(fn, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    spec = _spec("fla_gated_delta_rule", "FLA chunk_gated_delta_rule", ["input q, k : key", "input v : value"] + gd + bd,
                 gl + bl, bool(use_qk_l2norm_in_kernel), [f"decay scalar({gname})", f"gain {bname}", "solve delta"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "g": g, "beta": beta, **gx}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, v_first)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=v_first, cp=_cp(fn, cp_context, kw))
    return o, (final["S"] if final is not None else None)


chunk_gdn = chunk_gated_delta_rule


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi Delta Attention: GDN with a per-key-channel decay `g [B, T, HV, K]`; β `[B, T, HV]`.

    Honoured: `use_qk_l2norm_in_kernel`; `use_gate_in_kernel` with kwargs `A_log [HV]`, optional
    `dt_bias [HV * K]` (g = −exp(A_log)·softplus(g + dt_bias)) and, with `lower_bound`, FLA's bounded gate
    `lower_bound·sigmoid(exp(A_log)·(g + dt_bias))` (A_log optional there); `use_beta_sigmoid_in_kernel`,
    `allow_neg_eigval`; `state_v_first` (or kwarg `transpose_state_layout`). No effect on the math:
    `safe_gate` (FLA's checks on `lower_bound` are kept), `cu_seqlens_cpu`, `max_num_seqs`, kwarg `chunk_size`;
    `lower_bound` without `use_gate_in_kernel` is ignored, as in FLA. `disable_recompute=True`: H_n and U kept for
    the backward (keep_states), as FLA's.
    NotImplementedError: `return_intermediate_states=True`, `cp_context`, `use_graph=True`.
    Returns `(o, final_state or None)`.
    """
    fn = "chunk_kda"
    kw = _kwargs(fn, kwargs, ("A_log", "dt_bias", "chunk_size", "transpose_state_layout"))
    _no_intermediate(fn, return_intermediate_states)
    _no_graph(fn, use_graph)
    _safe_gate(fn, safe_gate, use_gate_in_kernel, lower_bound)
    v_first = _v_first(fn, state_v_first, kw)
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    gd, gl, gname, gx = _gate(fn, "key_channel", bool(use_gate_in_kernel), kw.get("A_log"), kw.get("dt_bias"),
                              lower_bound, HV, K)
    bd, bl, bname = _beta(fn, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    spec = _spec("fla_kda", "FLA chunk_kda", ["input q, k : key", "input v : value"] + gd + bd, gl + bl,
                 bool(use_qk_l2norm_in_kernel), [f"decay vector({gname})", f"gain {bname}", "solve delta"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "g": g, "beta": beta, **gx}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, v_first)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=v_first, cp=_cp(fn, cp_context, kw), keep_states=bool(disable_recompute))
    return o, (final["S"] if final is not None else None)


def chunk_dplr_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    safe_gate: bool = False,
    chunk_size: int | None = None,
    disable_recompute: bool = False,
    cp_context: Any | None = None,
    lower_bound: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLA's generalized delta rule "dplr" (RWKV-7 with a = −κ̂, b = κ̂ ⊙ ι): S ← S·exp(gk) + b (aᵀ S) + k vᵀ
    (h = Sᵀ layout [K, V]; the erase a reads the undecayed state), a, b, gk `[B, T, H, K]`, v `[B, T, H, V]`.

    Runs the untied DPLR spec `decay vector(gk)`, `solve dplr(e = a, f = b, reads = undecayed)` on dgps's chunk
    kernels (docs/chunk_forms.md §2b). No effect on the math: `safe_gate`, `chunk_size`, `cu_seqlens_cpu`;
    `lower_bound` is checked as FLA does (negative). `disable_recompute=True`: H_n and U kept for the backward
    (keep_states). NotImplementedError: `cp_context`.
    Returns `(o, final_state or None)`.
    """
    fn = "chunk_dplr_delta_rule"
    kw = _kwargs(fn, kwargs, ())
    del kw, safe_gate, chunk_size, cu_seqlens_cpu
    _no_cp(fn, cp_context)
    if lower_bound is not None and lower_bound >= 0:
        raise ValueError(f"{fn}: `lower_bound` must be negative (gk is a log-decay < 0), got {lower_bound}")
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    for name, x in (("a", a), ("b", b), ("gk", gk)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (B, T, HV, K):
            raise TensorError(f"{fn}: `{name}` must be a tensor of shape {[B, T, HV, K]}; got "
                              f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    spec = _spec("fla_dplr", "FLA chunk_dplr_delta_rule",
                 ["input q, k : key", "input v : value", "input a, b : key_channel", "input gk : key_channel log_gate"],
                 [], False, ["decay vector(gk)", "solve dplr(e = a, f = b, reads = undecayed)"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "a": a, "b": b, "gk": gk}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, False)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=False, cp=_cp(fn, None, kwargs), keep_states=bool(disable_recompute))
    return o, (final["S"] if final is not None else None)


def chunk_gdn2(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cp_context: Any | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet-2: `h_t = (I − k_t (b_t⊙k_t)ᵀ) Diag(exp(g_t)) h_{t-1} + k_t (w_t⊙v_t)ᵀ`.

    `g, b: [B, T, HV, K]`, `w: [B, T, HV, V]` (FLA requires HV == H). Options as in `chunk_kda` (gate in
    kernel with kwargs `A_log [HV]`, `dt_bias [HV * K]`, `lower_bound`; `safe_gate`, `cu_seqlens_cpu`, kwarg
    `chunk_size` have no effect on the math; `disable_recompute=True` keeps H_n and U for the backward;
    `return_intermediate_states=True` and `cp_context` raise NotImplementedError). Returns `(o, final_state or None)`.
    """
    fn = "chunk_gdn2"
    kw = _kwargs(fn, kwargs, ("A_log", "dt_bias", "chunk_size", "transpose_state_layout"))
    _no_cp(fn, cp_context)
    _no_intermediate(fn, return_intermediate_states)
    _safe_gate(fn, safe_gate, use_gate_in_kernel, lower_bound)
    v_first = _v_first(fn, state_v_first, kw)
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    gd, gl, gname, gx = _gate(fn, "key_channel", bool(use_gate_in_kernel), kw.get("A_log"), kw.get("dt_bias"),
                              lower_bound, HV, K)
    spec = _spec("fla_gdn2", "FLA chunk_gdn2",
                 ["input q, k : key", "input v : value"] + gd + ["input b : key_channel", "input w : value_channel"],
                 gl, bool(use_qk_l2norm_in_kernel), [f"decay vector({gname})", "gain key = b, value = w", "solve erase_write"])
    o, final = _run(fn, spec, {"q": q, "k": k, "v": v, "g": g, "b": b, "w": w, **gx}, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, v_first)},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=v_first, cp=_cp(fn, None, kwargs), keep_states=bool(disable_recompute))
    return o, (final["S"] if final is not None else None)


def _precond_slot(x: float, eps: float) -> str:
    if not float(x) > 0:
        raise ValueError(f"`x` (the squash range) must be positive, got {x}")
    if not float(eps) >= 0:
        raise ValueError(f"`eps` must be non-negative, got {eps}")
    return (f"precond diag(k * k, decay = g_atk, gain = beta_atk) -> "
            f"exp(-log({_num(x, 'x')}) * softsign(log(A + {_num(eps, 'eps')}) - log_atk_scale)) on write_key")


def _log_atk_scale(fn: str, log_atk_scale: Any, H: int, q: torch.Tensor) -> torch.Tensor | None:
    if log_atk_scale is None:
        return None  # the spec's default, -0.2
    if isinstance(log_atk_scale, int | float):
        return torch.full((H,), float(log_atk_scale), dtype=torch.float32, device=q.device)
    if not isinstance(log_atk_scale, torch.Tensor) or log_atk_scale.numel() != H:
        got = list(log_atk_scale.shape) if isinstance(log_atk_scale, torch.Tensor) else type(log_atk_scale).__name__
        raise TensorError(f"{fn}: `log_atk_scale` must be a per-key-head centre [H={H}] (or a float); got {got}")
    return log_atk_scale.reshape(H)


_PRECOND_DECLS = ["input g_atk : token log_gate key_head", "input beta_atk : token unit key_head",
                  "param log_atk_scale : head key_head = -0.2"]


def chunk_precond_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g_atk: torch.Tensor,
    g: torch.Tensor,
    beta_atk: torch.Tensor,
    beta: torch.Tensor,
    scale: float = None,
    initial_state: torch.Tensor = None,
    initial_A_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    transpose_state_layout: bool = False,
    x: float = 1.5,
    eps: float = 1e-6,
    log_atk_scale: torch.Tensor = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Preconditioned Gated DeltaNet (PDN paper eq. 9, scalar decay): GDN whose write key is `k̃ = M_t ⊙ k_t`.

    `A_t = exp(g_atk_t)·A_{t-1} + beta_atk_t·k_t²` (per key head: g_atk, beta_atk `[B, T, H]`, A `[N, H, K]`),
    `M_t = exp(−log(x)·softsign(log(A_t + eps) − log_atk_scale))`, `log_atk_scale [H]` (default −0.2; a float
    is accepted too). g, β `[B, T, HV]`. `use_qk_l2norm_in_kernel` (default True, as in FLA) normalises q and k
    before everything, the statistic included. `transpose_state_layout` transposes S. Returns
    `(o, final_state, final_A_state)`, the last two `None` unless `output_final_state`. `cp_context` raises
    NotImplementedError (as in FLA); `cu_seqlens_cpu` has no effect.
    """
    fn = "chunk_precond_gated_delta_rule"
    _no_cp(fn, cp_context)
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    spec = _spec("fla_precond_gated_delta_rule", "FLA chunk_precond_gated_delta_rule",
                 ["input q, k : key", "input v : value", "input g : token log_gate", "input beta : token unit"]
                 + _PRECOND_DECLS, [], bool(use_qk_l2norm_in_kernel),
                 ["decay scalar(g)", "gain beta", _precond_slot(x, eps), "solve delta"])
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "g_atk": g_atk, "beta_atk": beta_atk,
              "log_atk_scale": _log_atk_scale(fn, log_atk_scale, H, q)}
    o, final = _run(fn, spec, inputs, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, transpose_state_layout),
                             "A": initial_A_state},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=bool(transpose_state_layout))
    if final is None:
        return o, None, None
    return o, final["S"], final["A"]


def chunk_precond_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    g_atk: torch.Tensor,
    beta_atk: torch.Tensor,
    beta: torch.Tensor,
    scale: float = None,
    initial_state: torch.Tensor = None,
    initial_A_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_gate_in_kernel: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context: Any | None = None,
    transpose_state_layout: bool = False,
    x: float = 1.5,
    eps: float = 1e-6,
    log_atk_scale: torch.Tensor = None,
    solve_tril_precision: str | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Preconditioned KDA: KDA (`g [B, T, HV, K]`) with PGDN's diagonal ATK preconditioner on the write key.

    As FLA's chunk kernel, q and k are always L2-normalised in the kernel (eps 1e-6), the statistic included.
    Honoured: `use_gate_in_kernel` with kwargs `A_log [HV]`, optional `dt_bias [HV * K]` and `lower_bound`
    (as in `chunk_kda`), `x`, `eps`, `log_atk_scale [H]`, `initial_A_state [N, H, K]`,
    `transpose_state_layout`. No effect on the math: `safe_gate` (FLA's checks kept), `cu_seqlens_cpu`,
    `chunk_indices`, `solve_tril_precision`, kwarg `chunk_size`. `disable_recompute=True`: H_n and U kept for
    the backward. NotImplementedError: `cp_context`, `return_intermediate_states=True`.
    Returns `(o, final_state, final_A_state)`.
    """
    fn = "chunk_precond_kda"
    kw = _kwargs(fn, kwargs, ("A_log", "dt_bias", "chunk_size"))
    _no_cp(fn, cp_context)
    _no_intermediate(fn, return_intermediate_states)
    _safe_gate(fn, safe_gate, use_gate_in_kernel, lower_bound)
    if use_gate_in_kernel and "A_log" not in kw:
        raise ValueError(f"{fn}: `A_log` must be provided when `use_gate_in_kernel=True`")
    B, T, H, HV, K, V = _check_qkv(fn, q, k, v)
    gd, gl, gname, gx = _gate(fn, "key_channel", bool(use_gate_in_kernel), kw.get("A_log"), kw.get("dt_bias"),
                              lower_bound, HV, K)
    spec = _spec("fla_precond_kda", "FLA chunk_precond_kda",
                 ["input q, k : key", "input v : value"] + gd + ["input beta : token unit"] + _PRECOND_DECLS, gl, True,
                 [f"decay vector({gname})", "gain beta", _precond_slot(x, eps), "solve delta"])
    inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "g_atk": g_atk, "beta_atk": beta_atk,
              "log_atk_scale": _log_atk_scale(fn, log_atk_scale, H, q), **gx}
    o, final = _run(fn, spec, inputs, q=q,
                    initial={"S": _state_in(fn, "initial_state", initial_state, transpose_state_layout),
                             "A": initial_A_state},
                    output_final_state=output_final_state, cu_seqlens=_cu(cu_seqlens, q, fn), scale=scale,
                    v_first=bool(transpose_state_layout), cp=_cp(fn, None, kwargs),
                    keep_states=bool(disable_recompute))
    if final is None:
        return o, None, None
    return o, final["S"], final["A"]
