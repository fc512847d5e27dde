"""Recurrence `gdn`, compiled by dgps 0.1.0 from spec.dgps. Generated: do not edit.

    dgps.generated.gdn.forward(...)    the forward pass (chunked kernels), FLA layout [B, T, heads, channel]
    dgps.generated.gdn.decode(...)     single/few-step recurrent kernel that updates the states in place
    dgps.generated.gdn.reference(...)  the float64-capable sequential reference derived from the same spec
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

import dgps
from dgps.runtime.reference import RecurrenceOutput, initial_states
from dgps.runtime.reference import reference as _reference
from dgps.runtime.tensors import check_cu_seqlens, check_inputs

from . import backward, recurrent
from . import chunk

_HERE = Path(__file__).resolve().parent
SPEC_TEXT = (_HERE / "spec.dgps").read_text()
METADATA = json.loads((_HERE / "metadata.json").read_text())
IR = recurrent.IR  # the lowered IR, embedded once (recurrent.py): importing the package parses nothing


def __getattr__(name: str):  # noqa: ANN202 - the module's lazy attributes
    if name == "RECURRENCE":  # the checked spec (AST and IR), parsed on first use
        globals()["RECURRENCE"] = dgps.load(SPEC_TEXT, filename="gdn/spec.dgps")
        return globals()["RECURRENCE"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
INPUTS = ('q', 'k', 'v', 'g', 'beta')
STATES = ('S',)
ROUTE = "none"
_N_OUT = 1 + len(STATES) + (ROUTE != "none")  # the forward's outputs before the kept buffers: o, states, route



def _inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> dict[str, torch.Tensor | None]:
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta}


def _run_forward(inputs: dict[str, torch.Tensor], states: dict[str, torch.Tensor], cu_seqlens: torch.Tensor | None,
                 scale: float | None, keep: bool, keep_states: bool) -> tuple[RecurrenceOutput, list[torch.Tensor]]:
    """The forward and (keep: a training step) the per-token buffers the chunked backward reuses (keep_states: the
    state pass's H_n and U too)."""
    if keep:
        return chunk.chunk_forward_train(inputs, initial_state=states, cu_seqlens=cu_seqlens, scale=scale,
                                         keep_states=keep_states)
    return chunk.chunk_forward(inputs, initial_state=states, output_final_state=True, cu_seqlens=cu_seqlens,
                               scale=scale), []


def _forward_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_S: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    scale: float,
    keep: bool,
    keep_states: bool,
) -> list[torch.Tensor]:
    """o, the final states, the route (if any) and (keep) the buffers the backward reuses, as one flat list."""
    out, kept = _run_forward({"q": q, "k": k, "v": v, "g": g, "beta": beta}, {"S": state_S}, cu_seqlens, scale, keep, keep_states)
    outs = [out.o] + [out.final_state[s] for s in STATES]
    if ROUTE != "none":
        route = out.route
        outs.append(route.clone() if route.data_ptr() in {t.data_ptr() for t in (q, k, v, g, beta, state_S)} else route)
    return outs + kept


