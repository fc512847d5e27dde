"""Chunked (block-parallel) Triton forward and backward kernels for the DGPS families, from Jinja2.

`render_chunk(ir)` returns the full source of a self-contained Python module: Triton kernels for the
stages of docs/chunk_forms.md §7 plus host code whose `chunk_forward(inputs, ...)` returns a
`RecurrenceOutput` like the sequential reference.

The plan decides what is launched: `FORWARD_RULES` / `BACKWARD_RULES` map each launch of the chunk plan
(a stage, with the stages fused into it) and of its backward plan to one kernel template, in the plan's
order (`UNTIED_RULES` replaces the interaction's template for the untied DPLR family); the backward plan's kept
and recomputed stages decide what a training forward returns and what the backward reruns. Structure enters the
templates through hooks: `decay_hook` (codegen/decay.py) for the decay kind — every decay factor, the chunk's gate
loads and the log-gate gradient's per-kind steps, with "" for a factor and an OMIT line (dropped by jinja_env.drop_omitted) for
a statement that no decay needs —, bwd_grads' pair-source hook files (chunk_bwd_pairs_{fused,solve,intra}.jinja, the
same macros in each: where the score pairs' gradients come from), the route's hook files
(chunk_route_{none,value,residual}.jinja, chosen by `route_hook`: the route's store and adjoint, and the residual
route's form of the solve) and `_Emitter` for the spec's expressions on tile loads. Launch settings (BK, BV, warps,
stages) come from the per-stage table in codegen/launch.py; every kernel takes only the parameters its body uses.
`runtime.compile.load_chunk(ir)` writes that source to a cache directory and imports it (Triton needs real
source files). `supports_chunk(ir)` says whether this generator handles a spec, and why not.

Stages (the names of the chunk plan; each is one template in codegen/templates/):

    l2norm, gates        fused into every tile load (full dk rows, so the row norm is local)
    chunk_cumsum         chunk-local cumsum of the log-gate, in log2 space (exp2 everywhere)
    precond_diag         PDN statistic: decayed cumsum within a chunk + carry across chunks -> k̃
    precond_gram         exact preconditioner: the fp32 Gram carry G_n over chunks (G_0 = P_0⁻¹, P_final = G⁻¹)
    precond_exact        per chunk: P_n = G_n⁻¹ (Gauss-Jordan), I + K P_n Kᵀ = L D Lᵀ -> k̃ (ATK) or q̂ (ATQ)
    curvature_state      CCQ sums C_n = Σkkᵀ, m_n = Σk at every chunk's start: per sequence, key head and [BK, BV] tile
                         of C, over chunks
    curvature_query      CCQ q̂ per chunk, key head and BV columns of C, in parallel, from C_n and m_n
    interaction          L' = E ⋆⁻ A (and Q ⋆ A for vector decay) on 16-row sub-blocks (vector decay: whole-chunk or
                         per-block products where the gates bound them, plan attribute diag_blocks; decay_keys fused)
    triangular_solve     T = (I + Diag(β)L')⁻¹Diag(β): forward substitution per 16×16 diagonal block,
                         then block merge
    wy                   W = T(E⊙e^B), Ũ = T Z
    decay_keys           per-channel decay: A ⊙ e^{b_c − B} and Q̂ ⊙ e^B in the input dtype, for the state passes
    state_pass           sequential over chunks: H_n, U = Ũ − W H_n (delta) or βZ (additive)
    output               O = scale[(Q̂⊙e^B)H_n + (Q̂⋆A)U], routes (value: Z; residual: the state pass's R,
                         docs/chunk_forms.md §8a)
    state_pass + output  scalar or no decay: one launch (chunk_state_output.jinja), H_n and U kept in registers;
                         the backward's rerun of the state pass is the state pass's own kernel, which stores them

Backward stages (docs/chunk_forms.md §8; `chunk_backward(...)` recomputes the forward's chunk buffers first):

    bwd_local_values     per chunk: dU_local = scale (Q̂⋆A)ᵀdO (− L'ᵀdR), the part of dU without carried state
    bwd_state_pass       reverse over chunks: dU = dU_local + (A⊙e^{b_c−B}) dH_{n+1},
                         dH_n = e^{b_c} dH_{n+1} + scale (Q̂⊙e^B)ᵀ dO − Wᵀ dU (+ residual-route terms)
    bwd_scores           per-channel decay: the score matrices' gradients dS, dL' (and dβ's c×c share), once
                         per chunk and head, to memory; for the delta family also dY = Aiᵀ dU, dZ and the value
                         inputs' gradients
    bwd_intra            per-channel decay: the pair gradients of the decayed scores on 16×16 sub-blocks (one
                         reference per off-diagonal block, the diagonal blocks token by token)
    bwd_solve            delta family, scalar or no decay: once per chunk and head, the c×c adjoints (dS = dO Uᵀ,
                         through the WY solve dY = Aiᵀ dU, dZ, dM = −dY Uᵀ, dL′; L′ and Q̂ ⋆ A over the key
                         channels for the c×c shares of dβ and db), for bwd_grads
    bwd_grads            per chunk and key block: gradients of q̂, the write/erase keys, the target, β and the
                         log-gate (per-channel pairs from bwd_intra; the delta family's c×c adjoints from bwd_solve,
                         its launch then bwd_key_grads; the additive family's score pairs as masked matmuls; dg =
                         reverse cumsum of db); the delta family reads dY instead of forming it per key block
    bwd_curvature_sums   CCQ: C_n, m_n formed again (the forward's curvature_state kernel), for bwd_curvature_query
    bwd_curvature_query  CCQ, per chunk in parallel: the sums' share of dq, dλ
    bwd_curvature_carry  CCQ, reverse over chunks per [BK, BV] tile of D = dC_final + Σ dC_t: D_n (and dm_c) of every
                         chunk, dC_0, dm_0
    bwd_curvature_key    CCQ, per chunk in parallel from E_n = D_n + D_nᵀ: the keys' share (an anti-causal linear
                         attention)
    bwd_precond_diag     PDN: reverse decayed cumsum of the statistic's adjoint
    bwd_precond_exact    exact preconditioner, per chunk: z = P_t dx_t, the chunk's Gram adjoint, in-chunk key terms
    bwd_precond_gram     exact preconditioner: reverse over chunks with the dk×dk Gram adjoint -> dk, dP_0
    bwd_inputs           the chain rule to every input and param (sympy derivatives), L2-norm backward

Generated code only uses exp2 of non-positive arguments: scalar decay uses the c×c mask form,
vector decay uses sub-chunk (16-token) reference points (docs/chunk_forms.md §3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jinja2
import sympy as sp

from ..compiler.exprs import diff_by_name
from ..compiler.ir import HEAD_INDEX, IR, KTILDE, STAT, TensorDecl, kernel_ir
from ..compiler.plan import (
    PER_CALL_GUESTS,
    PER_CALL_HOST,
    BackwardPlan,
    Plan,
    Stage,
    beta_gradient,
    build_backward_plan,
    build_plan,
    cp_stages,
    direct_gate_input,
    gate_gradient,
    kept_states_bytes,
    launch_of,
    precond_shares,
    rerun_reads_route,
    scores_in_reverse_pass,
    scores_kept,
    split_reverse_pass,
    stored_adjoints,
    tied_keys_of,
    value_side_once,
    wy_in_inference_state_pass,
)
from . import launch as launch_settings
from .address import ROWS, partial_row, row_offset
from .buffers import (
    BWD_BUFFER_OF,
    allocation_code,
    backward_buffers,
    kept_buffers,
    kept_state_buffers,
    make_code,
    statistic_buffers,
    token_buffers,
)
from .decay import decay_hook
from .ir_source import ir_source
from .jinja_env import OMIT, drop_omitted, template_env
from .triton_expr import triton_expr
from .triton_expr_bwd import triton_expr_bwd

BT = 64  # chunk size
BC = 16  # sub-chunk size (triangular solve blocks, vector-decay reference points)
RCP_LN2 = 1.4426950408889634



# --------------------------------------------------------------------------------------------------
# What is supported
# --------------------------------------------------------------------------------------------------
def _side(ir: IR, expr: sp.Expr) -> str | None:
    """'key' / 'value' when `expr` is a per-channel vector, None when it is per token (or constant)."""
    sides = set()
    for s in expr.free_symbols:
        if s in (KTILDE, STAT):
            sides.add("key")
            continue
        if s == HEAD_INDEX:
            continue
        d = ir.input(s.name)
        if d.vector is not None:
            sides.add(d.vector)
    if len(sides) > 1:
        raise ValueError(f"expression mixes key and value channels: {expr}")
    return sides.pop() if sides else None


def supports_chunk(ir: IR) -> tuple[bool, str]:
    """(True, '') when render_chunk handles `ir`; else (False, reason)."""
    ir = kernel_ir(ir)  # channel reductions reach the kernels as derived per-token inputs (render_chunk)
    st = ir.structure
    s = ir.solve
    try:
        untied = not st.tied
        if untied:
            # the four decayed matrices E⋆⁻F, E⋆⁻W, Q⋆F, Q⋆W on sub-blocks with per-channel references
            if ir.decay.kind != "vector":
                return False, "untied DPLR solve (f != w) without a per-channel decay is not generated"
            if ir.route != "none" or ir.precond.kind != "none" or ir.read.kind != "none":
                return False, "untied DPLR solve with a route, a preconditioner or a read correction is not generated"
        elif s.kind == "dplr" and (ir.route != "none" or ir.precond.kind != "none" or ir.read.kind != "none"):
            # a tied DPLR (f = w) is the tied family with E = −e and Z = V' = β v (compiler/plan.py: role_exprs); a
            # value route's Z would be v, not the family's Z
            return False, "tied DPLR solve with a route, a preconditioner or a read correction is not generated"
        if st.erase_reads != "decayed" and not untied:
            return False, "erase reading the undecayed state is not generated by the chunk kernels"
        if ir.precond.kind == "exact":
            if ir.precond.placement == "write_key" and s.write_key != KTILDE:
                return False, "exact preconditioner whose write key is an expression of k̃ is not generated"
            if ir.precond.placement == "query" and ir.read.kind != "none":
                return False, "exact ATQ together with a read correction is not generated"
        if ir.precond.kind == "diag" and ir.precond.placement != "write_key":
            return False, "diag preconditioner on the query is not generated by the chunk kernels"
        if ir.decay.kind not in ("none", "scalar", "vector", "const"):
            return False, f"decay kind {ir.decay.kind!r} not generated"
        if ir.decay.log_gate is not None:
            side = _side(ir, ir.decay.log_gate)
            if ir.decay.kind == "vector" and side == "value":
                return False, "vector decay over value channels is not generated"
            if ir.decay.kind in ("scalar", "const") and side is not None:
                return False, "scalar decay whose gate is a channel vector"
        if _side(ir, s.beta) is not None:
            return False, "gain β per channel (value-side vector β) is not generated"
        if _side(ir, s.target) == "key" or _side(ir, s.write_key) == "value":
            return False, "target/write key on the wrong channel side"
        if s.erase_key is not None and _side(ir, s.erase_key) == "value":
            return False, "erase key on value channels"
        if ir.route == "residual" and st.additive:
            return False, "residual route on an additive solve"
        if ir.precond.kind == "diag":
            d = ir.precond.diag
            if d.decay is not None and _side(ir, d.decay) is not None:
                return False, "vector decay of the diag preconditioner statistic is not generated"
            if d.gain is not None and _side(ir, d.gain) is not None:
                return False, "vector gain of the diag preconditioner statistic is not generated"
        if ir.read.kind not in ("none", "curvature"):
            return False, f"read correction {ir.read.kind!r} not generated"
        exprs = [s.beta, s.target, s.write_key]
        if s.erase_key is not None:
            exprs.append(s.erase_key)
        if untied:
            e, f, _, _ = s.canonical()
            for side in (_side(ir, e), _side(ir, f)):
                if side != "key":
                    raise ValueError("untied DPLR: the erase and write-back vectors e, f must be key-channel vectors")
            exprs += [e, f]
        if ir.decay.log_gate is not None:
            exprs.append(ir.decay.log_gate)
        if ir.precond.diag is not None:
            d = ir.precond.diag
            exprs += [x for x in (d.stat, d.decay, d.gain, d.map) if x is not None]
        if ir.read.lam is not None:
            if _side(ir, ir.read.lam) is not None:
                return False, "curvature λ per channel is not generated"
            exprs.append(ir.read.lam)
        for ex in exprs:
            triton_expr(ex, _AnyName())
    except (ValueError, NotImplementedError, KeyError) as exc:
        return False, str(exc)
    return True, ""


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the chunk module: the launch-table name, the kernel, its grid kind, its template, and the
    named hooks its template renders with (one template, several kernels: `def {{ launch.kernel }}`)."""

    name: str
    kernel: str
    grid: str
    template: str
    hooks: frozenset[str] = frozenset()


