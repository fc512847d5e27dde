"""The chunk module's per-token buffers, read off the forward plan.

Each forward stage's stored operand (compiler/plan.py: `stored`) lives in one host buffer, named as the kernels name
it (`BUFFER_OF`), sized by the operand's shape (a per-chunk c×c matrix by token rows; a per-chunk carry by the chunk
count's bound TT / BT + N) and of the operand's dtype ("in": the call's input dtype). A buffer that no forward launch
reads back — only the backward does (L', the statistic's chunk-start carries, CCQ's remainder of q̂ where only the
backward takes it) — is allocated only when the call keeps buffers for a backward.

Not per-token buffers, so not here: the state pass's U and H_n and the route r (the launch decides: fused with the
output they stay in registers), the curvature sums and the exact preconditioner's Gram carries (allocated around
their readers), the output o.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.plan import Operand, Plan, Stage, build_backward_plan, launch_of, stored

# a forward stage's stored operand -> the buffer its kernels name
BUFFER_OF = {("l2norm", "qn"): "pn_q", ("l2norm", "kn"): "pn_k",
             ("precond_diag", "kw"): "kt_buf", ("precond_diag", "An"): "an_buf",
             ("precond_exact", "kw"): "kt_buf", ("precond_exact", "qp"): "qh_buf",
             ("curvature_query", "qp"): "qh_buf", ("curvature_query", "qp_lo"): "ql_buf",
             ("curvature_query", "corr"): "corr_buf", ("curvature_query", "mq"): "mq_buf",
             ("interaction", "Sqa"): "s_buf", ("interaction", "Aqf"): "s_buf", ("interaction", "Aew"): "aew_buf",
             ("interaction", "Aqw"): "aqw_buf", ("interaction", "L"): "l_buf", ("triangular_solve", "Tm"): "t_buf",
             ("wy", "W"): "w_buf", ("wy", "Ut"): "u_buf", ("decay_keys", "Kg"): "kg_buf", ("decay_keys", "Qg"): "qg_buf"}
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
    """Whether a forward launch other than the producer's loads `o` (a consumer fused into the producer's launch
    takes it from registers)."""
    return any(launch_of(c) is None or launch_of(c) != launch_of(st) for c in plan.stages() if o.name in c.inputs)


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
    """The buffers that hold the stored outputs of the forward stages `kinds` (what a training forward keeps of
    them), in the order of `kinds`."""
    bufs = token_buffers(plan)
    return [b.name for kind in kinds for b in bufs if b.kind == kind]
