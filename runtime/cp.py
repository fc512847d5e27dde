"""Context parallelism: each rank runs its contiguous slice of the tokens; the slices are chained affinely.

Every DGPS state update is affine in the carried state, so a rank's slice maps its incoming state h_in
(FLA layout h = Sᵀ, [dk, dv] per head) to its outgoing one as

    h_out = M · h_in + h⁰        M [dk, dk] = the product of the slice's key-side transitions

(left-multiplied: the transitions act on h's key rows, each value column evolves on its own). The auxiliary
states have their own recurrences that read neither S nor v, so their chains go first:

    A_out = exp(Σ decay) ⊙ A_in + A⁰    (the diag preconditioner's statistic: an elementwise decayed scan)
    C_out = C_in + C⁰, m_out = m_in + m⁰, n_out = n_in + n⁰    (CCQ: additive sums, the count an offset)

The exact preconditioner's P_t = (P_{t-1}⁻¹ + k kᵀ)⁻¹ is not affine in P (its Gram G = P⁻¹ is additive, but the
kernels carry P), so CP refuses it (`CPUnsupported`).

How a rank gets (M, h⁰), and what runs how often (compiler/plan.py: cp_stages decides; docs/context_parallel.md):
the stages that read no incoming state (the intra-chunk work: interaction, solve, w/u, the decayed keys) run once
and their buffers serve every pass; the transition is the state pass alone, the values (Ũ) widened by dk zero
columns and the continued segment started from [0 | I], so its final state is [h⁰ | M] (the extra columns start at
the identity and receive no writes); then, from the true incoming state, the state pass and the output. That is
exact when nothing but the write reads the value-side inputs and the write is linear in v (`cp_plan` checks the
IR). The ranks all-gather (M, h⁰), each composes its true incoming state in fp32 (a prefix over the earlier ranks).
The chunk module runs the launches (chunk_forward_cp / chunk_backward_cp), this module the exchanges between them,
inside one autograd node per slice (_CPCall).

The backward is the slice's one chunk backward with the later ranks' adjoint g of its outgoing state added to the
final-state adjoint (the transition's adjoint from the later ranks' compose is G_M = g s_inᵀ, so its share is S_out's
with adjoint g); g needs their d0, the adjoint of their incoming state from their own outputs, so the reverse state
pass runs once for d0, the ranks all-gather it and form g_r = d0_(r+1) + M_(r+1)ᵀ g_(r+1), and it runs again with g.
The auxiliary states do the same with their scans and multipliers. A pass whose adjoint is zero by the layout is not
run. A package without these entry points keeps the earlier path: whole package calls under autograd (from zero
states for the auxiliary offsets, the widened call, the real one: the intra-chunk work 2-3 times).

Sequences (varlen, `cu_seqlens` of the global pack) may cross rank boundaries; a sequence that starts inside a
rank resets there, so the rank's outgoing state depends on its incoming one only when no sequence starts in
its slice (`SliceLayout.passes_through`). Final states come back per global sequence: a row is filled on the
rank where that sequence ends and zero elsewhere (summed over the ranks, they are the unsharded call's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import sympy as sp
import torch

from dgps.compiler.ir import IR
from dgps.runtime.evaluate import evaluate
from dgps.runtime.reference import RecurrenceOutput, build_env, initial_states
from dgps.runtime.tensors import Dims, TensorError, check_cu_seqlens, check_inputs

AUX_STATES = ("A", "C", "m", "n")
# False (or DGPS_CP_CALLS=1): CP through whole package calls even where the chunk module carries the CP entry points
# (benchmarks/cp_one_gpu.py --calls times both)
KERNEL_PATH = os.environ.get("DGPS_CP_CALLS", "0") in ("", "0")


class CPUnsupported(NotImplementedError):
    """The spec's state update cannot be chained across ranks by dgps's affine CP path."""


@dataclass(frozen=True)
class CPPlan:
    """What context parallelism adds to a spec's plan: the chains, the exchanges, the passes per slice and which
    stages each runs (`stages`: compiler.plan.cp_stages, filled by cp_plan(ir, stages=True)), or why it is refused."""

    name: str
    chains: tuple[str, ...]  # one line per state chain, in the order they are composed
    exchanges: tuple[str, ...]
    calls: tuple[str, ...]  # the passes per slice
    refused: str | None = None
    stages: tuple[str, ...] = ()

    def format(self) -> str:
        lines = [f"CP plan {self.name} (context parallelism, `forward(..., cp_group=group)`)"]
        if self.refused:
            lines.append(f"  refused: {self.refused}")
            return "\n".join(lines)
        lines.append("  chains (composed in this order, fp32, a prefix over the ranks before this one):")
        lines += [f"    {c}" for c in self.chains]
        lines.append("  exchanges (torch.distributed all_gather, inside the slice's one autograd node):")
        lines += [f"    {e}" for e in self.exchanges]
        lines.append("  passes per slice (chunk_forward_cp / chunk_backward_cp of the chunk module):")
        lines += [f"    {c}" for c in self.calls]
        lines += list(self.stages)
        lines.append("  varlen: a sequence starting inside a slice resets there (that rank's M = 0); final states are")
        lines.append("    filled on the rank where each sequence ends, zero elsewhere")
        return "\n".join(lines)


def _names(expr: sp.Expr | None) -> set[str]:
    return set() if expr is None else {s.name for s in expr.free_symbols}


def cp_plan(ir: IR, stages: bool = False) -> CPPlan:
    """Check that `ir` chains affinely across ranks through the widened-value transition, and describe the chains;
    `stages`: also the chunk plan's stages per pass (compiler.plan.cp_stages; builds the plan)."""
    value_side = {d.name for d in ir.inputs if d.vector == "value"}
    value_side |= {r.name for r in ir.reductions if r.side == "value"}
    e, f, vp, _w = ir.solve.canonical()
    reads: list[tuple[str, sp.Expr | None]] = [("erase key e", e), ("write key f", f), ("write key w", _w),
                                               ("decay", ir.decay.log_gate)]
    d = ir.precond.diag
    if d is not None:
        reads += [("preconditioner statistic", d.stat), ("preconditioner decay", d.decay),
                  ("preconditioner gain", d.gain), ("preconditioner map", d.map)]
    refused = None
    if ir.precond.kind == "exact":
        refused = ("the exact preconditioner's P_t = (P_{t-1}^-1 + k k^T)^-1 is not affine in P (its Gram G = P^-1 is "
                   "additive and would chain, but the kernels carry P, not G)")
    elif any(r.side == "value" for r in ir.reductions):
        refused = "a value-side channel reduction would read the widened value columns"
    else:
        for what, ex in reads:
            hit = _names(ex) & value_side
            if hit:
                refused = f"the {what} reads the value-side input(s) {sorted(hit)}: the transition would depend on v"
                break
    if refused is None:
        vsyms = [s for s in vp.free_symbols if s.name in {x.name for x in ir.inputs if x.role == "value"}]
        zero = vp.subs({s: 0 for s in vsyms})
        if not vsyms or sp.simplify(zero) != 0 or any(sp.diff(vp, s, 2) != 0 for s in vsyms):
            refused = f"the write v' = {vp} is not linear in the value input"
    if refused:
        return CPPlan(ir.name, (), (), (), refused)
    chains, aux = [], []
    if d is not None:
        mult = f"exp(sum of {d.decay})" if d.decay is not None else "1"
        chains.append(f"A [N, {'H' if d.heads == 'key' else 'HV'}, dk]: A_out = {mult} * A_in + A0  (elementwise; "
                      "reads neither S nor v)")
        aux.append("A")
    if ir.read.kind == "curvature":
        chains.append("C [N, H, dk, dk], m [N, H, dk], n [N]: X_out = X_in + X0  (additive sums; the count an offset)")
        aux += ["C", "m", "n"]
    chains.append("S [N, HV, dk, dv] (h = S^T): h_out = M h_in + h0, M [N, HV, dk, dk] the slice's transition product"
                  + (" (given the true incoming " + ", ".join(aux) + ")" if aux else ""))
    exchanges = []
    calls = []
    if aux:
        exchanges.append(f"forward: ({', '.join(x + '0, its multiplier' for x in aux)}) per rank; backward: the "
                         "adjoints d0 of the incoming " + ", ".join(x for x in aux if x != "n") + " per rank")
        calls.append("aux offsets: the auxiliary scans with the continued segment from zero: "
                     + ", ".join(x + "0" for x in aux))
    exchanges.append("forward: (M, h0) per rank; backward: the adjoint d0 of the incoming S per rank (each rank adds "
                     "g = d0_(r+1) + M_(r+1)^T g_(r+1) to its final-state adjoint)")
    calls.append("transition: the state pass alone, the continued segment from [0 | I], the values widened by dk zero "
                 "columns: the final state is [h0 | M] (width dv, M = 0, where a sequence starts in the slice; none "
                 "where the slice continues no sequence)")
    calls.append("final: the state pass and the output from the true incoming states: o, the route, the final states")
    calls.append("backward: one chunk backward from the true incoming states, the reverse state passes once per pass")
    lines: tuple[str, ...] = ()
    if stages:
        from dgps.codegen.chunk import BC, BT, supports_chunk, supports_chunk_backward
        from dgps.compiler.plan import build_backward_plan, build_plan, cp_stages, format_cp_stages

        if supports_chunk(ir)[0]:
            plan = build_plan(ir, BT, BC)
            bp = build_backward_plan(plan) if supports_chunk_backward(ir)[0] else None
            lines = tuple(format_cp_stages(cp_stages(plan, bp), plan, bp))
        else:
            lines = ("  stages per slice: no chunk kernels for this spec: three package calls per slice, under autograd",)
    return CPPlan(ir.name, tuple(chains), tuple(exchanges), tuple(calls), stages=lines)