# The rule tables: plan launch (a stage kind, or the stage a fused stage runs in) -> the kernel that computes it.
# Grid kinds: chunk (NT, HV); chunk_keys (key-channel blocks, NT, HV); chunk_sub_keys (key-channel blocks × sub-chunks,
# NT, HV: a chunk's programs launch together, so its per-token tiles come from L2 after the first); rows (token blocks,
# heads); seq_hp (one program per sequence, statistic head and key-channel block, sequential over chunks); state (dv
# blocks, sequences × value heads); key_state_tiles (BK × BV tiles of a dk × dk carry, sequences × key heads: the
# curvature sums and their adjoint, sequential over chunks); key_chunk (blocks of BV columns of a dk × dk carry, NT, key
# heads); state_keys (dv blocks × key-row blocks, sequences × value heads); output (dv blocks, NT, HV).
# the curvature sums' state pass: the forward's, and the backward's re-forming of C_n (bwd_curvature_sums) is the same
# kernel and launch
CURVATURE_STATE = Launch("curvature_state", "chunk_curvature_state_kernel", "key_state_tiles",
                         "chunk_curvature_state.jinja")
FORWARD_RULES = {
    "l2norm": Launch("l2norm", "chunk_l2norm_kernel", "rows", "chunk_l2norm.jinja"),
    "chunk_cumsum": Launch("chunk_cumsum", "chunk_cumsum_kernel", "chunk", "chunk_cumsum.jinja"),
    "precond_diag": Launch("precond_diag", "chunk_precond_diag_kernel", "seq_hp", "chunk_precond_diag.jinja"),
    "precond_gram": Launch("precond_gram", "chunk_precond_gram_kernel", "seq_hp", "chunk_precond_gram.jinja"),
    "precond_exact": Launch("precond_exact", "chunk_precond_exact_kernel", "chunk", "chunk_precond_exact.jinja"),
    "curvature_state": CURVATURE_STATE,
    "curvature_query": Launch("curvature_query", "chunk_curvature_query_kernel", "key_chunk",
                              "chunk_curvature_query.jinja"),
    "interaction": Launch("interaction", "chunk_interaction_kernel", "chunk", "chunk_interaction.jinja"),
    "wy": Launch("wy", "chunk_wy_kernel", "chunk", "chunk_wy.jinja"),
    "decay_keys": Launch("decay_keys", "chunk_decay_keys_kernel", "chunk", "chunk_decay_keys.jinja"),
    "state_pass": Launch("state_pass", "chunk_state_pass_kernel", "state", "chunk_state_pass.jinja"),
    "output": Launch("output", "chunk_output_kernel", "output", "chunk_output.jinja"),
}
# A host stage with stages of other kinds fused into it, where that changes the host's kernel: (host, guest, ...) ->
# the kernel computing them all. The output in the state pass (scalar or no decay; compiler/plan.py:
# _output_in_state_pass) is its own kernel and launch-table entry: the backward's rerun of the state pass, which
# stores H_n and U for the backward stages, keeps the state pass's own kernel.
# The guests' kinds in the plan's order. A training forward whose plan fuses the wy stage into the
# state pass too (compiler/plan.py: wy_in_training_state_pass) takes the WY variant that stores W and Ũ for the
# backward (the `wy_stores` hook); it shares the inference variant's launch-table entry.
FUSED_RULES = {
    ("state_pass", "output"): Launch("state_output", "chunk_state_output_kernel", "state", "chunk_state_output.jinja"),
    ("state_pass", "wy", "output"): Launch("state_output_wy", "chunk_state_output_wy_keep_kernel", "state",
                                           "chunk_state_output.jinja", frozenset({"wy_inside", "wy_stores"})),
    # the per-channel tied family's wy at the end of the interaction (compiler/plan.py: _wy_in_interaction); the
    # interaction's launch-table entry (its BV the Ũ part's value blocks)
    ("interaction", "wy"): Launch("interaction", "chunk_interaction_wy_kernel", "chunk",
                                  "chunk_interaction_vector.jinja", frozenset({"wy_inside"})),
}
# An inference forward's fused kernel with the wy stage formed inside it as well (the wy stage's inference_fused;
# compiler/plan.py: wy_in_inference_state_pass): the same template with the `wy_inside` hook, its own kernel and
# launch-table entry.
INFERENCE_FUSED_RULES = {
    ("state_pass", "output"): Launch("state_output_wy", "chunk_state_output_wy_kernel", "state",
                                     "chunk_state_output.jinja", frozenset({"wy_inside"})),
}
# The wy stage with one program per block of columns (codegen/launch.py WY_COLUMN_PROGRAMS): grid kind chunk_columns
# (W's key-column blocks, then Ũ's value-column blocks; NT; HV), the template's split_columns hook.
WY_SPLIT_RULES = {
    "wy": Launch("wy", "chunk_wy_kernel", "chunk_columns", "chunk_wy.jinja", frozenset({"split_columns"})),
}
# The state pass split over blocks of key rows where it runs alone (its plan attribute key_blocks; the template's
# split_keys hook): the additive family without a route, whose rows no term couples.
SPLIT_KEYS_RULES = {
    "state_pass": Launch("state_pass", "chunk_state_pass_kernel", "state_keys", "chunk_state_pass.jinja"),
}
BACKWARD_RULES = {
    "bwd_local_values": Launch("bwd_local_values", "chunk_bwd_local_values_kernel", "output",
                               "chunk_bwd_local_values.jinja"),
    "bwd_state_pass": Launch("bwd_state", "chunk_bwd_state_kernel", "state", "chunk_bwd_state.jinja"),
    "bwd_scores": Launch("bwd_scores", "chunk_bwd_scores_kernel", "chunk", "chunk_bwd_scores.jinja"),
    "bwd_intra": Launch("bwd_intra", "chunk_bwd_intra_kernel", "chunk_sub_keys", "chunk_bwd_intra.jinja"),
    "bwd_solve": Launch("bwd_solve", "chunk_bwd_solve_kernel", "chunk", "chunk_bwd_solve.jinja"),
    "bwd_grads": Launch("bwd_grads", "chunk_bwd_grad_kernel", "chunk_keys", "chunk_bwd_grad.jinja"),
    "bwd_curvature_sums": CURVATURE_STATE,
    "bwd_curvature_query": Launch("bwd_curvature_query", "chunk_bwd_curvature_query_kernel", "key_chunk",
                                  "chunk_bwd_curvature_query.jinja"),
    "bwd_curvature_carry": Launch("bwd_curvature_carry", "chunk_bwd_curvature_carry_kernel", "key_state_tiles",
                                  "chunk_bwd_curvature_carry.jinja"),
    "bwd_curvature_key": Launch("bwd_curvature_key", "chunk_bwd_curvature_key_kernel", "key_chunk",
                                "chunk_bwd_curvature_key.jinja"),
    "bwd_precond_diag": Launch("bwd_precond_diag", "chunk_bwd_precond_diag_kernel", "seq_hp",
                               "chunk_bwd_precond_diag.jinja"),
    "bwd_precond_exact": Launch("bwd_precond_exact", "chunk_bwd_precond_exact_kernel", "chunk",
                                "chunk_bwd_precond_exact.jinja"),
    "bwd_precond_gram": Launch("bwd_precond_gram", "chunk_bwd_precond_gram_kernel", "seq_hp",
                               "chunk_bwd_precond_gram.jinja"),
    "bwd_inputs": Launch("bwd_inputs", "chunk_bwd_inputs_kernel", "chunk", "chunk_bwd_inputs.jinja"),
}


def launch_table(ir: IR, DK: int = 128, DV: int = 128) -> str:
    """The launch settings of every kernel the chunk module launches for `ir`, printed (show --stage plan)."""
    from .launch import format_launches

    plan = build_plan(ir, BT, BC)
    bplan = build_backward_plan(plan) if supports_chunk_backward(ir)[0] else None
    rerun = rerun_launches(plan, False) if bplan else []
    names = list(dict.fromkeys([la.name for la in forward_launches(plan)] + [la.name for la in rerun] +
                               [la.name for la in unfused_forward_launches(plan)] +
                               [la.name for la in inference_forward_launches(plan)]))
    names = list(dict.fromkeys(names + [la.name for la in (backward_launches(plan) if bplan else [])]))
    return format_launches(names, DK, DV, decay_hook(ir.decay.kind).kind, plan.family, ir.route, ir.precond.kind)


