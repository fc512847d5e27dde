"""`DGPSLayer`: an `nn.Module` token mixer for any compiled spec, in the style of FLA's layers.

    hidden [B, T, d] ──q_proj/k_proj/v_proj──▶ (short conv + SiLU) ──▶ q, k [B, T, H, dk], v [B, T, HV, dv]
                     ──one projection per declared gate input──▶ domain map ──▶ gates
                     ──the compiled recurrence (Triton kernels)──▶ o [B, T, HV, dv]
                     ──per-head RMSNorm · silu(output gate)──▶ o_proj ──▶ out [B, T, d]

Nothing here knows a system by name; everything is read off the spec's IR:

* q, k (role `key`) and v (role `value`) come from bias-free projections of the hidden state, each
  through an optional causal depthwise short convolution, then SiLU (as FLA's GatedDeltaNet/KDA layers).
  When the spec does not L2-normalise q and k in the kernel but its write erases (delta family), or it
  preconditions or corrects the read, the layer normalises them (FLA's KDA layer does the same).
* Every other declared input gets its own projection of the hidden state: `token` inputs a linear map
  to one value per head; `key_channel` / `value_channel` inputs a low-rank map (like FLA's `gk_proj`).
  The raw projection is then mapped into the input's declared domain: `log_gate` by the Mamba/GDN map
  `−exp(A_log)·softplus(z + dt_bias)` (A_log, dt_bias owned by the layer), `unit` by sigmoid, `positive`
  by softplus, `free` unchanged. Inputs that the spec itself maps (`let g = -exp(A_log)*softplus(a+dt_bias)`)
  are declared `free`, so the activation stays fused in the kernel.
* Every declared `param` is an `nn.Parameter`, initialised by name / default: `A_log` = log U(1, 16),
  `dt_bias` = softplus⁻¹(dt), dt ~ logU(1e-3, 1e-1) (Mamba/FLA), a spec default (PDN's μ = −0.2), else 0.
* CCQ: the input that `read curvature(λ, ...)` reads is projected from the hidden state (the un-split
  query projection's input, never the normalised per-head query) with a zero weight and a bias chosen so
  that λ ≈ 0.01 at initialisation, whatever map (layer domain map and/or spec expression) produces λ.
* Per-key-head inputs and params (`key_head`, e.g. PDN's gP, βP, μ) are projected / shaped per key head.
* Routes. `route value` (CLVR): a zero-initialised Linear(HV·dv → d) of the route output is added to
  `out`, i.e. to the residual stream. `route residual` (CLER-H + CLER): the same zero-initialised
  projection of the write residual r, and the layer returns r in `extras["cler"]`; a `cler_in` (the
  nearest lower routable layer's r) is added to this layer's value target as Γ · cler_in with a
  learned scalar Γ (initialised to 0).

`backend="reference"` swaps the kernels for the spec's sequential reference (`rec.reference`, float64 by
default, autograd throughout): the layer around the recurrence is identical, which is how the tests check
the kernel path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compiler.ir import TensorDecl
from .api import Recurrence, load
from .compile import compile as compile_spec
from .evaluate import evaluate

LAMBDA_INIT = 0.01


def _inv_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


class ShortConvolution(nn.Module):
    """Causal depthwise conv1d over time ([B, T, C] in and out) with SiLU, a decoding cache and cu_seqlens.

    The cache holds the last `kernel_size - 1` inputs of each sequence, [N, C, kernel_size - 1].
    """

    def __init__(self, channels: int, kernel_size: int = 4, activation: bool = True) -> None:
        super().__init__()
        self.channels, self.kernel_size, self.activation = channels, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))
        bound = 1.0 / math.sqrt(kernel_size)  # nn.Conv1d's default for a depthwise conv (fan_in = kernel_size)
        nn.init.uniform_(self.weight, -bound, bound)

    def _conv(self, x: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [N, C, T]; cache: [N, C, K - 1] or None (zeros: the sequence starts here)
        K = self.kernel_size
        if cache is None:
            cache = x.new_zeros(x.shape[0], x.shape[1], K - 1)
        xp = torch.cat([cache.to(x.dtype), x], dim=-1)
        y = F.conv1d(xp, self.weight.unsqueeze(1).to(x.dtype), groups=self.channels)
        return y, xp[..., xp.shape[-1] - (K - 1):]

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if cu_seqlens is None:
            y, new_cache = self._conv(x.transpose(1, 2), cache)
            y = y.transpose(1, 2)
        else:
            bounds = [int(c) for c in cu_seqlens.tolist()]
            ys, caches = [], []
            for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
                yi, ci = self._conv(x[:, a:b].transpose(1, 2), None if cache is None else cache[i:i + 1])
                ys.append(yi.transpose(1, 2))
                caches.append(ci)
            y, new_cache = torch.cat(ys, dim=1), torch.cat(caches, dim=0)
        return (F.silu(y) if self.activation else y), new_cache


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm over the last axis with a learned weight, optionally times silu(gate)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
        if gate is not None:
            y = y * F.silu(gate.float())
        return y.to(dtype)


class DGPSLayer(nn.Module):
    """A token-mixing layer for any dgps spec (path, text or loaded `Recurrence`).

    forward(hidden [B, T, d], cu_seqlens=None, past_state=None, use_cache=False, cler_in=None)
        -> (out [B, T, d], new_state or None, extras)

    `new_state` (when `use_cache`) is {"rec": the recurrence's states (FLA layout), "conv": {q, k, v caches}};
    feed it back as `past_state` to continue the sequences. `extras` holds "route" (the raw route output,
    when the spec has one) and "cler" (the write residual r, for `route residual`).
    """

    def __init__(self, spec: str | Path | Recurrence, hidden_size: int, num_heads: int, head_k_dim: int,
                 head_v_dim: int, num_v_heads: int | None = None, use_short_conv: bool = True, conv_size: int = 4,
                 use_output_gate: bool = True, norm_eps: float = 1e-5, layer_idx: int | None = None,
                 gate_low_rank_dim: int | None = None, qk_norm: bool | None = None, backend: str = "kernel",
                 decode_max_len: int = 64, cp_group: Any = None, keep_states: bool = False,
                 cp_layout: str = "contiguous") -> None:
        super().__init__()
        # keep_states (FLA's disable_recompute): a training step keeps the state pass's H_n and U for the backward
        # instead of running that pass again there (the package's forward(keep_states=...), which refuses it with
        # cp_group)
        self.keep_states = keep_states
        # context parallelism (dgps.runtime.cp): each rank's forward takes its contiguous slice of the tokens (with
        # the global pack's cu_seqlens); decoding never shards (set cp_group = None on a model used for generation).
        # cp_layout="zigzag": FLA's zigzag slices (rank r: parts r and 2W - 1 - r of 2W), as ring-attention layers
        # beside it take them; the layer moves its hidden states to contiguous slices and its outputs back
        # (runtime/cp.py: relayout), so the convolutions' halo and the chain are the contiguous layout's
        from dgps.runtime.cp import CP_LAYOUTS

        if cp_layout not in CP_LAYOUTS:
            raise ValueError(f"DGPSLayer: cp_layout must be one of {CP_LAYOUTS}; got {cp_layout!r}")
        self.cp_group, self.cp_layout = cp_group, cp_layout
        self.rec = spec if isinstance(spec, Recurrence) else load(spec)
        ir = self.ir = self.rec.ir
        self.hidden_size, self.layer_idx = hidden_size, layer_idx
        self.H, self.HV = num_heads, num_v_heads or num_heads
        if self.HV % self.H:
            raise ValueError(f"num_v_heads={self.HV} must be a multiple of num_heads={self.H}")
        self.dk, self.dv = head_k_dim, head_v_dim
        self.use_short_conv, self.use_output_gate = use_short_conv, use_output_gate
        self.decode_max_len = decode_max_len
        self.backend = backend
        self.reference_dtype = torch.float64
        if backend not in ("kernel", "reference"):
            raise ValueError(f"backend must be 'kernel' or 'reference', got {backend!r}")
        self.pkg = compile_spec(self.rec) if backend == "kernel" else None
        self.route = ir.route
        if qk_norm is None:  # erase-type writes, preconditioners and read corrections need bounded keys
            bounded = ir.solve.kind != "additive" or ir.precond.kind != "none" or ir.read.kind != "none"
            qk_norm = bounded and not {"q", "k"} <= set(ir.normalize)
        self.qk_norm = qk_norm

        H, HV, dk, dv, d = self.H, self.HV, head_k_dim, head_v_dim, hidden_size
        self.q_proj = nn.Linear(d, H * dk, bias=False)
        self.k_proj = nn.Linear(d, H * dk, bias=False)
        self.v_proj = nn.Linear(d, HV * dv, bias=False)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(H * dk, conv_size)
            self.k_conv1d = ShortConvolution(H * dk, conv_size)
            self.v_conv1d = ShortConvolution(HV * dv, conv_size)

        lam_inputs = set()
        if ir.read.kind == "curvature" and ir.read.lam is not None:
            lam_inputs = {s.name for s in ir.read.lam.free_symbols}
        self.lambda_inputs = tuple(sorted(n for n in lam_inputs if not ir.input(n).is_param))
        rank = gate_low_rank_dim or head_v_dim
        self.gate_proj = nn.ModuleDict()
        self.gate_A_log = nn.ParameterDict()
        self.gate_dt_bias = nn.ParameterDict()
        self.params = nn.ParameterDict()
        self.gate_inputs: list[TensorDecl] = []
        for decl in ir.inputs:
            if decl.is_param:
                self.params[decl.name] = nn.Parameter(self._param_init(decl))
                if decl.name.endswith(("A_log", "dt_bias")):
                    self.params[decl.name]._no_weight_decay = True
                continue
            if decl.role in ("key", "value"):
                continue
            self.gate_inputs.append(decl)
            nh, ch = self._heads(decl), self._channels(decl)
            has_dt = decl.domain == "log_gate"
            if decl.role == "token":
                proj: nn.Module = nn.Linear(d, nh, bias=not has_dt)
            else:
                proj = nn.Sequential(nn.Linear(d, rank, bias=False), nn.Linear(rank, nh * ch, bias=not has_dt))
            self.gate_proj[decl.name] = proj
            if has_dt:
                self.gate_A_log[decl.name] = nn.Parameter(self._a_log_init(nh))
                self.gate_dt_bias[decl.name] = nn.Parameter(self._dt_bias_init(nh * max(ch, 1)))
                for p in (self.gate_A_log[decl.name], self.gate_dt_bias[decl.name]):
                    p._no_weight_decay = True  # as FLA marks A_log and dt_bias
        for name in self.lambda_inputs:
            self._init_lambda_gate(name)

        self.o_norm = GatedRMSNorm(dv, eps=norm_eps)
        if use_output_gate:
            self.g_proj = nn.Linear(d, HV * dv, bias=False)
        self.o_proj = nn.Linear(HV * dv, d, bias=False)
        if self.route in ("value", "residual"):
            self.route_proj = nn.Linear(HV * dv, d, bias=False)
            nn.init.zeros_(self.route_proj.weight)
        if self.route == "residual":
            self.cler_gamma = nn.Parameter(torch.zeros(()))

    # -- initialisation -------------------------------------------------------------------------------

    def _heads(self, decl: TensorDecl) -> int:
        return self.H if decl.heads == "key" else self.HV

    def _channels(self, decl: TensorDecl) -> int:
        return {"key_channel": self.dk, "value_channel": self.dv}.get(decl.role, 0)

    @staticmethod
    def _a_log_init(n: int) -> torch.Tensor:
        return torch.empty(n).uniform_(1, 16).log()

    @staticmethod
    def _dt_bias_init(n: int, dt_min: float = 1e-3, dt_max: float = 1e-1, floor: float = 1e-4) -> torch.Tensor:
        dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
        return _inv_softplus(dt)

    def _param_init(self, decl: TensorDecl) -> torch.Tensor:
        nh, ch = self._heads(decl), self._channels(decl)
        shape = (nh, ch) if ch else (nh,)
        if decl.default is not None:
            return torch.full(shape, float(decl.default))
        if decl.name == "A_log" or decl.name.endswith("A_log"):
            return self._a_log_init(math.prod(shape)).reshape(shape)
        if decl.name == "dt_bias" or decl.name.endswith("dt_bias"):
            return self._dt_bias_init(math.prod(shape)).reshape(shape)
        return torch.zeros(shape)

    def _domain_map(self, decl: TensorDecl, z: torch.Tensor) -> torch.Tensor:
        """Map a raw projection [B, T, nh(, ch)] into the input's declared domain."""
        if decl.domain == "log_gate":
            dt_bias = self.gate_dt_bias[decl.name].reshape(z.shape[2:])
            A = self.gate_A_log[decl.name].float().exp().reshape((z.shape[2],) + (1,) * (z.dim() - 3))
            return -A * F.softplus(z.float() + dt_bias.float())
        if decl.domain == "unit":
            return torch.sigmoid(z)
        if decl.domain == "positive":
            return F.softplus(z)
        return z

    def _init_lambda_gate(self, name: str) -> None:
        """CCQ: W_λ = 0 and the bias that makes λ ≈ 0.01 through the domain map and the spec's λ expression."""
        decl = self.ir.input(name)
        proj = self.gate_proj[name]
        last = proj if isinstance(proj, nn.Linear) else proj[-1]
        if last.bias is None:
            raise ValueError(f"{self.ir.name}: the read-correction gate `{name}` must not be a log_gate")
        lam = self.ir.read.lam
        z = torch.linspace(-30.0, 30.0, 60001, dtype=torch.float64)
        x = self._domain_map(decl, z.reshape(1, -1, 1)).reshape(-1).double()
        env: dict[str, Any] = {name: x}
        for other in (s for s in lam.free_symbols if s.name != name):
            d = self.ir.input(other.name)
            if d.is_param and other.name in self.params:
                env[other.name] = float(self.params[other.name].detach().reshape(-1)[0])
            else:
                env[other.name] = 0.0
        try:
            vals = torch.as_tensor(evaluate(lam, env, like=x), dtype=torch.float64).expand_as(x)
            z0 = float(z[(vals - LAMBDA_INIT).abs().argmin()])
        except Exception:  # an exotic λ expression: fall back to the usual sigmoid parameterisation
            z0 = math.log(LAMBDA_INIT / (1 - LAMBDA_INIT))
        with torch.no_grad():
            for m in ([proj] if isinstance(proj, nn.Linear) else list(proj)):
                m.weight.zero_()
            last.bias.fill_(z0)

    # -- forward --------------------------------------------------------------------------------------

    def gates(self, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every declared non-q/k/v input, projected from the hidden state and mapped into its domain."""
        B, T, _ = hidden.shape
        out = {}
        for decl in self.gate_inputs:
            nh, ch = self._heads(decl), self._channels(decl)
            z = self.gate_proj[decl.name](hidden)
            z = z.reshape(B, T, nh, ch) if ch else z.reshape(B, T, nh)
            out[decl.name] = self._domain_map(decl, z).to(hidden.dtype)
        return out

    def _qkv(self, hidden: torch.Tensor, conv_cache: dict[str, torch.Tensor] | None,
             cu_seqlens: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        B, T, _ = hidden.shape
        xs = {"q": self.q_proj(hidden), "k": self.k_proj(hidden), "v": self.v_proj(hidden)}
        new_cache: dict[str, torch.Tensor] = {}
        if self.use_short_conv and self.cp_group is not None:  # a CP slice: the convolutions read a halo
            xs, new_cache = self._conv_cp(xs, conv_cache, cu_seqlens)
        else:
            for n in ("q", "k", "v"):
                if self.use_short_conv:
                    conv = getattr(self, f"{n}_conv1d")
                    xs[n], new_cache[n] = conv(xs[n], None if conv_cache is None else conv_cache.get(n), cu_seqlens)
                else:
                    xs[n] = F.silu(xs[n])
        xs["q"] = xs["q"].reshape(B, T, self.H, self.dk)
        xs["k"] = xs["k"].reshape(B, T, self.H, self.dk)
        xs["v"] = xs["v"].reshape(B, T, self.HV, self.dv)
        if self.qk_norm:
            xs["q"], xs["k"] = _l2norm(xs["q"]), _l2norm(xs["k"])
        return xs, new_cache

    def _conv_cp(self, xs: dict[str, torch.Tensor], conv_cache: dict[str, torch.Tensor] | None,
                 cu_seqlens: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The short convolutions of one CP slice (`cu_seqlens`: the global pack's, as the recurrence takes them).
        Each local segment starts from the conv_size − 1 inputs before it: for the segment that continues a sequence
        from the earlier ranks, their last tokens (runtime/cp.py `halo`, one all_gather for q, k and v, its gradient
        sent back to their owners), the sequence's initial cache (`conv_cache`, per global sequence) in the positions
        before the sequence's first token; for a segment that starts in the slice, its initial cache. The new caches
        come back per global sequence, filled on the rank where the sequence ends and zero elsewhere (as the
        recurrence's final states)."""
        from dgps.runtime.cp import halo, slice_layout, slice_start

        B, T, _ = xs["q"].shape
        group, w = self.cp_group, self.q_conv1d.kernel_size - 1
        lengths, start = slice_start(T, group, xs["q"].device)
        cu = None if cu_seqlens is None else [int(c) for c in cu_seqlens.tolist()]
        lay = slice_layout(cu, B, start, start + T, sum(lengths))
        prev = halo(xs, w, group, lengths)
        # the halo's positions start − w .. start − 1: the continued sequence's tokens from its first one (s0) on,
        # its initial cache before it (position s0 − j is the cache's j-th entry from its end)
        s0 = 0 if cu is None else cu[lay.rows[0]]
        pos = torch.arange(start - w, start, device=xs["q"].device)
        inside = (pos >= s0)[None, None, :]
        cache_col = (pos - s0 + w).clamp(0, w - 1)
        first = list(lay.rows) if not lay.packed else [lay.rows[0]]
        local_cu = None if not lay.packed else torch.tensor(lay.local_cu, dtype=torch.int32)
        ends = [i for i, e in enumerate(lay.ends) if e]
        out, new_cache = dict(xs), {}
        for n in ("q", "k", "v"):
            x = xs[n]
            init = conv_cache.get(n) if conv_cache else None
            rows = init.to(x.dtype) if init is not None else x.new_zeros(lay.n_rows, x.shape[2], w)
            window = torch.where(inside, prev[n].transpose(1, 2), rows[first][..., cache_col])
            local = torch.cat([window, rows[list(lay.rows[1:])]], dim=0) if lay.packed else window
            out[n], mine = getattr(self, f"{n}_conv1d")(x, local, local_cu)
            placed = mine.new_zeros(lay.n_rows, *mine.shape[1:])
            placed[[lay.rows[i] for i in ends]] = mine[ends]
            new_cache[n] = placed
        return out, new_cache

    def recurrence_inputs(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                          conv_cache: dict[str, torch.Tensor] | None = None,
                          cler_in: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The named inputs of the recurrence for `hidden` (and the new conv caches)."""
        x, new_cache = self._qkv(hidden, conv_cache, cu_seqlens)
        if cler_in is not None:
            if self.route != "residual":
                raise ValueError(f"{self.ir.name}: cler_in is only accepted by a layer with `route residual`")
            if tuple(cler_in.shape) != tuple(x["v"].shape):
                raise ValueError(f"cler_in has shape {list(cler_in.shape)}; this layer's value target is {list(x['v'].shape)}")
            x["v"] = x["v"] + self.cler_gamma.to(x["v"].dtype) * cler_in.to(x["v"].dtype)
        x.update(self.gates(hidden))
        for name, p in self.params.items():
            x[name] = p.to(hidden.dtype)
        return x, new_cache

    def _recurrence(self, x: dict[str, torch.Tensor], state: dict[str, torch.Tensor] | None, use_cache: bool,
                    cu_seqlens: torch.Tensor | None):
        T = x["q"].shape[1]
        if self.backend == "reference":
            return self.rec.reference(**x, initial_state=state, output_final_state=use_cache, cu_seqlens=cu_seqlens,
                                      dtype=self.reference_dtype)
        if self.pkg is None:  # built with backend="reference" and switched to the kernels since
            self.pkg = compile_spec(self.rec)
        if use_cache and state is not None and T <= self.decode_max_len and not torch.is_grad_enabled():
            # decoding: the recurrent kernel advances (a copy of) the cached states in place
            state = {n: s.clone() for n, s in state.items()}
            out = self.pkg.decode(**{n: t.contiguous() for n, t in x.items()}, state=state, cu_seqlens=cu_seqlens)
            out.final_state = state
            return out
        return self.pkg.forward(**{n: t.contiguous() for n, t in x.items()}, initial_state=state,
                                output_final_state=use_cache, cu_seqlens=cu_seqlens, cp_group=self.cp_group,
                                keep_states=self.keep_states)

    def forward(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                past_state: dict[str, Any] | None = None, use_cache: bool = False,
                cler_in: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any] | None, dict[str, torch.Tensor]]:
        if hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must be [B, T, {self.hidden_size}], got {list(hidden.shape)}")
        if self.cp_group is not None and self.backend != "kernel":
            raise NotImplementedError(f"{self.ir.name}: DGPSLayer(cp_group=...) needs backend='kernel' (the sequential "
                                      "reference does not chain slices)")
        if self.cp_group is not None and self.cp_layout == "zigzag":
            from dgps.runtime.cp import check_zigzag, relayout

            check_zigzag(hidden.shape[1], self.cp_group, hidden.device, f"{self.ir.name}: DGPSLayer")
            ins = [hidden] + ([cler_in] if cler_in is not None else [])
            moved = relayout(ins, self.cp_group, "zigzag", "contiguous")
            y, new_state, extras = self._forward(moved[0], cu_seqlens, past_state, use_cache,
                                                 moved[1] if cler_in is not None else None)
            names = list(extras)
            back = relayout([y, *(extras[n] for n in names)], self.cp_group, "contiguous", "zigzag")
            return back[0], new_state, dict(zip(names, back[1:], strict=True))
        return self._forward(hidden, cu_seqlens, past_state, use_cache, cler_in)

    def _forward(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor | None, past_state: dict[str, Any] | None,
                 use_cache: bool, cler_in: torch.Tensor | None
                 ) -> tuple[torch.Tensor, dict[str, Any] | None, dict[str, torch.Tensor]]:
        B, T, _ = hidden.shape
        past_state = past_state or {}
        x, conv_cache = self.recurrence_inputs(hidden, cu_seqlens, past_state.get("conv"), cler_in)
        out = self._recurrence(x, past_state.get("rec"), use_cache, cu_seqlens)
        o = out.o.to(hidden.dtype)
        gate = self.g_proj(hidden).reshape(B, T, self.HV, self.dv) if self.use_output_gate else None
        o = self.o_norm(o, gate).reshape(B, T, self.HV * self.dv)
        y = self.o_proj(o)
        extras: dict[str, torch.Tensor] = {}
        if out.route is not None:
            route = out.route.to(hidden.dtype)
            extras["route"] = route
            y = y + self.route_proj(route.reshape(B, T, self.HV * self.dv))
            if self.route == "residual":
                extras["cler"] = route
        new_state = {"rec": out.final_state, "conv": conv_cache} if use_cache else None
        return y, new_state, extras

    def extra_repr(self) -> str:
        return (f"spec={self.ir.name}, hidden_size={self.hidden_size}, heads={self.H}x{self.dk} (k) / {self.HV}x{self.dv} "
                f"(v), short_conv={self.use_short_conv}, output_gate={self.use_output_gate}, route={self.route}, "
                f"backend={self.backend}")