@dataclass(frozen=True)
class SliceLayout:
    """This rank's slice: its local segments and how they connect to the global sequences.

    Packed (B = 1 with cu_seqlens): `local_cu` are the local offsets, `rows[i]` the global sequence of local
    segment i. Unpacked: every batch row is a sequence cut at the same token; `rows` = range(B).
    """

    packed: bool
    local_cu: tuple[int, ...] | None
    rows: tuple[int, ...]  # the initial_state / final_state row of each local segment (packed) or batch row
    n_rows: int  # rows of initial_state and final_state (global sequences, or B)
    carry_in: bool  # the first segment (every row, unpacked) continues a sequence from the previous rank
    passes_through: bool  # carry_in and no sequence starts in the slice: h_out depends on h_in
    ends: tuple[bool, ...]  # per segment / row: the sequence ends in this slice


def slice_layout(cu: Sequence[int] | None, B: int, start: int, end: int, total: int) -> SliceLayout:
    """The layout of the tokens [start, end) of a global pack of `total` tokens (offsets `cu`, or B rows)."""
    if cu is None:
        return SliceLayout(False, None, tuple(range(B)), B, start > 0, start > 0, (end == total,) * B)
    first = max(i for i, c in enumerate(cu[:-1]) if c <= start)  # the global sequence of the first token
    inner = [c for c in cu if start < c < end]
    local = (0, *(c - start for c in inner), end - start)
    rows = tuple(range(first, first + len(local) - 1))
    ends = tuple(cu[r + 1] <= end for r in rows)
    carry = cu[first] < start
    return SliceLayout(True, local, rows, len(cu) - 1, carry, carry and not inner, ends)