# The untied DPLR family's interaction forms four matrices (two row operands, E and Q) and solves on E⋆⁻F: its own
# template; every other stage of the family is its kind's template with an `untied` branch.
UNTIED_RULES = {
    "interaction": Launch("interaction", "chunk_interaction_kernel", "chunk", "chunk_interaction_dplr.jinja"),
}
# and its backward: four score gradients, pair gradients for two row and two column operands, two write streams
UNTIED_BACKWARD_RULES = {
    "bwd_scores": Launch("bwd_scores", "chunk_bwd_scores_kernel", "chunk", "chunk_bwd_scores_dplr.jinja"),
    "bwd_intra": Launch("bwd_intra", "chunk_bwd_intra_kernel", "chunk_sub_keys", "chunk_bwd_intra_dplr.jinja"),
    "bwd_grads": Launch("bwd_grads", "chunk_bwd_grad_kernel", "chunk_keys", "chunk_bwd_grad_dplr.jinja"),
}


# Per-channel decay's tied and additive families form their scores one batched product per level of hierarchical
# references, the solve's forward substitution batched over the diagonal blocks and its merges level by level (the
# all-blocks-at-once form of chunk_interaction.jinja spills at dk = 128 with per-channel factors).
VECTOR_RULES = {
    "interaction": Launch("interaction", "chunk_interaction_kernel", "chunk", "chunk_interaction_vector.jinja"),
}


# With bwd_solve in the backward plan (the scalar- or no-decay delta family: compiler/plan.py, _solve_split), bwd_grads
# is the per-key-block half: the same template and kernel, its own launch-table entry (it holds fewer tiles).
SOLVE_BACKWARD_RULES = {
    "bwd_grads": Launch("bwd_key_grads", "chunk_bwd_grad_kernel", "chunk_keys", "chunk_bwd_grad.jinja"),
}


# The reverse state pass split over blocks of key rows (compiler/plan.py: split_reverse_pass): one program per key block
# too, and it carries dH alone (the template's split_keys hook).
SPLIT_KEYS_BACKWARD_RULES = {
    "bwd_state_pass": Launch("bwd_state", "chunk_bwd_state_kernel", "state_keys", "chunk_bwd_state.jinja"),
}


def backward_rules(plan: Plan, bplan: BackwardPlan) -> dict[str, Launch]:
    """Backward stage kind -> its launch, for this plan's family and backward plan."""
    rules = dict(BACKWARD_RULES)
    if split_reverse_pass(plan):
        rules.update(SPLIT_KEYS_BACKWARD_RULES)
    if plan.family == "untied":
        rules.update(UNTIED_BACKWARD_RULES)
    if "bwd_solve" in bplan.kinds():
        rules.update(SOLVE_BACKWARD_RULES)
    return rules


def backward_launches(plan: Plan) -> list[Launch]:
    """The launches of the backward plan's stages, in its order."""
    bplan = build_backward_plan(plan)
    assert bplan is not None
    rules = backward_rules(plan, bplan)
    return [rules[k] for k in bplan.kinds()]


def forward_launches(plan: Plan, kinds: tuple[str, ...] | None = None, names: tuple[str, ...] | None = None,
                     unfused: bool = False) -> list[Launch]:
    """The launches that compute the forward plan's stages of `kinds` (default: every stage), or of the stages named
    `names`, in the plan's order.

    A fused stage runs inside its host's launch; where the host and its guests among the stages that have launches
    of their own when unfused (compiler/plan.py PER_CALL_GUESTS) have a FUSED_RULES kernel, that kernel, else each its
    own launch (the backward reruns the state pass without the output).
    `unfused`: each guest in a launch of its own, in the plan's order (the plan's `unfused_when` form, chosen per
    call)."""
    stages = [st for st in plan.stages() if (kinds is None or st.kind in kinds) and (names is None or st.name in names)]
    if plan.family == "untied":
        rules = {**FORWARD_RULES, **UNTIED_RULES}
    elif plan.structure.decay == "vector":
        rules = {**FORWARD_RULES, **VECTOR_RULES}
    else:
        rules = FORWARD_RULES
    if any(st.attr("key_blocks") for st in stages if st.kind == "state_pass"):
        rules = {**rules, **SPLIT_KEYS_RULES}
    if launch_settings.WY_COLUMN_PROGRAMS:  # read at each call: benchmarks patch it
        rules = {**rules, **WY_SPLIT_RULES}
    out = []
    for host in dict.fromkeys(h for st in stages if (h := launch_of(st)) is not None):
        # the host's group in the plan's order: itself (where among the stages) and its guests with launches of
        # their own when unfused; the others (the solve in the interaction, ...) have no launch but the host's
        group = [st.kind for st in stages if launch_of(st) == host and (st.kind == host or st.kind in PER_CALL_GUESTS)]
        key = (host, *[k for k in group if k != host])
        # (`unfused` parts only the per-call host's guests: the wy stage at the interaction's end is no per-call form)
        if host not in group or (len(group) > 1 and ((unfused and host == PER_CALL_HOST) or key not in FUSED_RULES)):
            out += [rules[k] for k in group]
        else:
            out.append(FUSED_RULES[key] if len(group) > 1 else rules[host])
    return out


def inference_forward_launches(plan: Plan) -> list[Launch]:
    """The forward of an inference call, where the plan forms the wy stage inside the fused state pass + output for
    such calls (the wy stage's `inference_fused`): no wy launch, the fused kernel's WY variant; else none (an inference
    call launches forward_launches)."""
    if not wy_in_inference_state_pass(plan):
        return []
    inference = INFERENCE_FUSED_RULES[("state_pass", "output")]
    training = forward_launches(plan)
    out = [inference if la in FUSED_RULES.values() else la for la in training if la.name != "wy"]
    # the training forward ran a wy launch and the fused kernel without W and Ũ, or (wy_in_training_state_pass) the
    # fused kernel that stores them
    assert inference in out and len(out) == len(training) - ("wy" in [la.name for la in training]), plan.name
    return out


def unfused_forward_launches(plan: Plan) -> list[Launch]:
    """The forward with its fused guests in launches of their own, where the plan fuses one only for some calls (the
    stage's `unfused_when`); else none."""
    if not any(st.attr("unfused_when") for st in plan.stages()):
        return []
    return forward_launches(plan, unfused=True)


def unfused_form(plan: Plan) -> dict[str, list[str]]:
    """Each fused launch a call may unfuse (the stage's `unfused_when`) -> the unfused launches that replace it, in
    order: those of the unfused forward that its own launch list (training or inference) lacks."""
    unfused = [la.name for la in unfused_forward_launches(plan)]
    out: dict[str, list[str]] = {}
    for launches, rules in ((forward_launches(plan), FUSED_RULES),
                            (inference_forward_launches(plan), INFERENCE_FUSED_RULES)):
        names = [la.name for la in launches]
        for fused in rules.values():
            if unfused and fused in launches:
                out[fused.name] = [n for n in unfused if n not in names]
    assert all(len(v) >= 2 for v in out.values()), (plan.name, out)
    return out


def rerun_kinds(plan: Plan, kept: bool) -> tuple[str, ...]:
    """The forward stage kinds the backward reruns: those it did not keep, or (`kept` False: the forward kept
    nothing) every stage but the output."""
    bplan = build_backward_plan(plan)
    assert bplan is not None
    if kept:
        return bplan.recomputed
    # nothing kept: every stage but the output, or with it where the backward reads its scores (then in a launch of
    # its own, after the state pass, which stores H_n and U: rerun_launches)
    return tuple(k for k in plan.kinds() if k != "output" or "output" in bplan.kept)


def rerun_launches_without_route(plan: Plan) -> list[Launch]:
    """Where the rerun of the state pass reads R from the route (rerun_reads_route), the forward keeps no Ũ: a backward
    given the kept buffers but not the route reruns wy before the state pass."""
    kinds = build_backward_plan(plan).recomputed
    return forward_launches(plan, kinds + (("wy",) if rerun_reads_route(plan) else ()), unfused=True)


def rerun_launches(plan: Plan, kept: bool) -> list[Launch]:
    """The launches of the forward stages the backward reruns (rerun_kinds), each host alone: a state pass stores
    H_n and U for the backward stages, so an output rerun with it takes its own launch."""
    return forward_launches(plan, rerun_kinds(plan, kept), unfused=True)


def _backward_context(ir: IR, em: _Emitter, plan: Plan) -> dict:
    """The template context of the backward kernels; raises NotImplementedError (and the like) where the
    chunk module cannot carry a chunked backward for `ir`."""
    bplan = build_backward_plan(plan)
    if bplan is None:
        raise NotImplementedError("the chunk plan has no chunked backward for this family")
    fused = plan.elementwise_grads
    rl = _roles(plan, ir)
    direct = direct_gate_input(plan)  # bwd_grads stores the log gate's input gradient itself
    grad_code, parts = _input_grad_code(ir, em, rl, plan, skip=fused + ((direct,) if direct else ()))
    stored = stored_adjoints(plan)
    # the templates keep no per-channel path without these stages
    if (plan.structure.decay == "vector") != ("bwd_intra" in bplan.kinds()):
        raise AssertionError(f"{ir.name}: per-channel decay's pair gradients come from bwd_intra, and only then")
    # a chunk-operand adjoint goes to memory exactly when the chain rule left to bwd_inputs reads it
    for p in parts:
        if p.name in _ADJOINT_OF_PART and _ADJOINT_OF_PART[p.name] not in stored:
            raise AssertionError(f"{ir.name}: bwd_inputs reads the adjoint of {p.name}, which the plan does not store")
    # the backward kernels, in the backward plan's launch order; what the forward keeps for them, what they rerun
    kept = kept_buffers(plan, bplan.kept)
    launches = backward_launches(plan)
    split = "bwd_solve" in bplan.kinds()
    # the delta family without a per-channel decay has no fused c×c path left in chunk_bwd_grad.jinja
    if split != (plan.family == "tied" and plan.structure.decay != "vector"):
        raise AssertionError(f"{ir.name}: the scalar- or no-decay delta family's c×c adjoints come from bwd_solve, "
                             "and only then")
    rules = backward_rules(plan, bplan)
    hooks = {"exchange S": "cp_state", "exchange aux": "cp_aux"}
    cp_bwd = [(hooks[k], None) if k in hooks else (rules[k], tag) for k, tag in cp_stages(plan, bplan).backward_order()]
    intra = next((st for st in bplan.stages if st.kind == "bwd_intra"), None)
    return dict(backward=True, grad_code=grad_code, parts=parts, backward_launches=launches,
                cp_backward_launches=cp_bwd,
                rerun_kept=rerun_launches(plan, True),
                rerun_kept_without_route=rerun_launches_without_route(plan),
                rerun_all=rerun_launches(plan, False), bwd_kept_buffers=kept,
                kept_states=kept_state_buffers(plan),
                kept_states_bytes=kept_states_bytes(plan),
                stored_parts=[p for p, a in _ADJOINT_OF_PART.items() if a in stored],
                tied_keys=tied_keys_of(plan),
                # where bwd_grads' score pairs come from: its hook file (chunk_bwd_pairs_<source>.jinja)
                pair_source="intra" if "bwd_intra" in bplan.kinds() else "solve" if split else "fused",
                reads_dy=value_side_once(plan),  # bwd_grads reads dY from bwd_solve or bwd_scores
                intra_diag=intra.attr("diag_blocks") if intra else None,
                INTRA_RANGE_LOG2=intra.attr("diag_range_log2") if intra else None,
                grads_launch=next(la.name for la in launches if la.kernel == "chunk_bwd_grad_kernel"),
                fused_grads=_fused_grad_code(ir, em, rl, plan, fused, value_once=value_side_once(plan)),
                precond_code=_precond_backward_code(ir, em, plan),
                direct_gate=direct,
                # the log gate's direct store holds one tile more in bwd_grads: under a diagonal preconditioner (k̃ and
                # two key adjoints) the write key is read again for its share of the gate's gradient rather than held
                # (compile report, sm_90, dk = 128: pkda at BK 64 / 8 warps 255 registers + 24 B spill -> 255, none)
                reload_write_key_for_gate=direct is not None and ir.precond.kind == "diag",
                backward_buffer_code=make_code(backward_buffers(bplan)))


