"""The chunk module's per-token buffers, read off the forward plan.

Each forward stage's stored operand (compiler/plan.py: `stored`) lives in one host buffer, named as the kernels name
it (`BUFFER_OF`), sized by the operand's shape (a per-chunk c×c matrix by token rows; a per-chunk carry by the chunk
count's bound TT / BT + N) and of the operand's dtype ("in": the call's input dtype). A buffer that no forward launch
reads back — only the backward does (L', the statistic's chunk-start carries, CCQ's remainder of q̂ where only the
backward takes it) — is allocated only when the call keeps buffers for a backward.

Not per-token buffers, so not here: the state pass's U and H_n and the route r (the launch decides: fused with the
output they stay in registers), the curvature sums and the exact preconditioner's Gram carries (allocated around
their readers), the output o.

The backward's buffers (`backward_buffers`) are read off the backward plan's stage outputs the same way
(`BWD_BUFFER_OF`): the host allocates each right before the first kernel that names it and drops it after the last
one (chunk_host.jinja: _launch_backward). Two operands may share a buffer, where the later stage adds its share to
the earlier one's (bwd_intra's db pairs, then bwd_grads' dg; the exact preconditioner's dk_x, then the Gram pass's
dk_g). A stage's `partial_sums` are per-token sums over the key channels that each block of them leaves as one row
([heads, blocks, T]: codegen/address.py: partial_row), so their buffers hold one row per block: `PARTIAL_BLOCKS`
names the host's block count for each such stage (its launch setting's BK, or BV for the curvature query's columns).
The inputs' gradients (grad_x) are the host's result buffers, sized by the call's inputs (an input's dtype, or fp32
where a group of value heads sums into it), and the curvature sums' rerun takes the forward's allocation
(`_curvature_sums`: C_n at every other chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.plan import (
    BackwardPlan,
    Operand,
    Plan,
    Stage,
    build_backward_plan,
    call_launch_of,
    kept_states,
    stored,
)

# a forward stage's stored operand -> the buffer its kernels name
BUFFER_OF = {("l2norm", "qn"): "pn_q", ("l2norm", "kn"): "pn_k",
             ("precond_diag", "kw"): "kt_buf", ("precond_diag", "An"): "an_buf",
             ("precond_exact", "kw"): "kt_buf", ("precond_exact", "qp"): "qh_buf",
             ("curvature_query", "qp"): "qh_buf", ("curvature_query", "qp_lo"): "ql_buf",
             ("curvature_query", "corr"): "corr_buf", ("curvature_query", "mq"): "mq_buf",
             ("interaction", "Sqa"): "s_buf", ("interaction", "Aqf"): "s_buf", ("interaction", "Aew"): "aew_buf",
             ("interaction", "Aqw"): "aqw_buf", ("interaction", "L"): "l_buf", ("triangular_solve", "Tm"): "t_buf",
             ("wy", "W"): "w_buf", ("wy", "Ut"): "u_buf", ("decay_keys", "Kg"): "kg_buf", ("decay_keys", "Qg"): "qg_buf",
             ("output", "Sc"): "s_buf"}
# untied DPLR's two write streams: the erase stream's key F ⊙ e^{b_c − B} takes kg_buf (the state passes' first
# stream), the write key's W ⊙ e^{b_c − B} its own
UNTIED_BUFFER_OF = {("decay_keys", "Fg"): "kg_buf", ("decay_keys", "Kg"): "wg_buf"}
# held elsewhere (see the module docstring)
ELSEWHERE = {("state_pass", "U"), ("state_pass", "Hn"), ("state_pass", "r"), ("curvature_state", "Cn"),
             ("curvature_state", "m_n"), ("precond_gram", "Gn"), ("output", "o"), ("output", "r")}
# the host's names for a shape's dimensions (per token: TT rows; per chunk: the chunk count's bound)
_SIZE = {"T": "TT", "H": "H", "HV": "HV", "dk": "DK", "dv": "DV", "C": "BT", "NT": "(triton.cdiv(TT, BT) + N)"}


@dataclass(frozen=True)
class TokenBuffer:
    name: str
    numel: str  # a Python expression over TT, N, H, HV, DK, DV, BT
    dtype: str  # "dt" (the call's input dtype) or "f32"
    backward_only: bool  # read back by no forward launch: allocated only when the call keeps buffers
    kind: str  # the kind of the stage that writes it
    operand: str  # stage.operand, for the generated line's comment

    def line(self) -> str:
        return f'b["{self.name}"] = ({self.numel}, {self.dtype})  # {self.operand}'


def allocation_code(bufs: tuple[TokenBuffer, ...], indent: str = "    ") -> str:
    """The host's allocation lines (chunk_host.jinja: _token_buffers), the backward-only ones under `if keep:`."""
    lines: list[str] = []
    for i, buf in enumerate(bufs):
        if buf.backward_only and (i == 0 or not bufs[i - 1].backward_only):
            lines.append("if keep:  # read back by the backward only")
        lines.append(("    " if buf.backward_only else "") + buf.line())
    return "\n".join(indent + ln for ln in lines)