def global_offsets_from_fla_zigzag(context: Any, group: Any, T: int) -> torch.Tensor:
    """The global pack's offsets behind an FLA zigzag context (`layout='zigzag'`), which carries only this rank's:
    its local `cu_seqlens` (the front part's sequences, then the back part's), `part_len`, `front_num_seqs` and
    `is_first_by_part` (a sequence starts at the part's first token). One all_gather of every rank's; a part's inner
    offsets and its start, where a sequence starts there, are the pack's boundaries."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    P = int(context.part_len)
    cu_t = context.cu_seqlens_cpu if getattr(context, "cu_seqlens_cpu", None) is not None else context.cu_seqlens
    local = [int(c) for c in cu_t.tolist()]
    if T != 2 * P or local[0] != 0 or local[-1] != T:
        raise TensorError(f"cp_context (zigzag): the local slice must be two parts of part_len = {P} tokens, packed "
                          f"[1, {2 * P}, ...]; got T = {T} and local offsets ending at {local[-1]}")
    # fixed-size rows for the gather: [count, front_num_seqs, first(front), first(back), offsets..., padding]
    width = 4 + 2 * P + 2
    row = torch.zeros(width, dtype=torch.int64)
    row[:4] = torch.tensor([len(local), int(context.front_num_seqs), *(int(b) for b in context.is_first_by_part)])
    row[4:4 + len(local)] = torch.tensor(local)
    device = context.cu_seqlens.device
    rows = [torch.empty(width, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(rows, row.to(device), group=group)
    parts = []
    for t in (r.cpu().tolist() for r in rows):
        parts.append((t[4:4 + t[0]], t[1], (bool(t[2]), bool(t[3]))))
    return torch.tensor(zigzag_offsets(parts, P), dtype=torch.int32)


def zigzag_offsets(ranks: Sequence[tuple[Sequence[int], int, tuple[bool, bool]]], P: int) -> list[int]:
    """The global pack's offsets from every zigzag rank's (local offsets, front_num_seqs, is_first_by_part), in rank
    order: each part's inner offsets at its place, and its first token where a sequence starts there."""
    world = len(ranks)
    bounds = {0, 2 * world * P}
    for r, (offs, front, first) in enumerate(ranks):
        for pos, slot in enumerate(zigzag_parts(world, r)):
            inner = offs[:front + 1] if pos == 0 else [c - P for c in offs[front:]]
            bounds.update(slot * P + c for c in inner if 0 < c < P)
            if first[pos]:
                bounds.add(slot * P)
    return sorted(bounds)


def layout_from_fla(context: Any, B: int, T: int) -> SliceLayout:
    """The layout of an FLA `FLACPContext` (fla.ops.cp.build_cp_context, contiguous): local cu_seqlens, and
    is_first_rank (the first local sequence starts here) / is_last_rank (the last one ends here).
    Initial and final states are indexed by local sequence, as FLA's CP does."""
    if getattr(context, "layout", "contiguous") != "contiguous":
        raise CPUnsupported(f"cp_context.layout = {context.layout!r}: a layout dgps does not know (it takes "
                            "'contiguous' and 'zigzag')")
    cu_t = context.cu_seqlens_cpu if getattr(context, "cu_seqlens_cpu", None) is not None else context.cu_seqlens
    if cu_t is None:
        raise TensorError("cp_context.cu_seqlens is None: FLA's CP context always carries the local offsets")
    local = tuple(int(c) for c in cu_t.tolist())
    if B != 1 or local[-1] != T:
        raise TensorError(f"cp_context: the local slice must be packed [1, {local[-1]}, ...]; got B = {B}, T = {T}")
    n = len(local) - 1
    carry = not bool(context.is_first_rank)
    ends = tuple([True] * (n - 1) + [bool(context.is_last_rank)])
    return SliceLayout(True, local, tuple(range(n)), n, carry, carry and n == 1, ends)


def slice_start(T: int, group: Any, device: torch.device) -> tuple[list[int], int]:
    """Every rank's slice length (one all_gather) and where this rank's slice starts in the global pack."""
    lengths = _gather_lengths(T, group, device)
    return lengths, sum(lengths[:_rank(group)])