ROUTE_HOOKS = {"none": "chunk_route_none.jinja", "value": "chunk_route_value.jinja",
               "residual": "chunk_route_residual.jinja"}


def route_hook(plan: Plan) -> str:
    """The route's hook file: where the route enters the chunk kernels (its store, its adjoint, and for the residual
    route the solve's form: compiler/plan.py residual_solve, which every residual route takes)."""
    return ROUTE_HOOKS[plan.structure.route]


def backward_reads_l(plan: Plan) -> bool:
    """Whether a stage of the backward plan reads L' back (the plan decides; bwd_solve re-forms it elsewhere)."""
    bp = build_backward_plan(plan)
    return bp is not None and "interaction.L" in bp.reads()


def supports_chunk_backward(ir: IR) -> tuple[bool, str]:
    """(True, '') when the chunk module also carries the chunked backward for `ir`; else (False, reason)."""
    ok, why = supports_chunk(ir)
    if not ok:
        return ok, why
    ir = kernel_ir(ir)
    try:
        _backward_context(ir, _Emitter(ir), build_plan(ir, BT, BC))
    except (NotImplementedError, ValueError, KeyError) as exc:
        return False, str(exc)
    return True, ""


class _AnyName(dict):
    def __missing__(self, key: str) -> str:
        return key


# --------------------------------------------------------------------------------------------------
# Tile loads of spec expressions
# --------------------------------------------------------------------------------------------------
class _Emitter:
    """Emits Triton statements that evaluate a spec expression on a tile of tokens.

    A tile is `R` rows (flattened token indices in variable `rows`, validity mask `mask`) and, for a
    key- or value-side expression, the key channels (o_k / m_k) or the value channels (o_v / m_v) of
    the current block. Results are fp32 and zero on invalid rows and channels. `tile(..., kcols="c")` reads
    the key channels of o_c / m_c ([R, BV]) instead: a block of key channels that a program holds next to its
    full-width key rows (the curvature passes hold C's columns o_c as [BK, BV] tiles).
    """

    def __init__(self, ir: IR):
        self.ir = ir
        # k̃ per key head: a diag statistic whose inputs are all per key head, and the exact preconditioner's P
        self.kt_heads = "key" if ir.precond.kind == "exact" or (ir.precond.diag is not None
                                                                and ir.precond.diag.heads == "key") else "value"
        self.q_override: str | None = None  # CCQ, exact ATQ: the stages read q̂ from this buffer
        self.q_lo: str | None = None  # CCQ: and q̂'s remainder from this one (q̂ = qh + ql, in the input dtype)
        self._hi_only = False  # tile(hi_only=True): the q̂ tile is rounded to the input dtype anyway
        # Lean loads (rows as t0 + o_t, a plain input without the broadcast-and-select) cut the scalar-decay state
        # pass's loop from 769 to 652 SASS instructions (FLA's: 612; H200 0.374 → 0.317 ms for gdn's two calls).
        # In the vector-decay kernels, already at 255 registers, they made sm_90 spill more (kda interaction
        # 96 → 400 B: the hoisted int32 offset tiles stay live), and under a PDN statistic (fp32 k̃ tiles) the
        # state pass went from 227 registers to 255 + 48 B spill and 0.44 → 0.83 ms; those keep absolute `rows`.
        self.lean = ir.decay.kind != "vector" and ir.precond.kind != "diag"
        self.rows = ROWS if self.lean else "rows"
        self._kcols = ("o_k", "m_k", "BK")  # the key channels of key-side tiles: offsets, mask, tile width
        # symbols a kernel already holds as tiles (the PDN backward's common subexpressions, its key tile b_k): a tile
        # that reads one takes the variable instead of loading or evaluating it again
        self.known: dict[str, str] = {}

    def _sym(self, name: str, side: str | None, rows: str, mask: str, tag: str, out: list[str]) -> str:
        var = f"_{tag}_{name}"
        ir = self.ir
        two_d = side is not None
        if name in self.known:
            return self.known[name]
        if name == HEAD_INDEX.name:
            return "i_hv.to(tl.float32)"
        if name == STAT.name:
            return "b_stat"
        if name == KTILDE.name:
            hp, nh = ("i_h", "H") if self.kt_heads == "key" else ("i_hv", "HV")
            o_k, m_k, _ = self._kcols
            out.append(f"{var} = tl.load(kt_buf + {row_offset(rows, nh, hp, 'DK', o_k)}, "
                       f"mask={mask}[:, None] & {m_k}[None, :], other=0.)")
            return var
        if name == "q__raw":
            name = "q"
        elif name == "q" and self.q_override is not None:
            o_k, m_k, _ = self._kcols
            off, m = row_offset(rows, 'HV', 'i_hv', 'DK', o_k), f"{mask}[:, None] & {m_k}[None, :]"
            if self.q_lo is None:  # exact ATQ's q̂: one fp32 buffer
                out.append(f"{var} = tl.load({self.q_override} + {off}, mask={m}, other=0.)")
            elif self._hi_only:
                out.append(f"{var} = tl.load({self.q_override} + {off}, mask={m}, other=0.).to(tl.float32)")
            else:
                out.append(f"{var} = (tl.load({self.q_override} + {off}, mask={m}, other=0.).to(tl.float32) + "
                           f"tl.load({self.q_lo} + {off}, mask={m}, other=0.).to(tl.float32))")
            return var
        d = ir.input(name)
        hv, nh = ("i_h", "H") if d.heads == "key" else ("i_hv", "HV")
        p = f"p_{name}"
        if d.is_param:
            if d.vector is None:
                out.append(f"{var} = tl.load({p} + {hv}).to(tl.float32)")
                return var
            dim, o, m = ("DK", *self._kcols[:2]) if d.vector == "key" else ("DV", "o_v", "m_v")
            out.append(f"{var} = tl.load({p} + {hv} * {dim} + {o}, mask={m}, other=0.).to(tl.float32)")
            return f"{var}[None, :]"
        if d.vector is None:
            out.append(f"{var} = tl.load({p} + {row_offset(rows, nh, hv)}, mask={mask}, other=0.).to(tl.float32)")
            return f"{var}[:, None]" if two_d else var
        dim, o, m = ("DK", *self._kcols[:2]) if d.vector == "key" else ("DV", "o_v", "m_v")
        if name in ir.normalize:  # the l2norm stage wrote it once, normalised, in the input dtype
            p = f"pn_{name}"
        out.append(f"{var} = tl.load({p} + {row_offset(rows, nh, hv, dim, o)}, "
                   f"mask={mask}[:, None] & {m}[None, :], other=0.).to(tl.float32)")
        return var

    def tile(self, var: str, expr: sp.Expr, side: str | None, rows: str, mask: str, R: str,
             indent: int = 4, log2: bool = False, printer: str = "fwd", raw: bool = False, kcols: str = "k",
             plain: bool = False, hi_only: bool = False, fast_log: bool = False) -> str:
        """Statements that leave `expr` in `var`: [R] (side None) or [R, BK]/[R, BV] (side key/value).

        printer 'bwd' also prints the nodes that derivatives bring in (sign, fractional powers). `raw`: a plain input
        stays in its buffer's dtype (a tile that only feeds a matmul needs no round trip through fp32). `kcols`: "k" for
        the key channels o_k / m_k ([R, BK]), "kf" for o_kf / m_kf ([R, BKF], the per-channel interaction's chunk form),
        "c" for o_c / m_c ([R, BV]). `plain`: a plain input's tile is its load (whose mask zeroes the rest) also where
        loads are not lean: the curvature passes, whose tiles only feed products (without it, ccq_gla's passes spilled
        32-136 B at dk = 128). `hi_only`: the tile is rounded to the input dtype as it enters a matmul, unscaled, so
        CCQ's q̂ is read as its rounded part alone (one 16-bit load, the operand the matmul took from the fp32 q̂
        before) instead of the sum of the pair. Not where the tile is scaled first (the reverse state pass's Q̂ ⊙ e^B):
        rounding the rounded part again raised ccq_gdn's dS0 error by a sixth to a half (bf16, T = 200, interpreter).
        `fast_log`: log nodes through `_fast_log` (triton_expr).
        """
        saved = self._kcols, self._hi_only
        self._kcols = {"k": ("o_k", "m_k", "BK"), "kf": ("o_kf", "m_kf", "BKF")}.get(kcols, (f"o_{kcols}", f"m_{kcols}", "BV"))
        self._hi_only = hi_only
        try:
            return self._tile(var, expr, side, rows, mask, R, indent, log2, printer, raw, plain, fast_log)
        finally:
            self._kcols, self._hi_only = saved

    def _tile(self, var: str, expr: sp.Expr, side: str | None, rows: str, mask: str, R: str, indent: int, log2: bool,
              printer: str, raw: bool, plain: bool = False, fast_log: bool = False) -> str:
        out: list[str] = []
        names = {}
        if rows == ROWS and not isinstance(expr, sp.Symbol):
            # an expression reads several tiles, and each would keep its own hoisted int32 offset tile live across
            # a loop over chunks: absolute rows. (Added while chasing pgdn's spill, which this alone did not cure:
            # 255 registers + 40 B either way; lean loads off under a PDN statistic did. Shipped, and timed in
            # runs 17-18, with this rule in place.)
            rows = "rows"
        for s in sorted(expr.free_symbols, key=lambda s: s.name):
            names[s.name] = self._sym(s.name, side, rows, mask, var, out)
        text = (triton_expr_bwd if printer == "bwd" else triton_expr)(expr, names, fast_log)
        if (self.lean or plain) and not log2 and isinstance(expr, sp.Symbol) and names[expr.name] == f"_{var}_{expr.name}":
            # a plain input, loaded as a whole tile that the load's mask already zeroes off the valid rows and
            # channels: no broadcast or select (sm_90 does not fold `0 + x`)
            if raw:
                out[-1] = out[-1].removesuffix(".to(tl.float32)")
            out.append(f"{var} = {text}")
            return ("\n" + " " * indent).join(out)
        if log2:  # log-gate in log2 units; per-token floor of -64 (a factor 2^-64, i.e. 0 to fp32 precision): -inf stays finite
            text = f"tl.maximum(({text}) * {RCP_LN2!r}, -64.0)"
        if side is None:
            shape, m = f"[{R}]", mask
        elif side == "key":
            _, m_k, width = self._kcols
            shape, m = f"[{R}, {width}]", f"{mask}[:, None] & {m_k}[None, :]"
        else:
            shape, m = f"[{R}, BV]", f"{mask}[:, None] & m_v[None, :]"
        out.append(f"{var} = tl.where({m}, tl.zeros({shape}, dtype=tl.float32) + {text}, 0.)")
        pad = " " * indent
        return ("\n" + pad).join(out)


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------
def fresh_load(code: str) -> str:
    """`code`'s masked loads (`tl.load(..., other=0.)`) as loads the compiler cannot merge with an identical earlier
    one: the same address and mask with a different eviction hint (evict_first) are a different operation to Triton's
    CSE, which otherwise folds a re-read of a tile into the first read and keeps that value live in between."""
    return code.replace("other=0.)", "other=0., eviction_policy='evict_first')")