def _numel(o: Operand) -> str:
    dims = list(o.dims[1:])  # B and T together are the call's TT tokens
    if dims[0] == "NT" and dims[-2:] == ["C", "C"]:
        dims = ["T", *dims[1:-1]]  # a c×c matrix is stored by token rows
    return " * ".join(_SIZE[d] for d in dims)


def _read_back_in_forward(plan: Plan, st: Stage, o: Operand) -> bool:
    """Whether a forward launch loads `o` from memory, in some call: one other than the producer's (a consumer fused
    into the producer's launch takes it from registers, unless its `reads_back` names it), where a stage a call may
    unfuse counts as its own launch (call_launch_of)."""
    return any(call_launch_of(c) is None or call_launch_of(c) != call_launch_of(st) or o.name in (c.attr("reads_back") or ())
               for c in plan.stages() if o.name in c.inputs)


def token_buffers(plan: Plan) -> tuple[TokenBuffer, ...]:
    """The per-token buffers the forward stages write, in the plan's order."""
    bp = build_backward_plan(plan)
    read = bp.reads() if bp is not None else set()
    names = {**BUFFER_OF, **(UNTIED_BUFFER_OF if plan.family == "untied" else {})}
    out: list[TokenBuffer] = []
    for st in plan.stages():
        if st.kind == "chunk_cumsum":
            # the gate cumsum's first output (b, or b_ where the spec names an input b), in g_buf; a cumsum fused
            # into its consumer's scan (the PDN statistic's) and the exclusive form b_(t-1) are not stored
            o = st.outputs[0]
            if stored(plan, st, o, read):
                out.append(TokenBuffer("g_buf", _numel(o), "f32", False, st.kind, f"{st.name}.{o.name}"))
            continue
        for o in st.outputs:
            if not stored(plan, st, o, read) or (st.kind, o.name) in ELSEWHERE:
                continue
            out.append(TokenBuffer(names[(st.kind, o.name)], _numel(o), "f32" if o.dtype == "fp32" else "dt",
                                   not _read_back_in_forward(plan, st, o), st.kind, f"{st.name}.{o.name}"))
    return tuple(out)


def kept_buffers(plan: Plan, kinds: tuple[str, ...]) -> list[str]:
    """The buffers that hold the stored outputs of the forward stages `kinds` that the backward plan keeps (what a
    training forward keeps of them: the memory model's kept operands), in the order of `kinds`."""
    bp = build_backward_plan(plan)
    operands = {f"{m.kind}.{o.name}" for m in bp.memory for o in m.kept} if bp is not None else set()
    bufs = token_buffers(plan)
    return [b.name for kind in kinds for b in bufs
            if b.kind == kind and (bp is None or kind not in bp.kept or _operand_key(b) in operands)]


def _operand_key(b: TokenBuffer) -> str:
    """"kind.operand" of a token buffer (its `operand` names the stage, not the kind)."""
    return f"{b.kind}.{b.operand.split('.', 1)[1]}"


# a statistic state carried beside S -> its buffers: the initial state, the final state, the final state's adjoint and
# the initial state's gradient (the curvature read's count n has none of the last three: the host forms its final)
STATISTIC_BUFFERS = {"A": ("a0", "a_out", "da_fin", "da0"), "P": ("p0", "p_out", "dp_fin", "dp0"),
                     "C": ("c0", "c_out", "dc_fin", "dc0"), "m": ("m0", "m_out", "dm_fin", "dm0")}