def _backward_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_S: torch.Tensor,
    do: torch.Tensor,
    d_states: dict[str, torch.Tensor],
    d_route: torch.Tensor | None,
    kept: list[torch.Tensor],
    cu_seqlens: torch.Tensor | None,
    scale: float,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(gradients of the inputs and params, gradients of the initial states the backward reaches)."""
    return chunk.chunk_backward(
        {"q": q, "k": k, "v": v, "g": g, "beta": beta}, initial_state={"S": state_S}, do=do, d_final_state=d_states, d_route=d_route,
        cu_seqlens=cu_seqlens, scale=scale, kept=kept or None,

    )


# Under torch.compile the forward and backward are custom ops, so that torch.compile(fullgraph=True) sees one
# opaque node each, with shape-only fake implementations. Eager calls take _Eager (a plain autograd.Function)
# with the same two bodies: the custom ops' dispatch, schema checks and output flattening cost 30-60 µs of host
# time per call on the H200's host (benchmarks/host_overhead.py), where a small call is host-bound.
_LIB = "dgps_" + re.sub(r"\W", "_", __name__)


@torch.library.custom_op(f"{_LIB}::forward", mutates_args=())
def _forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_S: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    scale: float,
    keep: bool,
    keep_states: bool,
) -> list[torch.Tensor]:
    return _forward_impl(q, k, v, g, beta, state_S, cu_seqlens, scale, keep, keep_states)


@_forward_op.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_S: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    scale: float,
    keep: bool,
    keep_states: bool,
) -> list[torch.Tensor]:
    outs = [q.new_empty((*v.shape[:3], v.shape[3]))] + [torch.empty_like(s) for s in (state_S,)]
    if ROUTE != "none":
        outs.append(q.new_empty(v.shape))
    if keep:
        B, T, H, DK = q.shape
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        outs += chunk.kept_like(B, T, H, v.shape[2], DK, v.shape[3], q.dtype, q.device, N, states=keep_states)
    return outs


@torch.library.custom_op(f"{_LIB}::backward", mutates_args=())
def _backward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_S: torch.Tensor,
    grads: list[torch.Tensor],
    kept: list[torch.Tensor],
    cu_seqlens: torch.Tensor | None,
    scale: float,
) -> list[torch.Tensor]:
    do, d_states = grads[0], dict(zip(STATES, grads[1:1 + len(STATES)], strict=True))
    d_route = grads[1 + len(STATES)] if ROUTE != "none" else None
    g_in, g_state = _backward_impl(q, k, v, g, beta, state_S, do, d_states, d_route, kept, cu_seqlens, scale)
    return [g_in[n] for n in INPUTS] + [g_state[s] if s in g_state else torch.zeros_like(t)
                                        for s, t in zip(STATES, (state_S,), strict=True)]


@_backward_op.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_S: torch.Tensor,
    grads: list[torch.Tensor],
    kept: list[torch.Tensor],
    cu_seqlens: torch.Tensor | None,
    scale: float,
) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in (q, k, v, g, beta, state_S)]


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    *tensors, cu_seqlens, scale, keep, keep_states = inputs
    kept = list(output[_N_OUT:])  # the per-token buffers the forward kept for the chunked backward
    ctx.mark_non_differentiable(*kept)
    ctx.save_for_backward(*tensors, *kept)
    ctx.n_tensors, ctx.cu_seqlens, ctx.scale = len(tensors), cu_seqlens, scale
    # without this, autograd hands _backward a zero tensor for every kept buffer (non-differentiable outputs still
    # get materialized gradients) and every unused final state: the custom-op path held 225 MiB more than the
    # eager one at gdn's peak (run 32)
    ctx.set_materialize_grads(False)


def _backward(ctx, grads):  # noqa: ANN001, ANN202 - torch.library's signature
    saved = ctx.saved_tensors
    tensors, kept = saved[:ctx.n_tensors], list(saved[ctx.n_tensors:])
    likes = _output_likes(tensors)
    grads = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads[:len(likes)], likes, strict=True)]
    out = _backward_op(*tensors, grads, kept, ctx.cu_seqlens, ctx.scale)
    return (*out, None, None, None, None)


def _output_likes(tensors) -> list[torch.Tensor]:  # noqa: ANN001
    q, v = tensors[0], tensors[2]
    states = tensors[len(INPUTS):]
    outs = [q.new_empty(v.shape)] + list(states)
    if ROUTE != "none":
        outs.append(q.new_empty(v.shape))
    return outs


torch.library.register_autograd(f"{_LIB}::forward", _backward, setup_context=_setup_context)


def _saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks are active (torch.autograd.graph.saved_tensors_hooks); True where this torch cannot
    say (a private API: without it, every kept buffer goes through save_for_backward)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None


class _Eager(torch.autograd.Function):
    """The eager training path: _forward_impl and _backward_impl under a plain autograd.Function."""

    @staticmethod
    def forward(ctx, cu_seqlens, scale, keep, keep_states, *tensors):  # noqa: ANN001, ANN205 - autograd's signature
        outs = _forward_impl(*tensors, cu_seqlens, scale, keep, keep_states)
        kept = outs[_N_OUT:]
        ctx.mark_non_differentiable(*kept)
        # The kept buffers go to the backward in a list it consumes (chunk_backward frees each after its last reader:
        # W and Ũ are dead after the reverse state pass, long before the chunk gradients' peak), unless saved-tensor
        # hooks are active (activation checkpointing, CPU offload): those must see every saved tensor, so there
        # they go through save_for_backward and stay held until the backward returns.
        ctx.kept = list(kept) if kept and not _saved_tensor_hooks() else None
        ctx.save_for_backward(*tensors, *(kept if ctx.kept is None else ()))
        ctx.n_tensors, ctx.cu_seqlens, ctx.scale = len(tensors), cu_seqlens, scale
        ctx.set_materialize_grads(False)  # an unused final state's gradient stays None: no zeros are built
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001, ANN205 - autograd's signature
        saved = ctx.saved_tensors
        tensors, kept = saved[:ctx.n_tensors], list(saved[ctx.n_tensors:])
        if ctx.kept is not None:  # one backward owns them; a second one (retain_graph) recomputes the forward
            kept, ctx.kept = ctx.kept, None
        do = grads[0] if grads[0] is not None else torch.zeros_like(_output_likes(tensors)[0])
        d_states = {s: g for s, g in zip(STATES, grads[1:1 + len(STATES)], strict=True) if g is not None}
        d_route = grads[1 + len(STATES)] if ROUTE != "none" else None
        g_in, g_state = _backward_impl(*tensors, do, d_states, d_route, kept, ctx.cu_seqlens, ctx.scale)
        return (None, None, None, None, *(g_in[n] for n in INPUTS), *(g_state.get(s) for s in STATES))


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | dict[str, torch.Tensor] | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    cp_group: Any = None,
    keep_states: bool = False,
    cp_layout: str = "contiguous",
) -> RecurrenceOutput:
    """o [B, T, HV, dv], final states (dict, FLA layout, when asked) and the route output, if any.

    Differentiable with respect to every input, param and initial state (chunked backward kernels).
    `cp_group` (a torch.distributed group): context parallelism, this rank's contiguous slice of the tokens with
    the global pack's `cu_seqlens` (dgps.runtime.cp; docs/context_parallel.md); `cp_layout="zigzag"`: FLA's zigzag
    slices instead (the tokens in 2W equal parts, rank r holding parts r and 2W - 1 - r, front then back).
    `keep_states` (FLA's disable_recompute): a training step keeps the state pass's per-chunk states H_n and U for
    the backward instead of running the state pass again there: one launch less per step for 768 B more
    per token and value head (dk = dv = 128, bf16) held from the forward to the backward. Not with `cp_group`.
    """
    if cp_group is not None and keep_states:
        raise dgps.TensorError("gdn.forward: keep_states is not supported with cp_group (the context-parallel "
                               "backward reruns its state passes)")
    if cp_group is not None:
        from dgps.runtime.cp import cp_forward

        return cp_forward(sys.modules[__name__], _inputs(q, k, v, g, beta), group=cp_group, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens, scale=scale,
                          cp_layout=cp_layout)
    x, dims = check_inputs(IR, _inputs(q, k, v, g, beta))
    if x["q"].dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise dgps.TensorError(f"gdn.forward: the kernels take bf16, fp16 or fp32 inputs; q is {x['q'].dtype} "
                               "(cast the inputs, or use reference(...) for float64)")
    ranges = check_cu_seqlens(cu_seqlens, dims)
    # a state nobody gave goes on as a zero_state (one element, expanded): the chunk kernels start from zero without
    # reading it, and no [N, HV, dk, dv] zeros are formed per call; traced calls (fake tensors) take real zeros
    traced = torch.compiler.is_compiling() or any(isinstance(t, FakeTensor) for t in x.values())
    states = initial_states(IR, dims, len(ranges) if ranges else dims.B, initial_state, torch.float32, x["q"].device,
                            lazy=not traced)
    states = {n: s.float() for n, s in states.items()}
    if scale is None:
        scale = IR.scale if IR.scale is not None else dims.dk ** -0.5
    tensors = [*(x[n] for n in INPUTS), *(states[s] for s in STATES)]
    # a training step keeps the forward's per-token buffers for the backward instead of recomputing them
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    keep = True and needs_grad
    try:
        if torch.compiler.is_compiling() or any(isinstance(t, FakeTensor) for t in tensors):  # traced: the custom ops
            outs = _forward_op(*tensors, cu_seqlens, float(scale), keep, keep_states and keep)
        elif needs_grad:
            outs = _Eager.apply(cu_seqlens, float(scale), keep, keep_states and keep, *tensors)
        else:  # nothing to differentiate: no autograd node at all
            outs = _forward_impl(*tensors, cu_seqlens, float(scale), keep, False)
    except (RuntimeError, ValueError):
        # Triton's own failure for CPU tensors without the interpreter ("0 active drivers", "cpu tensor?")
        if x["q"].device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise dgps.TensorError(f"gdn.forward: the inputs are on the CPU and Triton's interpreter is off; "
                                   "move them to the GPU, or set TRITON_INTERPRET=1 before importing dgps") from None
        raise
    final = dict(zip(STATES, outs[1:1 + len(STATES)], strict=True)) if output_final_state else None
    return RecurrenceOutput(outs[0], final, outs[1 + len(STATES)] if ROUTE != "none" else None)


def decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    *,
    state: dict[str, torch.Tensor],
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
) -> RecurrenceOutput:
    """Advance `state` (every entry of STATES, updated in place) by the given tokens."""
    missing = [s for s in STATES if s not in state]
    if missing:
        raise dgps.TensorError(f"gdn.decode: state is missing {missing}; it carries {list(STATES)}")
    return recurrent.recurrent_forward(
        _inputs(q, k, v, g, beta), initial_state=state, output_final_state=True, cu_seqlens=cu_seqlens, scale=scale,
        inplace=True,
    )


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | dict[str, torch.Tensor] | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    dtype: torch.dtype | None = None,
) -> RecurrenceOutput:
    """The sequential reference (token by token, autograd) in `dtype` (default: q's dtype)."""
    inputs = {k: x for k, x in _inputs(q, k, v, g, beta).items() if x is not None}
    return _reference(IR, inputs, initial_state=initial_state, output_final_state=output_final_state,
                      cu_seqlens=cu_seqlens, scale=scale, dtype=dtype)