def _env() -> jinja2.Environment:
    return template_env(filters=(("fresh_load", fresh_load),))


@dataclass(frozen=True)
class _Roles:
    """The solve's per-token operands as the templates read them, taken from the plan's roles (compiler/plan.py:
    role_exprs), so that the kernels evaluate what the plan's stages hold: write_key (A), erase_key (E, tied), target
    (Z: the tied family's, and the additive family's with β applied by the kernels), beta, write_value (V' = β Z,
    read whole by the untied family's value streams), e and f (untied), log_gate, route (the value route's Z)."""

    write_key: sp.Expr
    erase_key: sp.Expr | None
    target: sp.Expr
    beta: sp.Expr
    write_value: sp.Expr
    e: sp.Expr | None
    f: sp.Expr | None
    log_gate: sp.Expr | None
    route: sp.Expr | None


def _roles(plan: Plan, ir: IR) -> _Roles:
    r = dict(plan.roles)
    s = ir.solve
    common = dict(write_key=r["kw"], log_gate=r.get("g"), route=r.get("r"))
    if plan.family == "untied":
        return _Roles(erase_key=None, target=s.target, beta=sp.Integer(1), write_value=r["vp"], e=r["e"], f=r["f"],
                      **common)
    if plan.family == "tied":
        beta = r.get("beta", sp.Integer(1))
        return _Roles(erase_key=r["ke"], target=r["z"], beta=beta, write_value=sp.Mul(beta, r["z"]), e=None, f=None,
                      **common)
    # additive: the plan's V' = β Z; the kernels apply β to Z's tile (chunk_common.value_stream), and β has its own
    # adjoint part, so they read the two apart
    if sp.Mul(s.beta, s.target) != r["vp"]:
        raise AssertionError(f"{ir.name}: the plan's V' {r['vp']} is not β Z = {s.beta} · {s.target}")
    return _Roles(erase_key=None, target=s.target, beta=s.beta, write_value=r["vp"], e=None, f=None, **common)


def _context(ir: IR) -> dict:
    plan = build_plan(ir, BT, BC)  # the one plan every launch list and stage attribute below comes from
    st = ir.structure
    em = _Emitter(ir)
    if ir.read.kind == "curvature" or (ir.precond.kind == "exact" and ir.precond.placement == "query"):
        em.q_override = "qh_buf"  # the read query q̂ (CCQ, exact ATQ), per value head
        em.q_lo = "ql_buf" if ir.read.kind == "curvature" else None
    decay = "scalar" if ir.decay.kind == "const" else ir.decay.kind
    delta = not st.additive
    untied = not st.tied
    rl = _roles(plan, ir)
    # Pure-data stand-ins for the parts of the IR the host code needs (check_inputs, initial_states).
    decls = ",\n    ".join(repr(d) for d in ir.inputs)
    diag = ir.precond.diag
    ctx = dict(
        omit=OMIT,  # a line a template hook leaves out (render_chunk drops it)
        name=ir.name,
        ir_text=_ir_comment(ir),
        decls=decls,
        precond_kind=ir.precond.kind,
        precond_placement=ir.precond.placement,
        diag_heads=diag.heads if diag is not None else None,
        read_kind=ir.read.kind,
        read_centered=ir.read.centered,
        default_scale=repr(ir.scale) if ir.scale is not None else "None",
        input_names=[d.name for d in ir.inputs],
        ptrs=", ".join(f"p_{d.name}" for d in ir.inputs),
        decay=decay,
        family=plan.family,
        decay_hook=decay_hook(ir.decay.kind, gate_gradient(plan)),
        delta=delta,
        untied=untied,
        # per-channel decay's score and pair products off the 16×16 diagonal blocks (chunk_interaction_vector.jinja's
        # output scores, chunk_bwd_intra.jinja's pair gradients): three tf32 products (fp32 accuracy) where no L' tile
        # stands beside them, the additive family; one for the delta family, whose L' tiles leave no registers (kda:
        # an 8 B spill). H100 (run 104, gla, B 4 T 4096 H 16 D 128 bf16, errors against float64): o 2.981e-3 →
        # 2.939e-3 (FLA 2.966e-3), g 3.029e-3 → 3.017e-3 (FLA 3.020e-3); interaction 0.261 → 0.282 ms, bwd_intra
        # 0.582 → 0.655, the training step 2.395 → 2.480 (0.71× FLA's)
        pair_mm="_mm_tf32" if delta else "_mm_tf32x3",
        e_expr=rl.e,
        f_expr=rl.f,
        # the erase rows' decay: b_{t-1} (b one token earlier; 0 at a chunk's first token) when the erase reads the
        # undecayed state S_{t-1}, else b_t
        row_exclusive=st.erase_reads == "undecayed",
        route=ir.route,
        # the route's hook file (chunk_route_<route>.jinja, the same macros in each): every kernel the route touches
        # calls it where the route enters; the residual route takes the solve's form there (compiler/plan.py:
        # residual_solve: T = (I + L' Diag(β))⁻¹, no β in wy, R = Ũ − W H_n the route and U = β ⊙ R)
        route_hook=route_hook(plan),
        # how the state passes and the output have U (chunk_values_<form>.jinja, the same macros in each): from the WY
        # solve (the delta families: Ũ − W H_n, stored) or as β Z on the loads (the additive family)
        values_hook="chunk_values_plain.jinja" if st.additive else "chunk_values_solved.jinja",
        # the curvature read's mean term (chunk_curvature_<form>.jinja, the same macros in each), read by the curvature
        # passes only
        curvature_hook=f"chunk_curvature_{'centered' if ir.read.centered else 'uncentered'}.jinja",
        # and a training step's rerun of the state pass takes R from the forward's route output (rerun_reads_route)
        route_feeds_rerun=rerun_reads_route(plan),
        # a training forward's output stores its scores for the reverse state pass (compiler/plan.py: scores_kept);
        # the reverse pass forms dU's local share from stored scores in s_buf (scores_in_reverse_pass)
        scores_kept=scores_kept(plan),
        scores_in_reverse_pass=scores_in_reverse_pass(plan) is not None,
        pdn=ir.precond.kind == "diag",
        exact=ir.precond.kind == "exact",
        exact_lam=repr(ir.precond.lam),
        ccq=ir.read.kind == "curvature",
        statistics=statistic_buffers(ir.state_names),  # A, P, C, m: their initial/final/adjoint buffers
        kt_heads=em.kt_heads,
        em=em,
        off=row_offset,
        partial_row=partial_row,
        ir=ir,
        beta=rl.beta,
        target=rl.target,
        write_value=rl.write_value,
        route_value=rl.route,
        write_key=rl.write_key,
        erase_key=rl.erase_key,
        # an untied erase key is loaded where it is read rather than held with the other key tiles: in bwd_intra, at
        # the diagonal block and the log-gate's share, not across the sub-block loop (compile report, sm_90, dk =
        # 128: pkda at BK 32 / 2 warps 223 -> 168 registers; gdn2's b ⊙ k at BK 64 / 4 warps 168 + 8 B spill -> 215,
        # none); in bwd_grads with per-channel decay, after dq̂'s store, where the key is one stored operand (pkda at
        # BK 32 / 4 warps 255 + 32 B spill -> 255, none; gdn2's two loads and a product spill 104 B there)
        late_erase_key=(late := rl.erase_key is not None and rl.erase_key != rl.write_key),
        late_erase_key_grads=late and rl.erase_key.is_Symbol,
        # bwd_intra reads its row tiles (b, q̂, a) again after the loop over the other blocks, which reads none of
        # them, where an untied erase key formed from two inputs (gdn2's b ⊙ k) adds a tile: held through the loop,
        # they spilled 40 B at BK 64 / 2 warps (compile report, sm_90, dk = 128); read again, none
        reload_row_tiles=late and not rl.erase_key.is_Symbol,
        log_gate=rl.log_gate,
        has_beta=rl.beta != 1,  # untied: β is inside V' (write_value)
        beta_grad=beta_gradient(plan),  # a β role to differentiate (gdn2's gains are in its erase key and target)
        reads_l=backward_reads_l(plan),
        BT=BT,
        BC=BC,
        NC=BT // BC,
        sub_levels=[BC >> i for i in range(BC.bit_length() - 1)],  # 16, 8, 4, 2
        RCP_LN2=repr(RCP_LN2),
        q_sym=sp.Symbol("q", real=True),
        q_raw_sym=sp.Symbol("q__raw", real=True),
        kt_key=repr(em.kt_heads == "key"),
        k_sym=sp.Symbol("k", real=True),
        diag=diag,
        norm_eps=repr(ir.norm_eps),
        dptrs=", ".join(f"dx_{d.name}" for d in ir.inputs),
        nptrs="".join(f", pn_{n}" for n in ir.normalize),
        sptrs="".join(f", apre_{n}_buf" for n, _ in precond_shares(plan)),
        precond_shares=dict(precond_shares(plan)),
        normalize=list(ir.normalize),
        norm_heads={n: ir.input(n).heads for n in ir.normalize},
        has_reductions=False,  # render_chunk sets these for a spec with channel reductions
        ir_source="",
        reduction_names=[],
    )
    try:
        ctx.update(_backward_context(ir, em, plan))
    except (NotImplementedError, ValueError, KeyError) as exc:
        ctx.update(backward=False, backward_why=str(exc), grad_code="", parts=[], rerun_kept=[],
                   rerun_kept_without_route=[], rerun_all=[],
                   bwd_kept_buffers=[], kept_states=[], kept_states_bytes=0, cp_backward_launches=[],
                   backward_launches=[], stored_parts=[], fused_grads={p: "" for p in _ADJOINT_OF_PART},
                   tied_keys=False, reads_dy=False, pair_source="fused", grads_launch="bwd_grads",
                   intra_diag=None, INTRA_RANGE_LOG2=None,
                   precond_code=("", ""), backward_buffer_code="", direct_gate=None)
    # the plan's launches and the attributes the templates follow; split_keys: the state passes (forward, when it runs
    # alone, and reverse) hold one block of key rows per program (compiler/plan.py: rule_state_pass)
    ctx["split_keys"] = split_reverse_pass(plan)
    ctx.update(forward_launches=forward_launches(plan), unfused_forward_launches=unfused_forward_launches(plan),
               inference_forward_launches=inference_forward_launches(plan), unfused_form=unfused_form(plan),
               token_buffer_code=allocation_code(token_buffers(plan)))
    # context parallelism: the launches of each forward phase of a slice (compiler/plan.py: cp_stages)
    cs = cp_stages(plan)
    ctx.update(cp_forward_launches={ph: forward_launches(plan, names=getattr(cs, ph))
                                    for ph in ("once", "aux", "after_aux", "transition", "final")},
               value_inputs=[d.name for d in ir.inputs if d.vector == "value"])
    ctx.update(inline_scores=bool(plan.stage("output").attr("inline_scores")), decay_keys=bool(plan.find("decay_keys")))
    # decay_keys run inside the interaction's launch (the plan decides): its Kg and Qg come from the scores' tiles
    ctx["decay_keys_in_interaction"] = any(launch_of(st) == "interaction" for st in plan.find("decay_keys"))
    # and the chunk cumsum at its start (compiler/plan.py: _cumsum_in_interaction)
    ctx["cumsum_in_interaction"] = any(launch_of(st) == "interaction" for st in plan.find("chunk_cumsum"))
    # without a decay the scalar interaction's block merges are tf32x3 products (chunk_interaction.jinja)
    ctx["tf32x3_merges"] = bool(plan.find("interaction")) and not decay_hook(ir.decay.kind).decays
    inter = plan.stage("interaction") if plan.find("interaction") else None
    ctx.update(diag_blocks=inter and inter.attr("diag_blocks"), DIAG_RANGE_LOG2=inter and inter.attr("diag_range_log2"))
    ctx["pair_mats"] = _pair_matrices(inter, rl, ctx["q_sym"], ctx["pair_mm"]) if decay == "vector" and not untied else []
    # bwd_intra's pair gradients over the same matrices (chunk_bwd_intra.jinja)
    ctx["intra_pairs"] = _intra_pairs(inter, rl, ctx["q_sym"]) if decay == "vector" and not untied else []
    # the PDN statistic's scans step over scan_rows tokens (whole chunks) at a time, forward and backward
    ctx.update(BTS=plan.stage("precond_diag").attr("scan_rows") if plan.find("precond_diag") else BT,
               partial_offset=PRECOND_PARTIAL)
    if (decay == "vector") != ctx["decay_keys"]:  # the state passes and the output keep no other per-channel path
        raise AssertionError(f"{ir.name}: per-channel decay's state-pass operands come from decay_keys, and only then")
    if diag is not None:
        ctx.update(dwrite_dkt=_diff(rl.write_key, KTILDE.name))
    return ctx