def statistic_buffers(state_names: tuple[str, ...]) -> dict[str, tuple[str, str, str, str]]:
    """The spec's statistic states (beside S and the count n) and their buffers, in the IR's state order."""
    return {n: STATISTIC_BUFFERS[n] for n in state_names if n in STATISTIC_BUFFERS}


# the state pass's outputs a keep_states forward keeps (compiler/plan.py: kept_states) -> their buffers
STATE_BUFFER_OF = {"Hn": "h_buf", "U": "vn_buf"}


def kept_state_buffers(plan: Plan) -> list[str]:
    """The buffers of what keep_states keeps, in the state pass's output order."""
    return [STATE_BUFFER_OF[o.name] for o in kept_states(plan)]


# a backward stage's output -> the buffer its kernels name (grad_x: the host's result buffers dx_x, sized by the
# call's inputs; the curvature sums' rerun: the forward's allocation)
BWD_BUFFER_OF = {("bwd_local_values", "dUl"): "dul_buf", ("bwd_local_values", "dU"): "du_buf",
                 ("bwd_state_pass", "dHn1"): "dh_buf", ("bwd_state_pass", "dU"): "du_buf",
                 ("bwd_state_pass", "dS0"): "ds0", ("bwd_state_pass", "dVs"): "dvs_buf",
                 ("bwd_scores", "dSqa"): "dsq_buf", ("bwd_scores", "dL"): "dsl_buf", ("bwd_scores", "dbeta_c"): "dbc_buf",
                 ("bwd_scores", "dY"): "dy_buf", ("bwd_scores", "dz"): "az_buf",
                 ("bwd_scores", "dAqf"): "dsq_buf", ("bwd_scores", "dAqw"): "dsqw_buf",
                 ("bwd_scores", "dAef"): "dsl_buf", ("bwd_scores", "dAew"): "dsw_buf",
                 ("bwd_intra", "dq_pair"): "pq_buf", ("bwd_intra", "da_pair"): "pa_buf",
                 ("bwd_intra", "de_pair"): "pe_buf", ("bwd_intra", "df_pair"): "pf_buf",
                 ("bwd_intra", "db_pair"): "ag_buf",  # bwd_grads adds the rest of dg to it
                 ("bwd_solve", "dY"): "dy_buf", ("bwd_solve", "dSg"): "dsg_buf", ("bwd_solve", "dLg"): "dlg_buf",
                 ("bwd_solve", "dbeta_c"): "dbc_buf", ("bwd_solve", "db_s"): "dgs_buf", ("bwd_solve", "db_l"): "dgl_buf",
                 ("bwd_solve", "dz"): "az_buf",
                 ("bwd_grads", "dqp"): "aq_buf", ("bwd_grads", "dkw"): "aa_buf", ("bwd_grads", "dke"): "ae_buf",
                 ("bwd_grads", "dkf"): "af_buf", ("bwd_grads", "dz"): "az_buf", ("bwd_grads", "dbeta"): "abeta_buf",
                 ("bwd_grads", "dg"): "ag_buf",
                 ("bwd_curvature_query", "dq_c"): "aqc_buf", ("bwd_curvature_query", "dlam"): "alam_buf",
                 ("bwd_curvature_query", "S_hi"): "sh_buf", ("bwd_curvature_query", "S_lo"): "sl_buf",
                 ("bwd_curvature_query", "ms"): "ms_buf",
                 ("bwd_curvature_carry", "Dn_b"): "dn_buf", ("bwd_curvature_carry", "dmc_b"): "dmc_buf",
                 ("bwd_curvature_carry", "dC0"): "dc0", ("bwd_curvature_carry", "dm0"): "dm0",
                 ("bwd_curvature_key", "dk_c"): "akc_buf",
                 ("bwd_precond_diag", "ddec"): "apdec_buf", ("bwd_precond_diag", "dA0"): "da0",
                 ("bwd_precond_exact", "dk_x"): "akx_buf", ("bwd_precond_exact", "dq_x"): "aqx_buf",
                 ("bwd_precond_exact", "u_x"): "wx_buf", ("bwd_precond_exact", "dGc"): "ge_buf",
                 ("bwd_precond_exact", "dPa"): "ga_buf",
                 ("bwd_precond_gram", "dk_g"): "akx_buf",  # added to dk_x's buffer
                 ("bwd_precond_gram", "dP0"): "dp0"}