def _gather_lengths(T: int, group: Any, device: torch.device) -> list[int]:
    import torch.distributed as dist

    world = dist.get_world_size(group)
    mine = torch.tensor([T], dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return [int(t.item()) for t in out]


def _all_gather(tensors: Sequence[torch.Tensor], group: Any) -> tuple[list[list[torch.Tensor]], tuple[torch.Tensor, ...]]:
    """Every rank's copy of `tensors` (same shapes everywhere), differentiable: one flat all_gather. Also the raw
    gathered tensors, for `_Tie` (every rank must reach the gather's backward, which is itself a collective)."""
    import warnings

    from torch.distributed.nn.functional import all_gather

    flat = torch.cat([t.reshape(-1) for t in tensors])
    with warnings.catch_warnings():  # its successor (_functional_collectives) has no autograd on every backend
        warnings.simplefilter("ignore", FutureWarning)
        parts = all_gather(flat, group=group)
    sizes = [t.numel() for t in tensors]
    return [[p.reshape(t.shape) for p, t in zip(g.split(sizes), tensors, strict=True)] for g in parts], tuple(parts)


class _Tie(torch.autograd.Function):
    """o, unchanged, made to depend on the gathered tensors (zero gradient to them).

    The all_gather's backward is a collective (all-to-all / reduce-scatter): every rank must run it, also a rank
    whose outputs do not read the gathered maps (rank 0; a slice that starts a sequence). Without this edge such
    a rank's backward would skip the node and the others would wait for it forever."""

    @staticmethod
    def forward(ctx, o: torch.Tensor, *gathered: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.likes = [(g.shape, g.dtype, g.device) for g in gathered]
        return o.view_as(o)

    @staticmethod
    def backward(ctx, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
        return (do, *(torch.zeros(s, dtype=dt, device=dev) for s, dt, dev in ctx.likes))


def halo(xs: Mapping[str, torch.Tensor], width: int, group: Any, lengths: Sequence[int]) -> dict[str, torch.Tensor]:
    """The `width` tokens before this rank's slice of each [B, T_r, C] tensor, [B, width, C] (zeros before the first
    token of the pack): the halo a causal convolution of width + 1 taps reads across the slice boundary. One
    differentiable all_gather of every rank's last `width` tokens (left-padded where a slice is shorter), so the
    halo's gradient goes back to the ranks that own those tokens; a halo may span several ranks. `lengths`: every
    rank's T_r (_gather_lengths)."""
    rank = _rank(group)
    tails = []
    for x in xs.values():
        t = x[:, max(0, x.shape[1] - width):]
        tails.append(torch.cat([t.new_zeros(t.shape[0], width - t.shape[1], t.shape[2]), t], dim=1))
    gathered, raw = _all_gather(tails, group)
    out = {}
    for i, (name, x) in enumerate(xs.items()):
        # the earlier ranks' own tokens (the padding dropped), nearest last, behind zeros for the pack's start
        before = [gathered[j][i][:, width - min(lengths[j], width):] for j in range(rank)]
        prev = torch.cat([x.new_zeros(x.shape[0], width, x.shape[2]), *before], dim=1)[:, -width:]
        out[name] = _Tie.apply(prev, *raw) if i == 0 else prev  # every rank reaches the gather's backward
    return out


def _rank(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)


def compose(maps: Sequence[tuple[torch.Tensor, torch.Tensor]], upto: int, matrix: bool) -> torch.Tensor | None:
    """The state entering slice `upto`: x_0 = b_0, x_r = M_r x_{r-1} + b_r (matrix) or m_r ⊙ x_{r-1} + b_r,
    over r < upto, in fp32. None for the first slice."""
    x = None
    for m, b in maps[:upto]:
        m, b = m.float(), b.float()
        x = b if x is None else (torch.matmul(m, x) if matrix else m * x) + b
    return x


def _local_states(lay: SliceLayout, h0: Mapping[str, torch.Tensor], carried: Mapping[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """The initial states of the local segments: the carried ones for the continued segment, h0 elsewhere."""
    out = {}
    for name, s in h0.items():
        mine = s[list(lay.rows)]
        if lay.carry_in and name in carried:
            c = carried[name].to(mine.dtype)
            mine = c if not lay.packed else torch.cat([c, mine[1:]], dim=0)
        out[name] = mine
    return out


def _tail(lay: SliceLayout, s: torch.Tensor) -> torch.Tensor:
    """The outgoing rows of a per-segment state: the last segment (packed) or every row."""
    return s[-1:] if lay.packed else s


def _head(lay: SliceLayout, s: torch.Tensor) -> torch.Tensor:
    """The rows of the continued segment: the first segment (packed) or every row."""
    return s[:1] if lay.packed else s


def _aux_multiplier(ir: IR, name: str, x: Mapping[str, torch.Tensor], dims: Dims, lay: SliceLayout,
                    like: torch.Tensor) -> torch.Tensor:
    """How the outgoing auxiliary state scales the incoming one (0 when a sequence starts in the slice)."""
    if not lay.passes_through:
        return torch.zeros_like(like)
    d = ir.precond.diag
    if name != "A" or d is None or d.decay is None:  # CCQ's sums and an undecayed statistic: additive
        return torch.ones_like(like)
    env = build_env(ir, x, dims, torch.float32)
    dec = evaluate(d.decay, env, env["q"])
    dec = dec if isinstance(dec, torch.Tensor) else torch.tensor(float(dec))
    dec = dec.expand(dims.B, dims.T, dims.HV, dims.dk).float()  # [B, T, HV, dk]
    if d.heads == "key":
        dec = dec[:, :, ::dims.G]
    return torch.exp(dec.sum(1)).reshape(like.shape)


@dataclass(frozen=True)
class _Slice:
    """One rank's slice and what every stage of its chain needs."""

    pkg: ModuleType
    x: Mapping[str, torch.Tensor]
    dims: Dims
    lay: SliceLayout
    h0: Mapping[str, torch.Tensor]
    local_cu: torch.Tensor | None
    scale: float | None

    @property
    def ir(self) -> IR:
        return self.pkg.IR

    @property
    def aux(self) -> list[str]:
        return [s for s in self.ir.state_names if s in AUX_STATES]

    def zero(self, name: str) -> torch.Tensor:
        """A zero state for the continued segment (packed: one row; unpacked: every row)."""
        return torch.zeros_like(_head(self.lay, self.h0[name][list(self.lay.rows)]))

    def call(self, x: Mapping[str, torch.Tensor], carried: Mapping[str, torch.Tensor],
             h0: Mapping[str, torch.Tensor] | None = None) -> RecurrenceOutput:
        init = _local_states(self.lay, self.h0 if h0 is None else h0, carried)
        return self.pkg.forward(**x, initial_state=init, output_final_state=True, cu_seqlens=self.local_cu,
                                scale=self.scale)


def _make_slice(pkg: ModuleType, x: Mapping[str, torch.Tensor], dims: Dims, lay: SliceLayout,
                initial_state: torch.Tensor | Mapping[str, torch.Tensor] | None, scale: float | None) -> _Slice:
    device = x["q"].device
    local_cu = None if lay.local_cu is None else torch.tensor(lay.local_cu, dtype=torch.int32, device=device)
    h0 = initial_states(pkg.IR, dims, lay.n_rows, initial_state, torch.float32, device)
    return _Slice(pkg, x, dims, lay, {n: s.float() for n, s in h0.items()}, local_cu, scale)


def aux_maps(sl: _Slice) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(multiplier, offset) of each auxiliary state over the slice: they read neither S nor v, so the offsets
    come from one call from zero states."""
    if not sl.aux:
        return []
    fin = sl.call(sl.x, {n: sl.zero(n) for n in sl.ir.state_names}).final_state
    assert fin is not None
    offs = [_tail(sl.lay, fin[n]) for n in sl.aux]
    return [(_aux_multiplier(sl.ir, n, sl.x, sl.dims, sl.lay, o), o) for n, o in zip(sl.aux, offs, strict=True)]


def state_map(sl: _Slice, aux_in: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, h0) of the slice, given the true incoming auxiliary states: one call with the values widened by dk
    zero columns and the continued segment started from [0 | I], whose final state is [h0 | M]."""
    dk, dv = sl.dims.dk, sl.dims.dv
    wide = {}
    for d in sl.ir.inputs:
        t = sl.x[d.name]
        wide[d.name] = torch.cat([t, t.new_zeros((*t.shape[:-1], dk))], dim=-1) if d.vector == "value" else t
    z = sl.zero("S")
    eye = torch.eye(dk, device=z.device).expand(*z.shape[:2], dk, dk)
    h0_wide = dict(sl.h0)
    h0_wide["S"] = torch.cat([sl.h0["S"], sl.h0["S"].new_zeros((*sl.h0["S"].shape[:3], dk))], dim=-1)
    fin = sl.call(wide, {**aux_in, "S": torch.cat([z, eye], dim=-1)}, h0_wide).final_state
    assert fin is not None
    tail = _tail(sl.lay, fin["S"])
    b, m = tail[..., :dv], tail[..., dv:]
    if not sl.lay.passes_through:  # a sequence starts in the slice: what leaves does not depend on what came in
        m = torch.zeros_like(m)
    return m, b


def _place_finals(sl: _Slice, out: RecurrenceOutput) -> dict[str, torch.Tensor]:
    """Final states per global row: filled where the sequence ends in this slice, zero elsewhere."""
    assert out.final_state is not None
    idx = [i for i, e in enumerate(sl.lay.ends) if e]
    final = {}
    for n, s in out.final_state.items():
        full = s.new_zeros((sl.lay.n_rows, *s.shape[1:]))
        if idx:
            rows = torch.tensor([sl.lay.rows[i] for i in idx], device=s.device)
            full = full.index_copy(0, rows, s[idx])
        final[n] = full
    return final


# ---- token layouts: contiguous slices, or FLA's zigzag -------------------------------------------------------------
# Zigzag (FLA's `layout='zigzag'`, what ring attention uses to balance causal softmax layers): the tokens cut into 2W
# equal parts (W ranks), rank r holding parts r and 2W − 1 − r, in that order, in its local buffer. A dgps layer beside
# such layers takes the same slices: its inputs go to the contiguous layout (rank q: parts 2q and 2q + 1) by one
# all_to_all each, the chain runs as for contiguous slices, and o (and the route) come back by the inverse all_to_all.
# Both all_to_alls are differentiable (torch.distributed.nn.functional), so gradients take the way back. What this
# costs over the contiguous layout: each input's and output's tokens cross ranks once (a chain of 2W slots, two per
# rank, would exchange only states; not built).
CP_LAYOUTS = ("contiguous", "zigzag")


def zigzag_parts(world: int, rank: int) -> tuple[int, int]:
    """The two parts (of 2·world) a zigzag rank holds, front then back."""
    return rank, 2 * world - 1 - rank


def _part_homes(world: int, layout: str) -> dict[int, tuple[int, int]]:
    """Each of the 2·world parts -> (its rank, its position in that rank's local buffer) under `layout`."""
    if layout == "contiguous":
        return {s: (s // 2, s % 2) for s in range(2 * world)}
    return {s: ((s, 0) if s < world else (2 * world - 1 - s, 1)) for s in range(2 * world)}


def relayout(xs: Sequence[torch.Tensor], group: Any, source: str, target: str) -> list[torch.Tensor]:
    """Each [B, 2P, ...] tensor (tokens on dim 1: this rank's two parts of P tokens under `source`) as this rank's two
    parts under `target`: one differentiable all_to_all per tensor."""
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all

    world, rank = dist.get_world_size(group), _rank(group)
    src, dst = _part_homes(world, source), _part_homes(world, target)
    # NCCL exchanges blocks of any size; other backends (gloo: a scatter per rank) want one size, so each block is
    # padded to two parts there (world × the bytes; gloo is for CPU tests)
    uniform = dist.get_backend(group) != "nccl"
    out = []
    for x in xs:
        P = x.shape[1] // 2
        part = [x[:, i * P:(i + 1) * P] for i in range(2)]
        send = []
        for q in range(world):
            mine = [part[src[s][1]] for s in range(2 * world) if src[s][0] == rank and dst[s][0] == q]
            if uniform:
                mine += [x.new_zeros((x.shape[0], P, *x.shape[2:]))] * (2 - len(mine))
            send.append(torch.cat(mine, dim=1).contiguous() if mine else x.new_empty((x.shape[0], 0, *x.shape[2:])))
        recv_slots = [[s for s in range(2 * world) if src[s][0] == p and dst[s][0] == rank] for p in range(world)]
        recv = [x.new_empty((x.shape[0], (2 if uniform else len(slots)) * P, *x.shape[2:])) for slots in recv_slots]
        got = all_to_all(recv, send, group=group)
        pieces: dict[int, torch.Tensor] = {}
        for slots, t in zip(recv_slots, got, strict=True):
            for i, sl in enumerate(slots):
                pieces[dst[sl][1]] = t[:, i * P:(i + 1) * P]
        out.append(torch.cat([pieces[0], pieces[1]], dim=1))
    return out


def check_zigzag(T: int, group: Any, device: torch.device, what: str) -> None:
    """Every rank holds two equal parts of the same size (FLA's zigzag: the pack cut into 2W equal parts)."""
    lengths = _gather_lengths(T, group, device)
    if len(set(lengths)) != 1 or T % 2:
        raise TensorError(f"{what}: cp_layout='zigzag' needs every rank's slice to be two equal parts of the same "
                          f"length (the pack cut into 2 x {len(lengths)} equal parts); the ranks hold {lengths} tokens")


def cp_forward(pkg: ModuleType, inputs: Mapping[str, torch.Tensor | None], *, group: Any,
               initial_state: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
               output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
               scale: float | None = None, layout: SliceLayout | None = None,
               cp_layout: str = "contiguous") -> RecurrenceOutput:
    """`pkg.forward` over this rank's slice of a sequence sharded across `group` (see the module docstring).

    `cu_seqlens`: the global pack's offsets (every rank passes the same), or None for [B, T_r] slices of B
    sequences. `layout` (instead of cu_seqlens): a prebuilt SliceLayout (fla_compat's FLA contexts). `cp_layout`:
    "contiguous" (rank r holds the r-th slice) or "zigzag" (FLA's: the tokens in 2W equal parts, rank r holding parts
    r and 2W − 1 − r, front then back; o and the route come back in that order).
    """
    ir: IR = pkg.IR
    if cp_layout not in CP_LAYOUTS:
        raise ValueError(f"{ir.name}.forward: cp_layout must be one of {CP_LAYOUTS}; got {cp_layout!r}")
    plan = _cached_cp_plan(ir)
    if plan.refused:
        raise CPUnsupported(f"{ir.name}.forward(cp_group=...): context parallelism is refused: {plan.refused}")
    if cp_layout == "zigzag":
        if layout is not None:
            raise ValueError(f"{ir.name}.forward: a prebuilt layout is contiguous; cp_layout='zigzag' takes cu_seqlens")
        x, dims = check_inputs(ir, inputs)
        check_zigzag(dims.T, group, x["q"].device, f"{ir.name}.forward")
        names = [d.name for d in ir.inputs if not d.is_param and x.get(d.name) is not None]  # the per-token inputs
        moved = dict(zip(names, relayout([x[n] for n in names], group, "zigzag", "contiguous"), strict=True))
        out = cp_forward(pkg, {**x, **moved}, group=group, initial_state=initial_state,
                         output_final_state=output_final_state, cu_seqlens=cu_seqlens, scale=scale)
        back = relayout([out.o] + ([out.route] if out.route is not None else []), group, "contiguous", "zigzag")
        return RecurrenceOutput(back[0], out.final_state, back[1] if out.route is not None else None)
    x, dims = check_inputs(ir, inputs)
    device = x["q"].device
    if layout is None:
        lengths, start = slice_start(dims.T, group, device)
        total = sum(lengths)
        if cu_seqlens is not None:
            check_cu_seqlens(cu_seqlens, Dims(dims.B, total, dims.H, dims.HV, dims.dk, dims.dv))
        cu = None if cu_seqlens is None else [int(c) for c in cu_seqlens.tolist()]
        layout = slice_layout(cu, dims.B, start, start + dims.T, total)
    sl = _make_slice(pkg, x, dims, layout, initial_state, scale)
    if not KERNEL_PATH or not _has_cp_kernels(pkg):
        return _cp_forward_calls(sl, group, output_final_state)
    out = _cp_call(sl, group)
    return RecurrenceOutput(out.o, _place_finals(sl, out) if output_final_state else None, out.route)


def _cp_forward_calls(sl: _Slice, group: Any, output_final_state: bool) -> RecurrenceOutput:
    """CP through whole package calls (a package without the chunk module's CP entry points): one from zero
    states for the auxiliary offsets, the widened call for (M, h0), the real one; autograd through all three."""
    rank = _rank(group)
    ties: tuple[torch.Tensor, ...] = ()
    # 1. the auxiliary chains first: S's transitions read their true incoming values
    aux_in: dict[str, torch.Tensor] = {}
    maps = aux_maps(sl)
    if maps:
        gathered, raw = _all_gather([t for pair in maps for t in pair], group)
        ties += raw
        for i, n in enumerate(sl.aux):
            c = compose([(g[2 * i], g[2 * i + 1]) for g in gathered], rank, matrix=False)
            aux_in[n] = c if c is not None else sl.zero(n)
    # 2. S's chain: every rank's (M, h0), then the prefix over the ranks before this one
    gathered, raw = _all_gather(list(state_map(sl, aux_in)), group)
    ties += raw
    s_in = compose([(g[0], g[1]) for g in gathered], rank, matrix=True)
    # 3. the slice from its true incoming states
    out = sl.call(sl.x, {**aux_in, "S": s_in if s_in is not None else sl.zero("S")})
    final = _place_finals(sl, out) if output_final_state else None
    o = _Tie.apply(out.o, *ties) if torch.is_grad_enabled() and any(t.requires_grad for t in ties) else out.o
    return RecurrenceOutput(o, final, out.route)


_CP_PLANS: dict[int, tuple[IR, CPPlan]] = {}


def _cached_cp_plan(ir: IR) -> CPPlan:
    """cp_plan(ir), once per IR object (its checks run sympy)."""
    hit = _CP_PLANS.get(id(ir))
    if hit is None or hit[0] is not ir:
        hit = _CP_PLANS[id(ir)] = (ir, cp_plan(ir))
    return hit[1]


def _has_cp_kernels(pkg: ModuleType) -> bool:
    """Whether the package's chunk module carries the CP forward and backward (compiler/plan.py: cp_stages)."""
    chunk = getattr(pkg, "chunk", None)
    if chunk is None or not hasattr(chunk, "chunk_forward_cp") or not hasattr(chunk, "_cp_bwd_kernels"):
        return False
    try:
        chunk._cp_bwd_kernels()
    except NotImplementedError:  # no chunked backward: the package calls, under autograd
        return False
    return True


# ---- the kernel-level path: one autograd node per slice ---------------------------------------------------------
# The chunk module runs the stages that read no incoming state once and the state passes once per pass
# (chunk_forward_cp / chunk_backward_cp); this module does the exchanges between the passes with plain collectives,
# forwards and backwards: every rank's backward runs the same collectives in the same order, as its forward did.


@dataclass
class _Exchanged:
    """What the forward's exchanges leave for the backward's: per rank, its transition product M (zero where a
    sequence starts in it, or where no later rank reads it) and its auxiliary multipliers."""

    Ms: list[torch.Tensor]
    mults: dict[str, list[torch.Tensor]]


def _gather_plain(tensors: Sequence[torch.Tensor], group: Any) -> list[list[torch.Tensor]]:
    """Every rank's copy of `tensors` (the same shapes on every rank), fp32, through one flat all_gather."""
    import torch.distributed as dist

    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, flat, group=group)
    sizes = [t.numel() for t in tensors]
    return [[q.reshape(t.shape) for q, t in zip(p.split(sizes), tensors, strict=True)] for p in parts]


def _with_head(lay: SliceLayout, s: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """`s` with the rows of the continued segment replaced by `head`."""
    head = head.to(s.dtype)
    return torch.cat([head, s[1:]], dim=0) if lay.packed else head


def _tail_into(lay: SliceLayout, like: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """A zero tensor shaped like the per-segment `like`, with the outgoing rows set to `tail`."""
    return torch.cat([torch.zeros_like(like[:-1]), tail], dim=0) if lay.packed else tail.reshape(like.shape)


def _outgoing(lay: SliceLayout) -> bool:
    """Whether a later rank reads this slice's outgoing states: its last segment's sequence does not end in it (the
    next rank continues it)."""
    return not lay.ends[-1]


def _exchange_aux(sl: _Slice, group: Any, ex: _Exchanged, init: Mapping[str, torch.Tensor],
                  finals: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """The forward's auxiliary exchange: every rank's (offset, multiplier) (zeros where no later rank reads them:
    finals None); the true incoming auxiliary states."""
    lay, rank = sl.lay, _rank(group)
    if finals is None:
        offs = [torch.zeros_like(_tail(lay, init[n])) for n in sl.aux]
        mults = [torch.zeros_like(o) for o in offs]
    else:
        offs = [_tail(lay, finals[n]) for n in sl.aux]
        mults = [_aux_multiplier(sl.ir, n, sl.x, sl.dims, lay, o) for n, o in zip(sl.aux, offs, strict=True)]
    parts = _gather_plain(offs + mults, group)
    k = len(sl.aux)
    ex.mults = {n: [p[k + i] for p in parts] for i, n in enumerate(sl.aux)}
    true = dict(init)
    if lay.carry_in:
        for i, n in enumerate(sl.aux):
            c = compose([(p[k + i], p[i]) for p in parts], rank, matrix=False)
            assert c is not None
            true[n] = _with_head(lay, init[n], c)
    return {n: true[n] for n in sl.aux}


def _exchange_state(sl: _Slice, group: Any, ex: _Exchanged, init: torch.Tensor, final: torch.Tensor | None
                    ) -> torch.Tensor:
    """The forward's S exchange: every rank's (M, h0) from its transition's final state ([h0 | M], or h0 alone where
    M is zero by the layout; zeros where no later rank reads them: final None); the true incoming S."""
    lay, rank, dv, dk = sl.lay, _rank(group), sl.dims.dv, sl.dims.dk
    tail = _tail(lay, final) if final is not None else torch.zeros_like(_tail(lay, init))
    h0 = tail[..., :dv]
    m = tail[..., dv:] if tail.shape[-1] > dv and lay.passes_through else h0.new_zeros((*h0.shape[:-1], dk))
    parts = _gather_plain([m, h0], group)
    ex.Ms = [p[0] for p in parts]
    if not lay.carry_in:
        return init
    s_in = compose([(p[0], p[1]) for p in parts], rank, matrix=True)
    assert s_in is not None
    return _with_head(lay, init, s_in)


def _exchange_state_grad(sl: _Slice, group: Any, ex: _Exchanged, st: torch.Tensor, ds0: torch.Tensor | None
                         ) -> torch.Tensor | None:
    """The backward's S exchange: every rank's d0 (the adjoint of its incoming state from its own outputs; zero where
    its first segment starts a sequence: ds0 None); this rank's g = d0_(r+1) + M_(r+1)^T g_(r+1), the adjoint of
    its outgoing state from the later ranks, on the outgoing rows (None where no later rank reads them)."""
    lay, rank = sl.lay, _rank(group)
    d0 = _head(lay, ds0) if ds0 is not None else torch.zeros_like(_head(lay, st))
    parts = _gather_plain([d0], group)
    if not _outgoing(lay):
        return None
    g = None
    for j in range(len(parts) - 1, rank, -1):  # zero d0 from a rank that continues no sequence, zero M from one
        g = parts[j][0] if g is None else parts[j][0] + torch.matmul(ex.Ms[j].transpose(-1, -2), g)  # that resets
    assert g is not None
    return _tail_into(lay, st, g)


def _exchange_aux_grad(sl: _Slice, group: Any, ex: _Exchanged, st: Mapping[str, torch.Tensor],
                       d0: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    """The backward's auxiliary exchange, elementwise: g = d0_(r+1) + mult_(r+1) * g_(r+1) per auxiliary state."""
    lay, rank = sl.lay, _rank(group)
    names = [n for n in sl.aux if n != "n"]  # the count has no adjoint
    mine = [_head(lay, d0[n]) if d0 is not None else torch.zeros_like(_head(lay, st[n])) for n in names]
    parts = _gather_plain(mine, group)
    if not _outgoing(lay):
        return None
    out = {}
    for i, n in enumerate(names):
        g = None
        for j in range(len(parts) - 1, rank, -1):
            g = parts[j][i] if g is None else parts[j][i] + ex.mults[n][j] * g
        assert g is not None
        out[n] = _tail_into(lay, st[n], g)
    return out


def _cp_run(sl: _Slice, group: Any, x: Mapping[str, torch.Tensor], h0: Mapping[str, torch.Tensor], keep: bool
            ) -> tuple[RecurrenceOutput, list[torch.Tensor], dict[str, torch.Tensor], _Exchanged]:
    """The slice's forward through the chunk module's CP entry point: (o / finals / route, the kept buffers, the
    true initial states, what the exchanges leave for the backward)."""
    lay, dk = sl.lay, sl.dims.dk
    ex = _Exchanged([], {})
    init = {n: (_with_head(lay, s, torch.zeros_like(_head(lay, s))) if lay.carry_in else s).float().contiguous()
            for n, s in h0.items()}
    transition = None
    if lay.carry_in and _outgoing(lay):  # [0 | I] on the continued rows where the outgoing state reads the incoming
        s = init["S"]
        transition = s
        if lay.passes_through:
            eye = torch.zeros((*s.shape[:3], dk), dtype=s.dtype, device=s.device)
            head = _head(lay, eye)
            head = head + torch.eye(dk, dtype=s.dtype, device=s.device)
            transition = torch.cat([s, _with_head(lay, eye, head)], dim=-1)
    out, kept, st = sl.pkg.chunk.chunk_forward_cp(
        dict(x), initial_state=init, continued=lay.carry_in, outgoing=_outgoing(lay), transition_state=transition,
        exchange_aux=lambda fin: _exchange_aux(sl, group, ex, init, fin),
        exchange_state=lambda fin: _exchange_state(sl, group, ex, init["S"], fin),
        cu_seqlens=sl.local_cu, scale=sl.scale, keep=keep)
    return out, kept, st, ex


class _CPCall(torch.autograd.Function):
    """One slice's CP forward and backward: the inputs and the local rows of the initial states in; o, the route (if
    any) and the local final states out. The exchanges are collectives inside both."""

    @staticmethod
    def forward(ctx, sl, group, n_x, *tensors):  # noqa: ANN001, ANN205 - autograd's signature
        names = list(sl.x)
        x = dict(zip(names, tensors[:n_x], strict=True))
        h0 = dict(zip(sl.ir.state_names, tensors[n_x:], strict=True))
        out, kept, st, ex = _cp_run(sl, group, x, h0, keep=True)
        assert out.final_state is not None
        ctx.sl, ctx.group, ctx.names, ctx.kept, ctx.st, ctx.ex = sl, group, names, kept, st, ex
        ctx.o_like = (out.o.shape, out.o.dtype, out.o.device)
        # the route, where the backward's rerun of the state pass reads R from it (compiler/plan.py:
        # rerun_reads_route): the slice's final pass formed it from the true incoming state, as the rerun would
        route = [out.route] if out.route is not None and sl.pkg.chunk.ROUTE_FEEDS_RERUN else []
        ctx.n_route = len(route)
        ctx.save_for_backward(*tensors[:n_x], *route)
        ctx.set_materialize_grads(False)
        finals = [out.final_state[n] for n in sl.ir.state_names]
        if "n" in sl.ir.state_names:
            ctx.mark_non_differentiable(finals[sl.ir.state_names.index("n")])
        return (out.o, *((out.route,) if out.route is not None else ()), *finals)

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001, ANN205 - autograd's signature
        sl, group, ex, st = ctx.sl, ctx.group, ctx.ex, ctx.st
        saved = ctx.saved_tensors
        x = dict(zip(ctx.names, saved[:len(ctx.names)], strict=True))
        route = saved[len(ctx.names)] if ctx.n_route else None
        has_route = len(grads) > 1 + len(sl.ir.state_names)
        shape, dtype, device = ctx.o_like
        do = grads[0] if grads[0] is not None else torch.zeros(shape, dtype=dtype, device=device)
        d_route = grads[1] if has_route else None
        dfin = {n: g for n, g in zip(sl.ir.state_names, grads[1 + has_route:], strict=True)
                if g is not None and n != "n"}
        kept, ctx.kept = ctx.kept, None  # one backward owns them; a second one reruns the forward's stages
        g_in, g_st = sl.pkg.chunk.chunk_backward_cp(
            x, initial_state=st, do=do, d_final_state=dfin, d_route=d_route, cu_seqlens=sl.local_cu, scale=sl.scale,
            kept=kept or None, continued=sl.lay.carry_in, **({"route": route} if route is not None else {}),
            exchange_state=lambda ds0: _exchange_state_grad(sl, group, ex, st["S"], ds0),
            exchange_aux=lambda d0: _exchange_aux_grad(sl, group, ex, st, d0))
        dh = []
        for n in sl.ir.state_names:  # the continued segment's rows did not read the given initial state
            g = g_st.get(n)
            if g is not None and sl.lay.carry_in:
                g = _with_head(sl.lay, g, torch.zeros_like(_head(sl.lay, g)))
            dh.append(g)
        return (None, None, None, *(g_in.get(n) for n in ctx.names), *dh)


def _cp_call(sl: _Slice, group: Any) -> RecurrenceOutput:
    """The slice's CP forward on the kernel-level path, local final states per segment (under autograd: _CPCall)."""
    h0 = {n: s[list(sl.lay.rows)] for n, s in sl.h0.items()}
    tensors = [*sl.x.values(), *(h0[n] for n in sl.ir.state_names)]
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return _cp_run(sl, group, sl.x, h0, keep=False)[0]
    outs = _CPCall.apply(sl, group, len(sl.x), *tensors)
    route = outs[1] if len(outs) > 1 + len(sl.ir.state_names) else None
    finals = dict(zip(sl.ir.state_names, outs[1 + (route is not None):], strict=True))
    return RecurrenceOutput(outs[0], finals, route)


def simulate(spec: str, ranks: int, T: int, decay: str = "strong", *, H: int = 2, dk: int = 16, dv: int = 16,
             seed: int = 0) -> dict[str, float]:
    """The affine chain over `ranks` equal slices of one sequence, on one process (no torch.distributed): each
    slice's maps are composed in order as the ranks would. Returns the max relative errors of the composed
    final state S and of o against the unsharded call (fp32), and of both against the float64 reference.

    decay: 'strong' (log gates drawn as logsigmoid(N(0, 1)), a factor ~0.5 per token) or 'weak' (those × 0.01)."""
    import importlib

    from dgps.runtime.api import random_inputs

    pkg = importlib.import_module(f"dgps.generated.{spec}")
    ir: IR = pkg.IR
    if T % ranks:
        raise ValueError(f"simulate: T = {T} must be a multiple of ranks = {ranks}")
    x = random_inputs(ir, 1, T, H, dk, dv, dtype=torch.float32, seed=seed)
    if decay == "weak":
        x = {n: (t * 0.01 if ir.input(n).domain == "log_gate" and not ir.input(n).is_param else t) for n, t in x.items()}
    full = pkg.forward(**x, output_final_state=True)
    ref = pkg.reference(**x, output_final_state=True, dtype=torch.float64)
    step = T // ranks
    params = {d.name for d in ir.inputs if d.is_param}
    maps_aux: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    slices = []
    for r in range(ranks):
        xr = {n: (t if n in params else t[:, r * step:(r + 1) * step]) for n, t in x.items()}
        xr, dims = check_inputs(ir, xr)
        sl = _make_slice(pkg, xr, dims, slice_layout(None, 1, r * step, (r + 1) * step, T), None, None)
        slices.append(sl)
        maps_aux.append(aux_maps(sl))
    outs, finals = [], None
    s_maps: list[tuple[torch.Tensor, torch.Tensor]] = []
    for r, sl in enumerate(slices):
        aux_in = {}
        for i, n in enumerate(sl.aux):
            c = compose([m[i] for m in maps_aux], r, matrix=False)
            aux_in[n] = c if c is not None else sl.zero(n)
        s_maps.append(state_map(sl, aux_in))
        s_in = compose(s_maps, r, matrix=True)
        out = sl.call(sl.x, {**aux_in, "S": s_in if s_in is not None else sl.zero("S")})
        outs.append(out.o)
        finals = out.final_state
    assert finals is not None and full.final_state is not None and ref.final_state is not None
    o = torch.cat(outs, dim=1)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))

    return {"final_state": rel(finals["S"], full.final_state["S"]), "o": rel(o, full.o),
            "final_state_vs_fp64": rel(finals["S"], ref.final_state["S"]), "o_vs_fp64": rel(o, ref.o),
            "unsharded_final_state_vs_fp64": rel(full.final_state["S"], ref.final_state["S"]),
            "unsharded_o_vs_fp64": rel(full.o, ref.o)}