# --------------------------------------------------------------------------------------------------
# Backward: the chain rule from the chunk operands to the inputs (stage `inputs` of the backward)
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Part:
    """A chunk operand whose adjoint a backward stage leaves in `buffer`: d x += ∂expr/∂x · adjoint."""

    name: str
    expr: sp.Expr
    side: str | None  # None (per token), 'key' or 'value'
    load: str  # the statement that loads the adjoint into a_<name>


def _diff(expr: sp.Expr, name: str) -> sp.Expr:
    """∂expr/∂name as one fraction (see recurrent_bwd: no difference of two near-equal terms)."""
    return sp.together(diff_by_name(expr, name))


def _tok(buf: str, side: str | None, heads: str = "HV", head: str = "i_hv", only_if: str = "") -> str:
    """Load a token-level adjoint tile; `only_if`: a per-program condition (a scalar: combined through tl.where,
    since Triton 3.9's interpreter rejects a vector mask `&` a scalar)."""
    def mask(m: str) -> str:
        return f"tl.where({only_if}, {m}, False)" if only_if else m

    if side is None:
        return f"tl.load({buf} + {row_offset(ROWS, heads, head)}, mask={mask('m_r')}, other=0.)"
    dim, o, m = ("DK", "o_k", "m_rk") if side == "key" else ("DV", "o_v", "m_rv")
    return f"tl.load({buf} + {row_offset(ROWS, heads, head, dim, o)}, mask={mask(m)}, other=0.)"


# bwd_precond_diag's store of its block's partials, per statistic head (i_p) and block (i_kb)
PRECOND_PARTIAL = partial_row("i_p", "i_kb", "NKP") + " + o_t"


def _block_partials(var: str, buf: str, count: str, head: str = "i_hv", only_if: str = "") -> str:
    """Load a per-token adjoint left as `count` partial sums (partial_row), added block by block in a fixed order;
    `only_if` as `_tok`'s."""
    mask = f"tl.where({only_if}, m_r, False)" if only_if else "m_r"
    return (f"{var} = tl.zeros([BT], dtype=tl.float32)\n    p_{var} = {buf} + (({head} * {count}) * TT + t0)\n"
            f"    for i_blk in range(0, {count}):\n        {var} += tl.load(p_{var} + i_blk * TT + o_t, mask={mask}, "
            "other=0.)")


def _parts(ir: IR, em: _Emitter, rl: _Roles, plan: Plan) -> list[_Part]:
    q, k = sp.Symbol("q", real=True), sp.Symbol("k", real=True)
    delta = not ir.structure.additive
    exact = ir.precond.kind == "exact"
    first = "i_hv % G == 0"  # per key head: the first value head of each group reads it (the host sums the group)
    if exact and ir.precond.placement == "query":  # q's adjoint is P_t dq̂_t (bwd_precond_exact), per key head
        parts = [_Part("q", q, "key", "a_q = " + _tok("aqx_buf", "key", "H", "i_h", first))]
    else:
        parts = [_Part("q", q, "key", "a_q = " + _tok("aq_buf", "key"))]
    if rl.log_gate is not None:
        if ir.decay.kind == "vector":
            parts.append(_Part("lg", rl.log_gate, "key", "a_lg = " + _tok("ag_buf", "key")))
        else:
            parts.append(_Part("lg", rl.log_gate, None, _block_partials("a_lg", "ag_buf", "NKG")))
    if ir.structure.tied and beta_gradient(plan):
        parts.append(_Part("beta", rl.beta, None, _block_partials("a_beta", "abeta_buf", "NKG")))
    # the value stream's adjoint: of Z (tied, additive: β has its own part) or of V' = β Z (untied DPLR, whose
    # kernels read V' whole: compiler/plan.py, role_exprs' vp)
    value = rl.target if ir.structure.tied else rl.write_value
    parts.append(_Part("z", value, "value", "a_z = " + _tok("az_buf", "value")))
    if rl.e is not None and rl.f is not None:  # untied DPLR: the erase vector e and the write-back vector f
        parts.append(_Part("e", rl.e, "key", "a_e = " + _tok("ae_buf", "key")))
        parts.append(_Part("f", rl.f, "key", "a_f = " + _tok("af_buf", "key")))
    elif delta and rl.erase_key != rl.write_key:  # tied keys: one adjoint (the write key's) for both roles
        assert rl.erase_key is not None
        parts.append(_Part("e", rl.erase_key, "key", "a_e = " + _tok("ae_buf", "key")))
    parts.append(_Part("a", rl.write_key, "key", "a_a = " + _tok("aa_buf", "key")))
    diag = ir.precond.diag
    if diag is not None:
        # k̃'s and the increment's shares of each input they read, formed by bwd_precond_diag (precond_shares), per
        # statistic head: a key tile, or NKP partial sums (one per block of key channels) of a per-token share
        hp, nh = ("i_h", "H") if em.kt_heads == "key" else ("i_hv", "HV")
        first = "i_hv % G == 0" if em.kt_heads == "key" else ""
        for name, key in precond_shares(plan):
            buf = f"apre_{name}_buf"
            if key:
                parts.append(_Part(f"pre_{name}", _symbol(name), "key",
                                   f"a_pre_{name} = " + _tok(buf, "key", nh, hp, first)))
            else:
                parts.append(_Part(f"pre_{name}", _symbol(name), None, _block_partials(f"a_pre_{name}", buf, "NKP", hp, first)))
        if diag.decay is not None:
            # the decay adjoint arrives as NKP partial sums, one per block of key channels of bwd_precond_diag
            parts.append(_Part("pdec", diag.decay, None, _block_partials("a_pdec", "apdec_buf", "NKP", hp, first)))
    if exact:  # k through the Gram matrix (bwd_precond_exact, bwd_precond_gram), per key head
        parts.append(_Part("kx", k, "key", "a_kx = " + _tok("akx_buf", "key", "H", "i_h", first)))
    if ir.read.kind == "curvature":
        # q and k through the curvature sums (bwd_curvature_query, bwd_curvature_key), per key head; dλ as NKC partial
        # sums, one per column block
        assert ir.read.lam is not None
        group = "i_hv % G == 0"  # (not `first`: the PDN statistic's heads may have reset it)
        parts.append(_Part("qc", q, "key", "a_qc = " + _tok("aqc_buf", "key", "H", "i_h", group)))
        parts.append(_Part("kc", k, "key", "a_kc = " + _tok("akc_buf", "key", "H", "i_h", group)))
        parts.append(_Part("lam", ir.read.lam, None, _block_partials("a_lam", "alam_buf", "NKC")))
    return parts