# the PDN statistic's backward: each input's share (dpre_x) in apre_x_buf
BWD_SHARE_PREFIX = ("bwd_precond_diag", "dpre_")
BWD_ELSEWHERE = {("bwd_curvature_sums", "Cn_b"), ("bwd_curvature_sums", "m_n_b")}
# a stage with partial sums -> the host's count of its key-channel blocks (chunk_host.jinja: _prepare)
PARTIAL_BLOCKS = {"bwd_grads": "run.nkg", "bwd_curvature_query": "run.nkc", "bwd_precond_diag": "run.nkp"}
# the host's names for a shape's dimensions in the backward (the chunk count's bound is the run's NT)
_BWD_SIZE = {**_SIZE, "NT": "NT", "N": "N"}


@dataclass(frozen=True)
class BackwardBuffer:
    name: str
    numel: str  # a Python expression over TT, NT, N, H, HV, DK, DV, BT and the run's block counts
    dtype: str  # "dt" (the call's input dtype) or "fp32"
    operands: tuple[str, ...]  # "stage.operand" of each output it holds, in the plan's order

    def line(self) -> str:
        return f'make["{self.name}"] = ({self.numel}, {self.dtype})  # {", ".join(self.operands)}'


def _bwd_buffer_of(st: Stage, o: Operand) -> str | None:
    if o.name.startswith("grad_") or (st.kind, o.name) in BWD_ELSEWHERE:
        return None
    if (st.kind, o.name) in BWD_BUFFER_OF:
        return BWD_BUFFER_OF[(st.kind, o.name)]
    kind, prefix = BWD_SHARE_PREFIX
    if st.kind == kind and o.name.startswith(prefix):
        return f"apre_{o.name[len(prefix):]}_buf"
    raise AssertionError(f"{st.kind}.{o.name}: no backward buffer for this operand (codegen/buffers.py: BWD_BUFFER_OF)")


def _bwd_numel(st: Stage, o: Operand) -> str:
    dims = list(o.dims[1:] if o.dims[0] == "B" else o.dims)  # B and T together are the call's TT tokens
    if dims[0] == "NT" and dims[-2:] == ["C", "C"]:
        dims = ["T", *dims[1:-1]]  # a c×c matrix is stored by token rows
    if o.name in st.attr("partial_sums", ()):
        dims = [PARTIAL_BLOCKS[st.kind], *dims]  # one row of tokens per block of key channels
    return " * ".join(_BWD_SIZE.get(d, d) for d in dims)


def backward_buffers(bp: BackwardPlan) -> tuple[BackwardBuffer, ...]:
    """The buffers the backward stages write, in the plan's order; an operand added to an earlier one's buffer (the
    same name) must agree with it in size and dtype."""
    out: dict[str, BackwardBuffer] = {}
    for st in bp.stages:
        for o in st.outputs:
            name = _bwd_buffer_of(st, o)
            if name is None:
                continue
            buf = BackwardBuffer(name, _bwd_numel(st, o), "fp32" if o.dtype == "fp32" else "dt",
                                 (f"{st.name}.{o.name}",))
            if name in out:
                first = out[name]
                if (first.numel, first.dtype) != (buf.numel, buf.dtype):
                    raise AssertionError(f"{bp.name}: {first.operands[0]} and {buf.operands[0]} share {name} with "
                                         f"different shapes or dtypes: {first.numel} {first.dtype} / {buf.numel} {buf.dtype}")
                buf = BackwardBuffer(name, buf.numel, buf.dtype, first.operands + buf.operands)
            out[name] = buf
    return tuple(out.values())


def make_code(bufs: tuple[BackwardBuffer, ...], indent: str = "    ") -> str:
    """The host's `make` lines (chunk_host.jinja: _backward), one per buffer."""
    return "\n".join(indent + b.line() for b in bufs)