def _symbol(name: str) -> sp.Symbol:
    return sp.Symbol(name, real=True)


def _precond_backward_code(ir: IR, em: _Emitter, plan: Plan) -> tuple[str, str]:
    """bwd_precond_diag's element-wise work (statement lines at indent 0): (before the reverse scan) ∂map/∂A in
    b_dmap; (after it) the chain rule for the inputs of the statistic's two local parts (compiler/plan.py:
    precond_shares): share_x = ∂(map(A) ⊙ k)/∂x ⊙ dk̃ + ∂inc/∂x ⊙ dinc, with dk̃ in b_dkt (summed over the group's value
    heads) and dinc in b_ab, stored as a key tile or as this block's per-token partial sum. The derivatives share
    their subexpressions (the map's value, its log and softsign): sympy's cse forms each once, before the scan, where
    b_dmap needs them too — the kernel is bound by its instructions per element."""
    diag = ir.precond.diag
    if diag is None:
        return "", ""
    k = _symbol("k")
    inc = diag.stat * diag.gain if diag.gain is not None else diag.stat
    parts = ((diag.map * k, "b_dkt", "kt"), (inc, "b_ab", "inc"))
    shares = dict(precond_shares(plan))
    terms: dict[str, list[tuple[sp.Expr, str]]] = {name: [] for name in shares}
    for name in shares:
        for expr, adjoint, _ in parts:
            dx = _diff(expr, name)
            if dx != 0:
                terms[name].append((dx, adjoint))
    dmap = _diff(diag.map, STAT.name)
    exprs = [dmap] + [dx for name in shares for dx, _ in terms[name]]
    temps, reduced = sp.cse(exprs, symbols=sp.numbered_symbols("pcse_", real=True), optimizations="basic")
    before: list[str] = []
    after: list[str] = []
    saved = dict(em.known)
    em.known["k"] = "b_k"  # the statistic's key tile (chunk_common.pdn_statistic), fp32 and masked
    try:
        for sym, e in temps:
            var = f"b_{sym.name}"
            # the map's log as the forward took it (_fast_log: the SFU's lg2.approx), in its derivatives
            before.append(em.tile(var, e, "key", em.rows, "m_r", "BTS", indent=0, printer="bwd", fast_log=True))
            em.known[sym.name] = var
        before.append(em.tile("b_dmap", reduced[0], "key", em.rows, "m_r", "BTS", indent=0, printer="bwd",
                              fast_log=True))
        # k̃'s terms (adjoint b_dkt) are finished before the scan, so that only each share, not the subexpressions
        # and dk̃, stays live across it; the increment's (adjoint b_ab, the scan's output) after it
        i = 1
        for name, key in shares.items():
            var = f"b_pre_{name}"
            for n_term, (_, adjoint) in enumerate(terms[name]):
                dx = reduced[i]
                i += 1
                lines = before if adjoint == "b_dkt" else after
                if adjoint == "b_ab":
                    # after the scan k is loaded again (an L2 hit) rather than held across it: 145 → 118 registers
                    # at dk = 128 (compile report, pgdn, sm_90; the kernel before this chain rule moved in: 94)
                    em.known.pop("k", None)
                if dx == 1:
                    term = adjoint
                elif isinstance(dx, sp.Symbol) and dx.name in em.known:
                    term = f"{em.known[dx.name]} * {adjoint}"
                else:
                    tile = f"d_{name}_{'kt' if adjoint == 'b_dkt' else 'inc'}"
                    lines.append(em.tile(tile, dx, "key", em.rows, "m_r", "BTS", indent=0, printer="bwd",
                                         fast_log=True))
                    term = f"{tile} * {adjoint}"
                if not key:
                    term = f"tl.sum({term}, 1)"
                # terms run k̃'s first (before the scan), then the increment's (after it)
                lines.append(f"{var} {'+=' if n_term else '='} {term}")
            if not terms[name]:
                after.append(f"{var} = " + ("tl.zeros([BTS, BK], dtype=tl.float32)" if key else
                                            "tl.zeros([BTS], dtype=tl.float32)"))
            buf = f"apre_{name}_buf"
            if key:
                after.append(f"tl.store({buf} + {row_offset(em.rows, 'HP', 'i_p', 'DK', 'o_k')}, {var}, mask=m_rk)")
            else:
                after.append(f"tl.store({buf} + {PRECOND_PARTIAL}, {var}, mask=m_r)")
    finally:
        em.known = saved
    return "\n".join(before), "\n".join(after)


_REDUCE = {  # (input shape, part side) -> how a term [BT] / [BT, BK] / [BT, BV] becomes the input's shape
    ("token", None): "{t}", ("token", "key"): "tl.sum({t}, 1)", ("token", "value"): "tl.sum({t}, 1)",
    ("key", "key"): "{t}", ("value", "value"): "{t}",
    ("param", None): "tl.sum({t}, 0)", ("param", "key"): "tl.sum(tl.sum({t}, 1), 0)",
    ("param", "value"): "tl.sum(tl.sum({t}, 1), 0)",
    ("param_key", "key"): "tl.sum({t}, 0)", ("param_value", "value"): "tl.sum({t}, 0)",
}
_ZERO = {"token": "tl.zeros([BT], dtype=tl.float32)", "key": "tl.zeros([BT, BK], dtype=tl.float32)",
         "value": "tl.zeros([BT, BV], dtype=tl.float32)", "param": "0.0",
         "param_key": "tl.zeros([BK], dtype=tl.float32)", "param_value": "tl.zeros([BV], dtype=tl.float32)"}


# bwd_grads' chunk-operand parts -> the plan's name of their adjoint, in the order the kernel finishes them
_ADJOINT_OF_PART = {"z": "dz", "q": "dqp", "e": "dke", "f": "dkf", "a": "dkw"}
_ADJOINT_TILE = {"z": "b_dz", "q": "b_dq", "e": "b_de", "f": "b_df", "a": "b_da"}


def _grad_store(d: TensorDecl, g: str, shape: str, only_if: str = "") -> str:
    """The statement that stores gradient tile `g` of input `d` (`only_if`: a per-program condition)."""
    dim, o, m = {"token": ("", "", "m_r"), "key": ("DK", "o_k", "m_rk"), "value": ("DV", "o_v", "m_rv"),
                 "param": ("", "", None), "param_key": ("DK", "o_k", "m_k"),
                 "param_value": ("DV", "o_v", "m_v")}[shape]
    if d.is_param:
        row = "i_c.to(tl.int64) * HV + i_hv"
        ptr = f"dx_{d.name} + " + (f"({row}) * {dim} + {o}" if dim else f"{row}")
    else:
        ptr = f"dx_{d.name} + " + (row_offset(ROWS, "HV", "i_hv", dim, o) if dim else row_offset(ROWS, "HV", "i_hv"))
    if m and only_if:
        m = f"tl.where({only_if}, {m}, False)"
    store = f"_cast_for({g}, dx_{d.name}, DT_ID)"  # token-level gradients may be stored in the input dtype
    return f"tl.store({ptr}, {store}" + (f", mask={m})" if m else ")")


def _fused_grad_code(ir: IR, em: _Emitter, rl: _Roles, plan: Plan, fused: tuple[str, ...],
                     value_once: bool = False) -> dict[str, str]:
    """Per bwd_grads part (z, q, e, a): the chain-rule statements for the inputs in `fused`, placed where that
    part's adjoint tile is final; an input's gradient is stored after the last part that reads it. The value-side
    part (z) runs in every key block, whose block 0 stores it, unless `value_once`: then a per-chunk stage (bwd_solve,
    or bwd_scores under a per-channel decay) forms it, once."""
    only_value = "" if value_once else "i_k == 0"
    out = {p: [] for p in _ADJOINT_OF_PART}
    if not fused:
        return {p: "" for p in out}
    saved, em.q_override = em.q_override, None  # derivatives see the inputs, not q̂
    try:
        every = _parts(ir, em, rl, plan)
        parts = {p.name: p for p in every if p.name in _ADJOINT_OF_PART}
        order = [p for p in _ADJOINT_OF_PART if p in parts]
        for d in ir.inputs:
            if d.name not in fused:
                continue
            reading = [p for p in order if _diff(parts[p].expr, d.name) != 0]
            others = [p.name for p in every if p.name not in parts and _diff(p.expr, d.name) != 0]
            if others:
                raise AssertionError(f"{ir.name}: {d.name} also reads {others}; its chain rule is not elementwise")
            g = f"g_{d.name}"
            role = d.vector
            if not reading:
                # no chunk operand reads it (a reduction read only by another reduction): its kernel gradient is
                # zero, stored once with the first part of its side, so that no buffer is left unwritten
                host = next(p for p in order if parts[p].side == role)
                out[host] += [f"{g} = {_ZERO[role]}",
                              _grad_store(d, g, role, only_if=only_value if role == "value" else "")]
            for i, p in enumerate(reading):
                lines = out[p]
                side = parts[p].side
                if side != role:
                    raise NotImplementedError(f"gradient of {d.name} ({role}) through the {side} part {p}")
                if i == 0:
                    lines.append(f"{g} = {_ZERO[role]}")
                dx = _diff(parts[p].expr, d.name)
                if dx == 1:
                    lines.append(f"{g} += {_ADJOINT_TILE[p]}")
                else:
                    var = f"d_{d.name}_{p}"
                    # the value side in every key block: only block 0's tiles are loaded (m_rz, the template's)
                    mask = "m_rz" if p == "z" and not value_once else "m_r"
                    lines.append(em.tile(var, dx, side, em.rows, mask, "BT", printer="bwd",
                                         indent=8 if p == "z" else 4))
                    lines.append(f"{g} += {var} * {_ADJOINT_TILE[p]}")
                if i == len(reading) - 1:
                    # the value-side gradient is formed in every key block, whose block 0 stores it (or once)
                    lines.append(_grad_store(d, g, role, only_if=only_value if role == "value" else ""))
    finally:
        em.q_override = saved
    return {p: ("\n" + " " * (8 if p == "z" else 4)).join(lines) for p, lines in out.items()}


def _input_grad_code(ir: IR, em: _Emitter, rl: _Roles, plan: Plan, skip: tuple[str, ...] = ()
                     ) -> tuple[str, list[_Part]]:
    """The body of the `inputs` backward stage: adjoint loads, then one gradient per input (but those in
    `skip`, which bwd_grads finishes)."""
    saved, em.q_override = em.q_override, None  # derivatives see the inputs, not q̂
    try:
        rest = [d for d in ir.inputs if d.name not in skip]
        every = _parts(ir, em, rl, plan)
        # the adjoints the remaining inputs read, and those another part's load reads (the PDN's k̃ reads a_a)
        parts = [p for p in every if any(_diff(p.expr, d.name) != 0 for d in rest)]
        parts = [p for p in every if p in parts or any(re.search(rf"\ba_{p.name}\b", q.load) for q in parts)]
        lines = [p.load for p in parts]
        for d in rest:
            role = {"key": "key", "value": "value", None: "token"}[d.vector]
            shape = ("param" if role == "token" else f"param_{role}") if d.is_param else role
            g = f"g_{d.name}"
            lines.append(f"# d {d.name}")
            lines.append(f"{g} = {_ZERO[shape]}")
            for p in parts:
                dx = _diff(p.expr, d.name)
                if dx == 0:
                    continue
                key = (shape, p.side)
                if key not in _REDUCE:
                    raise NotImplementedError(f"gradient of {d.name} ({shape}) through the {p.side or 'per-token'} "
                                              f"part {p.name}")
                if dx == 1:
                    term = f"a_{p.name}"
                else:
                    var = f"d_{d.name}_{p.name}"
                    lines.append(em.tile(var, dx, p.side, em.rows, "m_r", "BT", printer="bwd"))
                    term = f"{var} * a_{p.name}"
                lines.append(f"{g} += " + _REDUCE[key].format(t=term))
            if d.name in ir.normalize:  # y = x / sqrt(|x|² + eps): dx = rstd (dy − y (y · dy))
                nh, hp = ("H", "i_h") if d.heads == "key" else ("HV", "i_hv")
                lines.append(f"x_{d.name} = tl.load(p_{d.name} + {row_offset(ROWS, nh, hp, 'DK', 'o_k')}, mask=m_rk, "
                             "other=0.).to(tl.float32)")
                lines.append(f"r_{d.name} = tl.rsqrt(tl.sum(x_{d.name} * x_{d.name}, 1) + {ir.norm_eps!r})[:, None]")
                lines.append(f"y_{d.name} = x_{d.name} * r_{d.name}")
                lines.append(f"{g} = r_{d.name} * ({g} - y_{d.name} * tl.sum(y_{d.name} * {g}, 1)[:, None])")
            lines.append(_grad_store(d, g, shape))
        return "\n    ".join(lines), parts
    finally:
        em.q_override = saved


@dataclass(frozen=True)
class _PairMatrix:
    """One decayed c×c matrix X ⋆ A the per-channel interaction forms (the plan's interaction stage `matrices`, in its
    order): the tiles of its row operand X against the write key's. `acc` names its accumulators (Ld, L16, L_f ...),
    `rows` / `half` its row tiles over the chunk and over a level's later half-block rows, `mm` its products."""

    acc: str
    rows: str
    half: str
    expr: sp.Expr
    mm: str


def _pair_matrices(inter: Stage | None, rl: _Roles, q_sym: sp.Symbol, pair_mm: str) -> list[_PairMatrix]:
    """The per-channel interaction's matrices: L' = E ⋆⁻ A (a delta solve's, tf32 products) and S = Q̂ ⋆ A. (The
    untied family's four matrices have their own template, chunk_interaction_dplr.jinja.)"""
    if inter is None:
        return []
    by_row = {"E": ("L", "b_e", "h_e", rl.erase_key, "_mm_tf32"), "Q": ("S", "b_q", "h_q", q_sym, pair_mm)}
    mats = inter.attr("matrices")
    if any(rows not in by_row or cols != "A" for _, rows, cols, _ in mats):
        raise NotImplementedError(f"the per-channel interaction template forms E ⋆ A and Q ⋆ A; the plan asks for "
                                  f"{[m[:3] for m in mats]}")
    return [_PairMatrix(*by_row[rows]) for _, rows, _, _ in mats]


@dataclass(frozen=True)
class _IntraPair:
    """One decayed score matrix M = X ⋆ A of the per-channel interaction (the plan's interaction `matrices`) as
    bwd_intra takes its pair gradients from its adjoint dM (bwd_scores' [T, HV, BT] rows in `buf`): dX += dM (A ⊙
    decay), dA += dMᵀ (X ⊙ decay), over the pairs j ≤ t (`strict`: j < t). `key` names dM's tiles (b_<key>c / b_<key>r
    in the token loop, b_d<key>d on the diagonal block, b_d<key>b off it), `row` the row operand X's (b_<row>,
    b_<row>s, b_<row>j), whose adjoint is `adj`."""

    key: str
    buf: str
    row: str
    expr: sp.Expr
    strict: bool

    @property
    def adj(self) -> str:
        return f"b_d{self.row}"

    @property
    def acc(self) -> str:
        """The product accumulator of the blocks J < I (`adj` takes it, decayed, after the loop over J)."""
        return f"b_ac{self.row}"

    @property
    def share_buf(self) -> str:
        """Where bwd_grads reads the pair share of `adj` (fp32 [T, HV, dk] rows)."""
        return f"p{self.row}_buf"

    @property
    def words(self) -> str:
        return "j < t of E ⋆⁻ A (dL')" if self.strict else "j ≤ t of Q̂ ⋆ A (dS)"

    @property
    def diag_mask(self) -> str:
        """The diagonal block's pairs of M (rows t, columns s of the block: s ≤ t, or s < t)."""
        return "(o_c[:, None] > o_c[None, :])" if self.strict else "m_le"


def _intra_pairs(inter: Stage | None, rl: _Roles, q_sym: sp.Symbol) -> list[_IntraPair]:
    """bwd_intra's matrices: the output's scores S = Q̂ ⋆ A first, then a delta solve's L' = E ⋆⁻ A — the order of its
    fp32 sums (the token loop's and the diagonal block's dA, the later blocks' accumulator), as they were measured."""
    if inter is None:
        return []
    rows = {"Q": ("q", q_sym), "E": ("e", rl.erase_key)}
    pairs = []
    for name, x, cols, pairs_of in inter.attr("matrices"):
        if x not in rows or cols != "A" or name not in ("Sqa", "L"):
            raise NotImplementedError(f"bwd_intra takes the gradients of Q ⋆ A and E ⋆ A; the plan has {name} = {x} ⋆ "
                                      f"{cols}")
        pairs.append(_IntraPair("s" if name == "Sqa" else "l", BWD_BUFFER_OF[("bwd_scores", f"d{name}")], rows[x][0],
                                rows[x][1], pairs_of == "strict"))
    return sorted(pairs, key=lambda p: p.strict)


def _ir_comment(ir: IR) -> str:
    from ..compiler.ir import format_ir

    return "\n".join("# " + line for line in format_ir(ir).splitlines())


def render_chunk(ir: IR) -> str:
    """The deterministic source of the chunked forward module for `ir`."""
    ok, why = supports_chunk(ir)
    if not ok:
        raise NotImplementedError(f"{ir.name}: chunk kernels not available: {why}")
    # A spec's channel reductions (sum, l2norm) couple the channels of a side, which the kernels' channel tiles
    # cannot see whole: the host evaluates them per token before the launches (runtime/reductions.py), the
    # kernels are generated from the IR in which they are inputs, and the backward carries their gradients to
    # the spec's inputs through the reductions' explicit adjoints.
    kir = kernel_ir(ir)
    ctx = _context(kir)
    spec_names = {d.name for d in ir.inputs}
    ctx.update(decls=",\n    ".join(repr(d) for d in ir.inputs), has_reductions=bool(ir.reductions),
               derived_decls=",\n    ".join(repr(d) for d in kir.inputs if d.name not in spec_names),
               ir_text=_ir_comment(ir),
               ir_source=ir_source(ir) if ir.reductions else "", reduction_names=[r.name for r in ir.reductions])
    src = _env().get_template("chunk_module.jinja").render(**ctx)
    src = drop_omitted(src, ir.name)
    src = re.sub(r"[ \t]+\n", "\n", src)
    src = re.sub(r"\n{3,}(?=\S)", "\n\n\n", src)
    return _prune_kernel_params(src)


_KERNEL_DEF = re.compile(r"^@triton\.jit\ndef (chunk_\w+_kernel)\(\n(.*?)\n\):\n(.*?)(?=^\S)", re.S | re.M)


def _prune_kernel_params(src: str) -> str:
    """Drop every parameter a kernel's body never names, and record what is left in `_KERNEL_ARGS`.

    The templates share one parameter list (chunk_common.args); a kernel keeps only its own operands,
    so the host launches each with the buffers its stage reads and writes, and nothing else.
    """
    kept: dict[str, list[str]] = {}

    def prune(m: re.Match) -> str:
        name, params, body = m.group(1), m.group(2), m.group(3)
        used = set(re.findall(r"\b\w+\b", body))
        items = [p.strip() for p in params.replace("\n", " ").split(",") if p.strip()]
        keep = [p for p in items if p.split(":")[0].strip() in used]
        kept[name] = [p.split(":")[0].strip() for p in keep]
        lines, line = [], "   "
        for p in keep:
            if len(line) + len(p) + 2 > 116:
                lines.append(line.rstrip())
                line = "   "
            line += f" {p},"
        lines.append(line.rstrip())
        return f"@triton.jit\ndef {name}(\n" + "\n".join(lines) + "\n):\n" + body

    src = _KERNEL_DEF.sub(prune, src)
    table = "{\n" + "".join(f"    {k!r}: {tuple(v)!r},\n" for k, v in kept.items()) + "}"
    marker = "_KERNEL_ARGS = None  # kernel name -> the parameters its body uses (filled in by codegen.chunk)"
    assert marker in src
    header = "# kernel name -> the parameters its body uses (derived by codegen.chunk)\n"
    return src.replace(marker, f"{header}_KERNEL_ARGS = {table}")
