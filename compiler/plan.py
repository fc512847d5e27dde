"""Canonical IR -> chunk plan: a DAG (compiler/graph.py) of block-level stages, chosen by the IR's Structure.

Each stage is a frozen `Stage` (name, kind, input operand names, typed outputs, attributes). The graph
is built by one rule per stage kind (`STAGE_RULES`), each deciding from the Structure found by the
analysis -- decay kind; additive / tied / untied (the *family*); preconditioner kind and placement;
read correction; route -- whether its stage appears and how. No rule looks at the system's name, so
specs that share structure share plan shape (gla and simple_gla differ only in the decay attribute).

Stage kinds and what they compute (docs/chunk_forms.md section numbers in brackets):

    l2norm            q, k -> qn, kn
    gates             elementwise gate / gain / key expressions (sympy, evaluated per token)
    chunk_cumsum      chunk-local inclusive cumsum b of a log-gate (and the exclusive b_{t-1} when the
                      erase reads the undecayed state: the Triton kernels read it as b one token earlier);
                      Triton keeps it in log2 space
    precond_diag      PDN statistic pass [5] -> write key kw (or read query qp), A_final
    precond_gram      the exact preconditioner's Gram pass [6]: G_0 = P_0^-1, G_(n+1) = G_n + KᵀK (sequential over
                      chunks; the fp32 carry is the Gram matrix, not P: no rank-c down-dates), P_final = G^-1
    precond_exact     per chunk, in parallel: P_n = G_n^-1, I + K P_n Kᵀ = L D Lᵀ (Cholesky without the square root)
                      [6] -> kw (ATK) or qp (ATQ)
    curvature_state   CCQ sums [4]: C_n = Σ kkᵀ (and m_n = Σ k) at every chunk's start, sequential over chunks (one
                      [BK, BV] tile of C per program: no term couples its rows) -> Cn, m_n, C/m/n finals
    curvature_query   CCQ read [4], per chunk, in parallel: q̂ = q − λ corr from Cn, m_n -> read query qp (a pair)
    interaction       intra-chunk decayed matrices [2,3]: tied L' = E⋆⁻A (one; the output forms Q⋆A);
                      untied DPLR four: E⋆⁻F, E⋆⁻W, Q⋆F, Q⋆W; none for additive
    triangular_solve  tied: T = (I + Diag(β)L')^{-1} Diag(β) (the residual route: (I + L'Diag(β))^{-1},
                      residual_solve [8a]); untied: T = (I − E⋆⁻F)^{-1} (fused into the interaction for both)
    wy                tied: W = T(E⊙e^B), Ũ = T Z;  untied: W = −T(E⊙e^B), Ũ = T (E⋆⁻W) V'
    decay_keys        per-channel decay: A⊙e^{b_c−B}, Q⊙e^B (untied: F⊙e^{b_c−B}, W⊙e^{b_c−B}, Q⊙e^B)
    state_pass        sequential over chunks: H_n, U = Ũ − W H_n, H_{n+1}; residual route: R = Ũ − W H_n the
                      route, U = β R [8a]
    output            O = scale·[(Q'⊙e^B) H_n + Σ_streams (Q'⋆K_s) V_s] (scalar or no decay: fused into the
                      state pass's launch, which then keeps H_n and U in registers)

Operand shapes are symbolic: B, T, H (key heads), HV (value heads), dk, dv, NT (chunks), C (chunk
size), N (sequences). Token-level operands are [B,T,heads,...] (FLA's layout); per-chunk matrices are
[B,NT,HV,C,C]; states use the h = Sᵀ layout [N,HV,dk,dv]. dtype "in" is the input precision, "fp32"
the accumulation precision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import sympy as sp

from .graph import StageGraph
from .ir import HEAD_INDEX, IR, KTILDE, STAT, Structure, kernel_ir

STAGE_KINDS = ("l2norm", "gates", "chunk_cumsum", "precond_diag", "precond_gram", "precond_exact", "curvature_state",
               "curvature_query", "interaction", "triangular_solve", "wy", "decay_keys", "state_pass", "output")


class PlanTypeError(Exception):
    """The plan is ill-typed: an operand consumed but never produced, or inconsistent shapes."""


@dataclass(frozen=True)
class Operand:
    name: str
    shape: str  # e.g. "[B,T,HV,dk]"
    dtype: str  # "in" | "fp32"

    @property
    def dims(self) -> tuple[str, ...]:
        return _dims(self.shape)

    def __str__(self) -> str:
        return f"{self.name}: {self.shape} {self.dtype}"


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[Operand, ...]
    attributes: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attributes:
            if k == key:
                return v
        return default

    @property
    def bind(self) -> dict[str, str]:
        """role -> operand: which input plays which part (e.g. E, A, b for the interaction)."""
        return dict(self.attr("bind", ()))

    def role(self, r: str) -> str | None:
        return self.bind.get(r)

    @property
    def output_types(self) -> dict[str, tuple[str, str]]:
        """operand name -> (symbolic shape, dtype)."""
        return {o.name: (o.shape, o.dtype) for o in self.outputs}

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    def out(self, name: str) -> Operand:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"Stage({self.name}: {self.kind})"


@dataclass(frozen=True, eq=False)
class Plan:
    """A typed DAG of stages. `inputs`: spec inputs and initial states; `outputs`: result -> operand."""

    name: str
    graph: StageGraph
    inputs: tuple[Operand, ...]
    outputs: tuple[tuple[str, str], ...]
    structure: Structure
    family: str  # additive | tied | untied
    chunk_size: int
    sub_chunk: int
    # The backward's chain rule: per chunk-operand adjoint of bwd_grads (dqp, dkw, dke, dz), the inputs its
    # expression reads; and the inputs whose gradient is elementwise in those adjoints (a key or value input,
    # not a param, not L2-normalised, and not fed by a gate, a gain, a PDN statistic or a curvature read).
    grad_parts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    elementwise_grads: tuple[str, ...] = ()
    # The per-token operands of the family as expressions over the (kernel) IR's inputs (`role_exprs`): what the
    # stages' bound operands hold, and what the code generator's kernels evaluate on their tile loads.
    roles: tuple[tuple[str, Any], ...] = ()

    def role(self, name: str) -> Any:
        """The expression of role `name` (kw, ke, z, beta, vp, e, f, g, r); KeyError if the family has none."""
        return dict(self.roles)[name]

    def stages(self) -> list[Stage]:
        return list(self._launch_order)

    @cached_property
    def _launch_order(self) -> tuple[Stage, ...]:
        # the graph is built once (build_plan) and never changed after: its order is computed once too (codegen
        # asks for it about a thousand times per spec)
        return tuple(self.graph.topological_order())  # ties in the order the rules added the stages

    def kinds(self) -> list[str]:
        return [s.kind for s in self.stages()]

    def find(self, kind: str) -> list[Stage]:
        return [s for s in self.stages() if s.kind == kind]

    def stage(self, name: str) -> Stage:
        for s in self.graph.nodes:
            if s.name == name:
                return s
        raise KeyError(name)

    def producer(self, operand: str) -> Stage | None:
        for s in self.graph.nodes:
            if operand in s.output_names:
                return s
        return None

    def operand(self, name: str) -> Operand:
        p = self.producer(name)
        if p is not None:
            return p.out(name)
        for o in self.inputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def feeds(self, operand: str, consumer_kind: str) -> bool:
        """Whether `operand` is consumed by a stage of `consumer_kind`."""
        return any(operand in s.inputs for s in self.find(consumer_kind))


# Stages fused into another's launch that a call may still run in launches of their own: the output in the state pass
# (its unfused_when: few state programs), and the wy stage fused there with it (wy_in_training_state_pass). Codegen's
# unfused form launches them alone; what passes between them then goes through memory (codegen/buffers.py).
# (A stage of these kinds fused elsewhere, the wy stage at the end of the per-channel interaction, is no per-call form.)
PER_CALL_HOST = "state_pass"
PER_CALL_GUESTS = ("wy", "output")


def call_launch_of(st: Stage) -> str | None:
    """launch_of(st), or the stage's own launch where a call may unfuse it from the state pass (PER_CALL_GUESTS)."""
    return st.kind if st.kind in PER_CALL_GUESTS and launch_of(st) in (st.kind, PER_CALL_HOST) else launch_of(st)


def launch_of(st: Stage) -> str | None:
    """The launch that computes `st`: its own (its kind), a fused consumer's (attribute `fused`), or none
    ("loads": evaluated inside every consumer's tile loads)."""
    fused = st.attr("fused")
    if fused == "loads":
        return None
    return fused or st.kind


def _dims(shape: str) -> tuple[str, ...]:
    inner = shape.strip()[1:-1].strip()
    return tuple(d.strip() for d in inner.split(",")) if inner else ()


def _shape(*dims: str) -> str:
    return "[" + ",".join(d for d in dims if d) + "]"


def family_of(s: Structure) -> str:
    return "additive" if s.additive else ("tied" if s.tied else "untied")


# --- per-token operand expressions -------------------------------------------------------------------
def role_exprs(ir: IR) -> dict[str, sp.Expr]:
    """The per-token quantities the plan's family needs, as sympy expressions over the spec's inputs.

    tied (§2 letters): beta, ke (erase/read key E), kw (write key A), z (target Z):
        u_t = β_t (z_t − X_t ke_t), X_t = S̄_t or S_{t-1}; a tied dplr maps to β = 1, ke = −e, z = v'.
    additive: kw, vp (= v').   untied: e, f, kw (= w), vp.
    """
    s = ir.structure
    sol = ir.solve
    fam = family_of(s)
    out: dict[str, sp.Expr] = {}
    if ir.decay.kind != "none":
        assert ir.decay.log_gate is not None
        out["g"] = ir.decay.log_gate
    e, f, vp, w = sol.canonical()
    if fam == "tied":
        if sol.kind == "delta":
            assert sol.erase_key is not None
            if sol.beta != 1:
                out["beta"] = sol.beta
            out["ke"] = sol.erase_key
            out["kw"] = sol.write_key
            out["z"] = sol.target
        else:
            out["ke"] = -e
            out["kw"] = w
            out["z"] = vp
    elif fam == "additive":
        out["kw"] = w
        out["vp"] = vp
    else:
        out["e"] = e
        out["f"] = f
        out["kw"] = w
        out["vp"] = vp
    if ir.route == "value":
        out["r"] = sol.target
    d = ir.precond.diag
    if ir.precond.kind == "diag" and d is not None:
        out["p_inc"] = d.stat * d.gain if d.gain is not None else d.stat
        if d.decay is not None:
            out["gP"] = d.decay
    if ir.read.kind == "curvature":
        assert ir.read.lam is not None
        out["lam"] = ir.read.lam
    return out


# --- the builder -----------------------------------------------------------------------------------
@dataclass
class _Builder:
    ir: IR
    chunk_size: int
    sub_chunk: int
    roles: dict[str, str] = field(default_factory=dict)  # logical role -> operand name
    types: dict[str, Operand] = field(default_factory=dict)  # operand name -> type
    stages: list[Stage] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    exprs: dict[str, sp.Expr] = field(default_factory=dict)

    @property
    def s(self) -> Structure:
        return self.ir.structure

    @property
    def family(self) -> str:
        return family_of(self.s)

    def add(self, name: str, kind: str, bind: dict[str, str | None], outputs: list[Operand], **attrs: Any) -> Stage:
        """Add a stage; `bind` maps the stage's roles to operands (None: the role is absent)."""
        pairs = tuple((r, o) for r, o in bind.items() if o is not None)
        ins = tuple(dict.fromkeys(o for _, o in pairs))
        attrs["bind"] = pairs
        st = Stage(name, kind, ins, tuple(outputs), tuple(sorted(attrs.items())))
        self.stages.append(st)
        for o in outputs:
            self.types[o.name] = o
        return st

    def op(self, role: str) -> str | None:
        return self.roles.get(role)

    def new(self, role: str, shape: str, dtype: str) -> Operand:
        """A fresh operand for `role` (renamed if a spec input already has that name)."""
        taken = {d.name for d in self.ir.inputs} | set(self.types)
        name = role
        while name in taken:
            name += "_"
        self.roles[role] = name
        return Operand(name, shape, dtype)

    # shapes of expressions
    def _heads(self, expr: sp.Expr) -> str:
        names = {x.name for x in expr.free_symbols} - {HEAD_INDEX.name}
        decls = [self.ir.input(n) for n in names if n not in (KTILDE.name, STAT.name)]
        return "H" if decls and all(d.heads == "key" for d in decls) and KTILDE.name not in names else "HV"

    def expr_shape(self, expr: sp.Expr) -> str:
        names = {x.name for x in expr.free_symbols} - {HEAD_INDEX.name}
        decls = [self.ir.input(n) for n in names if n not in (KTILDE.name, STAT.name)]
        vec = "dk" if KTILDE.name in names or any(d.vector == "key" for d in decls) else None
        if vec is None and any(d.vector == "value" for d in decls):
            vec = "dv"
        per_token = KTILDE.name in names or any(not d.is_param for d in decls)
        heads = self._heads(expr)
        if not names and not expr.has(HEAD_INDEX):
            return _shape(vec or "")
        return _shape("B", "T", heads, vec or "") if per_token else _shape(heads, vec or "")

    def alias(self, expr: sp.Expr) -> str | None:
        """The operand that already holds `expr` when it is a bare input (q, k: after l2norm)."""
        if not isinstance(expr, sp.Symbol) or expr.name in (KTILDE.name, STAT.name, HEAD_INDEX.name):
            return None
        return self.roles.get(f"in:{expr.name}", expr.name)

    def operands_of(self, expr: sp.Expr) -> dict[str, str | None]:
        """sym:NAME -> the operand bound to each input symbol of `expr`."""
        names = sorted(x.name for x in expr.free_symbols if x.name not in (KTILDE.name, STAT.name, HEAD_INDEX.name))
        return {f"sym:{n}": self.roles.get(f"in:{n}", n) for n in names}


# --- one rule per stage kind ----------------------------------------------------------------------
def rule_l2norm(b: _Builder) -> None:
    if not b.s.normalize:
        return
    outs = []
    for n in b.s.normalize:
        decl = b.ir.input(n)
        outs.append(b.new(f"{n}n", decl.shape_text().replace(" ", ""), "in"))
        b.roles[f"in:{n}"] = outs[-1].name
    b.add("l2norm", "l2norm", {n: n for n in b.s.normalize}, outs, eps=b.ir.norm_eps)


def rule_gates(b: _Builder) -> None:
    b.exprs = role_exprs(b.ir)
    computed: list[tuple[str, sp.Expr]] = []
    for role, expr in b.exprs.items():
        if KTILDE in expr.free_symbols:
            continue  # the preconditioner stage produces it
        a = b.alias(expr)
        if a is not None:
            b.roles[role] = a  # a bare input: no stage needed
        else:
            computed.append((role, expr))
    if not computed:
        return
    bind: dict[str, str | None] = {}
    outs = []
    for role, expr in computed:
        bind.update(b.operands_of(expr))
        shape = b.expr_shape(expr)
        if role == "g" and b.s.decay == "vector" and _dims(shape)[-1:] != ("dk",):
            # one log-gate per key channel by the decay's kind, whatever its expression reads: vector(c) of a
            # constant c (what `vector(-softplus(p - p))` simplifies to) is a per-channel gate all the same
            shape = _shape(*(_dims(shape) or ("HV",)), "dk")
        outs.append(b.new(role, shape, "fp32"))
    # fused: no launch of its own; every consumer evaluates the expressions on its tile loads
    b.add("gates", "gates", bind, outs, exprs=tuple(computed), fused="loads")


def rule_chunk_cumsum(b: _Builder) -> None:
    g = b.op("g")
    if g is not None:
        gshape = b.types[g].shape if g in b.types else b.ir.input(g).shape_text().replace(" ", "")
        vec = "dk" if _dims(gshape)[-1:] == ("dk",) else ""  # a constant gate (scalar(c)) has no dims
        exclusive = b.family != "additive" and b.s.erase_reads == "undecayed"
        outs = [b.new("b", _shape("B", "T", "HV", vec), "fp32")]
        if exclusive:
            outs.append(b.new("bx", _shape("B", "T", "HV", vec), "fp32"))
        fused = {"fused": "interaction"} if _cumsum_in_interaction(b, exclusive) else {}
        b.add("cumsum_g", "chunk_cumsum", {"g": g}, outs, decay=b.s.decay, exclusive=exclusive, log2=True, **fused)
    gP = b.op("gP")
    if gP is not None:
        d = b.ir.precond.diag
        assert d is not None
        b.add("cumsum_gP", "chunk_cumsum", {"g": gP},
              [b.new("bP", _shape("B", "T", "H" if d.heads == "key" else "HV"), "fp32")],
              decay="scalar", exclusive=False, log2=True,
              fused="precond_diag")  # the statistic's scan accumulates its own decay


# The per-channel chunk cumsum formed at the start of the interaction's launch (_cumsum_in_interaction): off, measured
# no faster (run 150).
CUMSUM_IN_INTERACTION = False


def _cumsum_in_interaction(b: _Builder, exclusive: bool) -> bool:
    """Whether the interaction's launch forms the per-channel chunk cumsum b itself, before its forms, and stores it
    for them and for the later stages: the cumsum's own launch read the fp32 log-gates and wrote b, which the
    interaction then read again (kda: a 0.075 ms launch of the 0.93 ms forward, H100, B = 4, T = 4096, H = 16, dk =
    128), all bandwidth. The forms read b back at their reference rows after a barrier (L2: this program just
    stored it). Only where the interaction is the cumsum's first consumer and no launch sits between them (no
    preconditioner or curvature statistic), in the one-output form (no exclusive b_(t−1)), and for the families whose
    interaction is the per-channel template (tied and additive).
    Measured (run 150, H100, that shape, benchmarks/plan_experiment.py --patch fused_cumsum): the interaction grew by
    what the launch cost — kda 0.731 → 0.800 ms against the cumsum's 0.077, gdn2 0.583 → 0.663 against 0.075; the
    forwards 1.072 / 1.073 and 1.163 / 1.159 ms. The prologue (load, scan, store, barrier) runs before each program's
    forms with nothing to hide it (255 registers: one or two programs per SM), where the cumsum's own launch streams at
    HBM's rate; the compile report also showed 8-16 B of spill in kda's training variant. So CUMSUM_IN_INTERACTION is
    off; the form stays for the next kernel shape that might hide it."""
    return (CUMSUM_IN_INTERACTION and b.s.decay == "vector" and b.family in ("tied", "additive") and not exclusive
            and b.s.precond == "none" and b.s.read == "none")


def _precond_output(b: _Builder) -> Operand:
    """ATK writes the write key kw; ATQ writes the read query qp."""
    d = b.ir.precond.diag
    heads = "H" if b.ir.precond.kind == "exact" or (d is not None and d.heads == "key") else "HV"
    # fp32, as the chunk module holds them: k̃ = k · f(A) rounded to bf16 raised every pkda gradient's error by about
    # a third (T = 256, bf16 inputs, interpreter: q 4.03e-3 → 5.31e-3, g 4.79e-3 → 6.15e-3), above FLA's. As a pair in
    # the input dtype, like CCQ's q̂ (exact, and what made ccq_gdn's kernels faster), k̃ bought pgdn nothing (its kernel
    # sum 3.346 → 3.325 ms, H200 run 51: the interaction and the output slowed by the second load): not shipped
    if b.s.precond_placement == "write_key":
        if b.exprs["kw"] != KTILDE:
            heads = "HV"
        return b.new("kw", _shape("B", "T", heads, "dk"), "fp32")
    # ATQ's q̂ per value head: the chunk module's readers (output, reverse pass, local values, grads) take it per value
    # head, and precond_exact writes each key head's q̂ into its group's value heads
    out = b.new("qp", _shape("B", "T", "HV", "dk"), "fp32")
    b.roles["q_read"] = out.name
    return out


def _precond_bind(b: _Builder, *exprs: sp.Expr | None) -> dict[str, str | None]:
    bind: dict[str, str | None] = {"k": b.op("in:k") or "k"}
    if b.s.precond_placement == "query":
        bind["q"] = b.op("in:q") or "q"
    else:
        exprs = (*exprs, b.exprs["kw"])
    for e in exprs:
        if e is not None:
            bind.update(b.operands_of(e))
    return bind


# Rows per step of the PDN statistic's scans (precond_diag and its backward): a multiple of the chunk size. Each
# program is sequential over its sequence's steps; the chunk-start carries An stay one per chunk of BT rows. H200,
# pgdn B4 T4096 H16 D128 (run 59, benchmarks/kernel_sections.py, one process), forward / backward ms at 4 warps:
# 64 rows 0.223 / 0.548, 128 rows 0.189 / 0.415, 256 rows 0.263 / 0.446, 512 rows 0.224 / 0.508 (the one-chunk steps'
# backward had run at 1 warp: 0.431 in run 51). A step's cost grows with its rows: the kernels are bound by their
# instructions per element (the tuple scan's exchanges, the map's transcendentals), not by the steps' latency.
# Measured against it (H100, run 103, same process): each chunk's recurrence as one product M X with the chunk's
# decay matrix on tensor cores (tf32x3), forward and reverse: pgdn forward 0.398 ms against the scans' 0.185, backward
# 1.201 against 0.381 (at its best setting, BK 32 / 4 warps: 0.319 and 0.560); prototypes in benchmarks/pdn_forms.py,
# a chunk-parallel form too (a light carry pass, then one matrix per chunk for all channels: forward 0.283, of which
# the carry pass alone 0.120; backward 0.712). Forming the 64 × 64 matrix and its tf32x3 halves every chunk costs more
# per program than the tuple scans' shuffles.
PDN_SCAN_ROWS = 128


def rule_precond_diag(b: _Builder) -> None:
    if b.s.precond != "diag":
        return
    d = b.ir.precond.diag
    assert d is not None
    heads = "H" if d.heads == "key" else "HV"
    out = _precond_output(b)
    bind = {**_precond_bind(b, d.map), "inc": b.op("p_inc"), "bP": b.op("bP"), "A0": "A0"}
    # An: the statistic's value at every chunk's start (a training forward writes it): the backward re-forms every
    # token's statistic from it, chunk-parallel, where it reads it (8 B per token and head instead of 512)
    b.add("precond_diag", "precond_diag", bind, [out, b.new("A_final", _shape("N", heads, "dk"), "fp32"),
                                                 b.new("An", _shape("B", "NT", heads, "dk"), "fp32")],
          placement=b.s.precond_placement, heads=d.heads, map=d.map,
          scan_rows=b.chunk_size * max(1, PDN_SCAN_ROWS // b.chunk_size),
          write_key=b.exprs["kw"] if b.s.precond_placement == "write_key" else None)
    b.outputs["A"] = b.op("A_final")  # type: ignore[assignment]


def rule_precond_exact(b: _Builder) -> None:
    if b.s.precond != "exact":
        return
    # the Gram matrix is carried (fp32 down-dates of P lose definiteness: §6's RLS instability); each chunk inverts
    # its own G_n, so the per-chunk work is parallel and only the rank-c Gram updates are sequential
    b.add("precond_gram", "precond_gram", {"k": b.op("in:k") or "k", "P0": "P0"},
          [b.new("Gn", "[B,NT,H,dk,dk]", "fp32"), b.new("P_final", "[N,H,dk,dk]", "fp32")],
          lam=b.ir.precond.lam, sequential="chunks", form="G_0 = P_0^-1; G_(n+1) = G_n + K^T K; P_final = G^-1")
    out = _precond_output(b)
    bind = {**_precond_bind(b), "Gn": b.op("Gn")}
    form = "P_n = G_n^-1; I + K P_n K^T = L D L^T, Z = L^-1 K P_n; " + \
        ("kw = Z / D" if b.s.precond_placement == "write_key" else "qp = Q P_n - tril(Q (Z/D)^T) Z")
    b.add("precond_exact", "precond_exact", bind, [out], placement=b.s.precond_placement, cholesky="per_chunk",
          form=form, write_key=b.exprs["kw"] if b.s.precond_placement == "write_key" else None)
    b.outputs["P"] = b.op("P_final")  # type: ignore[assignment]


def rule_curvature_state(b: _Builder) -> None:
    if b.s.read != "curvature":
        return
    # the sums are an undecayed additive state pass whose value is the key (§4): C_(n+1) = C_n + K^T K couples no rows
    # of C, so one program per [BK, BV] tile of it, sequence and key head, sequential over the chunks, whose only product
    # per chunk is its tile's K^T K. C_n goes to memory in fp32 for every other chunk (512 B per token and head at
    # dk = 128; an odd chunk's reader adds its predecessor's K^T K, the same product), so that curvature_query, which
    # holds the products, runs chunk-parallel: as one sequential pass with those products inside it (P = tril(Q K^T),
    # Q C_n as split products, P K) it was 0.57 ms of ccq_gdn's 3.4 ms step (H200, run 86). Every chunk's C_n put the
    # forward's peak at 691 MiB (B = 4, T = 4096, H = 16, dk = 128; 435 before it; memory_trace.py), every other's at 566
    bind = {"k": b.op("in:k") or "k", "C0": "C0", "m0": "m0", "n0": "n0"}
    outs = [b.new("Cn", "[B,NT,H,dk,dk]", "fp32")]
    if b.ir.read.centered:
        outs.append(b.new("m_n", "[B,NT,H,dk]", "fp32"))
    outs += [b.new("C_final", "[N,H,dk,dk]", "fp32"), b.new("m_final", "[N,H,dk]", "fp32"),
             b.new("n_final", "[N]", "fp32")]
    b.add("curvature_state", "curvature_state", bind, outs, sequential="chunks",
          tiles="BK rows x BV columns of C per sequence and key head",
          form="C_(n+1) = C_n + K^T K; m_(n+1) = m_n + K^T 1; C_n of every other chunk stored (m_n of every one)")
    b.outputs.update(C=b.roles["C_final"], m=b.roles["m_final"], n=b.roles["n_final"])


def rule_curvature_query(b: _Builder) -> None:
    if b.s.read != "curvature":
        return
    bind = {"q": b.op("in:q") or "q", "k": b.op("in:k") or "k", "lam": b.op("lam"), "Cn": b.op("Cn"), "n0": "n0"}
    if b.ir.read.centered:
        bind["m_n"] = b.op("m_n")
    # per chunk, key head and BV columns of C, chunk-parallel from curvature_state's C_n (λ, per value head, enters
    # only q̂)
    # q̂ as a pair in the input dtype, q̂ = qp + qp_lo (qp rounded to nearest, qp_lo the remainder rounded toward zero,
    # so that qp + qp_lo rounds back to qp; ~16 bits in all):
    # λ·corr is a small share of q̂ that one 16-bit store would round away where the backward sums q̂ ⊙ dq̂ in fp32,
    # while every matmul consumer rounds its q̂ tile to the input dtype anyway and reads qp alone (as a 16-bit load:
    # an fp32 q̂ tile took ccq_gdn's reverse state pass from 209 to 255 registers and 0.28 to 0.61 ms, run 47; reading
    # the pair, 0.33 ms, run 50; ccq_gdn's training step 4.28 → 3.89 ms of kernels)
    # corr itself, per key head in fp32, for a training step: the backward's dλ = −⟨dq̂, corr⟩ reads it instead of
    # re-forming it (8 of that kernel's 15 products per step). It is formed with C and P split into two input-dtype
    # products each (C = C_hi + C_lo), as dλ needs: single products put dλ ~1000× further from the float64 value at the
    # kernel level (benchmarks/NOTES.md, thirteenth session)
    outs = [b.new("qp", "[B,T,HV,dk]", "in"), b.new("qp_lo", "[B,T,HV,dk]", "in"), b.new("corr", "[B,T,H,dk]", "fp32")]
    if b.ir.read.centered:
        # bwd_curvature_key carries no m: a training step leaves it mᵀq per token
        outs.append(b.new("mq", "[B,T,H]", "fp32"))
    b.add("curvature_query", "curvature_query", bind, outs,
          centered=b.ir.read.centered, tiles="BV columns of C per chunk and key head",
          form="corr = (Q (C_n,hi + C_n,lo) + (P_hi + P_lo) K) / tau, P = tril(Q K^T)" +
          (" - M (m^T q) / tau^2" if b.ir.read.centered else "") + "; qp + qp_lo = q - lam corr")
    b.roles["q_read"] = b.roles["qp"]


def _subchunk(b: _Builder) -> bool:
    """Vector decay needs sub-chunk reference points (§3) once the chunk spans several sub-chunks."""
    return b.s.decay == "vector" and b.chunk_size > b.sub_chunk


def _q_read(b: _Builder) -> str:
    return b.op("q_read") or b.op("in:q") or "q"


def _q_read_lo(b: _Builder) -> str | None:
    """The read query's remainder (CCQ's q̂ is a pair, rule_curvature_query), bound where a stage forms products of
    q̂ with the per-channel gates in fp32 before rounding them (Q ⊙ e^B, the decayed scores): those read both halves.
    The scalar- and no-decay output takes q̂'s rounded half alone, a matmul operand in the input dtype either way."""
    return b.op("qp_lo")


def residual_solve(p: Plan | _Builder) -> bool:
    """The residual route of the tied family takes the solve T₁ = (I + L' Diag(β))⁻¹ (β on L''s
    columns, none on the right): by (I + Diag(β)L')⁻¹Diag(β) = Diag(β)(I + L'Diag(β))⁻¹, the state pass's
    R = T₁Z − T₁(E ⊙ e^B)H_n is then the route r_t = v_t − S̄_tᵀk_t itself and U = β ⊙ R (the delta rule writes
    u_t = β_t r_t), so the route costs a store, not the products Z − (E ⊙ e^B)H_n − L'U, and its backward enters
    where β ⊙ dU does (V = β ⊙ dU + dR). No division: β = 0 keeps its r. The lowering allows the residual route only
    on a delta-family solve (compiler/lower.py), so this is every residual route."""
    s = p.structure if isinstance(p, Plan) else p.s
    return s.route == "residual"


# Whether a training step's rerun of the state pass takes R from the forward's route output (rerun_reads_route).
ROUTE_IN_RERUN = True


def rerun_reads_route(p: Plan) -> bool:
    """Whether the backward's rerun of the state pass reads R from the route output of the training forward it
    follows, instead of forming R = Ũ − W H_n (+ Z) again: under residual_solve the route r is R itself, rounded to
    the input dtype as the rerun would store it (vn_buf), so the rerun loads it and runs H_(n+1) = e^(b_c) H_n +
    (A ⊙ e^(b_c − B))ᵀ(β ⊙ R) alone: one product per step on the loop-carried chain instead of two, and neither W, Ũ
    nor v loaded, nor R stored. H100, B = 4, T = 4096, H = 16, dk = dv = 128 (run 132): cler_h_gdn's rerun 0.214 ms
    for ~470 MB moved, gdn's (no route) 0.149 for ~400 MB; this form moves ~270 MB. Exact in fp32; with 16-bit inputs
    the chain's U = β ⊙ R ⊙ e^(...) is rounded once more (the product's operand was rounded from the fp32 R). The
    package (and a context-parallel slice, whose final pass formed it from the true incoming state) saves the route for
    the backward (save_for_backward: an in-place change to it is caught). No backward stage reads Ũ then, so the
    memory model does not keep it; a backward given the kept buffers but not the route (a direct chunk_backward call)
    reruns wy first (codegen/chunk.py: rerun_launches_without_route), and a second backward of a retained graph reruns
    everything, as before."""
    return _route_in_rerun(p) and residual_solve(p) and bool(p.find("state_pass"))


def _route_in_rerun(p: Plan) -> bool:
    """ROUTE_IN_RERUN, a rule of its own so that benchmarks/plan_experiment.py can turn it off for one spec."""
    return ROUTE_IN_RERUN


def _brow(b: _Builder) -> str | None:
    """The decay on the erase rows: b_t, or the exclusive b_{t-1} when the erase reads S_{t-1}."""
    return b.op("bx") or b.op("b")


MATRIX = "[B,NT,HV,C,C]"


# How the per-channel decay's kernels form the pairs whose exponents the chunk's gates bound (the interaction's
# scores, chunk_interaction_vector.jinja; bwd_intra's diagonal blocks, chunk_bwd_intra.jinja):
#   "levels"  the interaction's diagonal 16×16 blocks one product per halving (8, 4, 2, 1), the reference at each pair
#             block's middle, so every factor e^{−|b − r|} ≤ 1 for any log-gates; bwd_intra's diagonal token by token;
#   "blocks"  where every channel of a key block decays by at most 2^DIAG_RANGE_LOG2 over a 16-token block (read from
#             the gates at run time), that block's pairs through one reference, the row before it: row factors ≤ 1,
#             column factors ≤ 2^DIAG_RANGE_LOG2 (no overflow and no underflow in fp32: the same products to
#             rounding), one product per block; other blocks as "levels";
#   "chunk"   "blocks", and where the whole chunk is within the bound, all of the interaction's pairs through one
#             reference (the chunk's start): one [BT, BK] × [BK, BT] product per matrix and key block.
VECTOR_DIAG_FORM = "chunk"
DIAG_RANGE_LOG2 = 64


def rule_interaction(b: _Builder) -> None:
    # Vector decay forms the output's decayed scores Q⋆A here too (sub-chunk references need the
    # per-channel gates of both sides); scalar and no decay leave them to the output stage (one mask).
    scores = b.s.decay == "vector" and b.family != "untied"
    attrs = dict(decay=b.s.decay, subchunk=_subchunk(b), sub_chunk=b.sub_chunk,
                 row_decay="exclusive" if b.op("bx") else "inclusive", family=b.family)
    if scores:
        attrs.update(diag_blocks=VECTOR_DIAG_FORM, diag_range_log2=DIAG_RANGE_LOG2)
    if b.family == "additive":
        if scores:
            b.add("interaction", "interaction", {"Q": _q_read(b), "Q_lo": _q_read_lo(b), "A": b.op("kw"),
                                                 "b": b.op("b")},
                  [Sq := b.new("Sqa", MATRIX, "in")], matrices=((Sq.name, "Q", "A", "inclusive"),), **attrs)
        return
    if b.family == "tied":
        bind = {"E": b.op("ke"), "A": b.op("kw"), "b": b.op("b"), "brow": _brow(b)}
        outs = [L := b.new("L", MATRIX, "fp32")]
        mats: tuple = ((L.name, "E", "A", "strict"),)
        if scores:
            bind.update(Q=_q_read(b), Q_lo=_q_read_lo(b))
            outs.append(Sq := b.new("Sqa", MATRIX, "in"))
            mats += ((Sq.name, "Q", "A", "inclusive"),)
        b.add("interaction", "interaction", bind, outs, matrices=mats, **attrs)
        return
    bind = {"Q": _q_read(b), "E": b.op("e"), "F": b.op("f"), "Wk": b.op("kw"), "b": b.op("b"), "brow": _brow(b)}
    mats = (("Aef", "E", "F", "strict"), ("Aew", "E", "Wk", "strict"), ("Aqf", "Q", "F", "inclusive"),
            ("Aqw", "Q", "Wk", "inclusive"))
    # E⋆⁻F stays in registers for the fused solve; the three others are matmul operands, held in the input dtype
    outs = [b.new(m[0], MATRIX, "fp32" if m[0] == "Aef" else "in") for m in mats]
    mats = tuple((o.name, *m[1:]) for o, m in zip(outs, mats, strict=True))
    # this family's template (chunk_interaction_dplr.jinja) has the "levels" form and the "chunk" one (a chunk within
    # the bound: one product per matrix and key block); "blocks" is its levels
    attrs.update(diag_blocks="chunk" if VECTOR_DIAG_FORM == "chunk" else "levels", diag_range_log2=DIAG_RANGE_LOG2)
    b.add("interaction", "interaction", bind, outs, matrices=mats, **attrs)


def rule_triangular_solve(b: _Builder) -> None:
    if b.family == "additive":
        return
    if b.family == "tied":
        # Ai is held in the input dtype (formed in fp32): it is read only as a matmul operand, rounded to it anyway
        form = "(I + Diag(beta) L)^-1 Diag(beta)" if b.op("beta") else "(I + L)^-1"
        if residual_solve(b):
            form = "(I + L Diag(beta))^-1" if b.op("beta") else "(I + L)^-1"
        b.add("triangular_solve", "triangular_solve", {"L": b.op("L"), "beta": b.op("beta")},
              [b.new("Tm", MATRIX, "in")], family="tied", form=form,
              gain="columns" if residual_solve(b) else None,
              fused="interaction")  # the 16×16 blocks of L' never leave registers
    else:
        b.add("triangular_solve", "triangular_solve", {"L": b.op("Aef")}, [b.new("Tm", MATRIX, "in")],
              family="untied", form="(I - Aef)^-1",
              fused="interaction")  # as for the tied family: E⋆⁻F's 16×16 blocks never leave registers


def rule_wy(b: _Builder) -> None:
    if b.family == "additive":
        return
    outs = [b.new("W", "[B,T,HV,dk]", "in"), b.new("Ut", "[B,T,HV,dv]", "in")]
    row = "exclusive" if b.op("bx") else "inclusive"
    if b.family == "tied":
        inference = _wy_in_inference_state_pass(b)
        in_interaction = _wy_in_interaction(b)
        fused = "interaction" if in_interaction else (
            "state_pass" if inference and _wy_in_training_state_pass(b) else None)
        b.add("wy", "wy", {"T": b.op("Tm"), "E": b.op("ke"), "Z": b.op("z"), "brow": _brow(b)}, outs, family="tied",
              row_decay=row, form="W = T(E*e^B), Ut = T Z",
              inference_fused="state_pass" if inference else None, fused=fused,
              # in the interaction's launch T comes back through memory (its solve's blocks are in no product's layout)
              reads_back=("Tm",) if in_interaction else None)
    else:
        b.add("wy", "wy", {"T": b.op("Tm"), "E": b.op("e"), "Aew": b.op("Aew"), "V": b.op("vp"), "brow": _brow(b)}, outs,
              family="untied", row_decay=row, form="W = -T(E*e^B), Ut = T Aew V'")


# Whether the per-channel tied family forms W and Ũ at the end of the interaction's launch, from the T it has just
# stored (read back by the same program) and the chunk's keys and gates, which that program loaded a moment before (L2,
# not HBM): no wy launch, T, k and the fp32 gates not read again from HBM (~48 of the wy launch's ~104 KB per chunk
# and head at dk = dv = 128). Per-channel decay has no fused state pass + output to form them in (_output_in_state_pass).
# Only where one key tile serves as erase and write key (kda and its read corrections): with two (gdn2's gained erase
# key, pkda's k̃ write key) the interaction kernel, at 255 registers already, spilled 24-40 B with the tail (compile
# report, sm_90, dk = 128), which issue 9 does not allow. Measured (H100, run 148): the fused kernel 0.549 ms against
# 0.384 + 0.164 for the two launches, so no kernel time saved (the tail's chain of loads and products runs after the
# solve at the interaction's two programs per SM, not overlapped with it), one launch fewer per forward.
WY_IN_INTERACTION = True


def _wy_in_interaction(b: _Builder) -> bool:
    """Per-channel decay, tied family with the erase key the write key, inclusive erase rows, no residual route (its
    wy stores (T − I) Z), while WY_IN_INTERACTION is on."""
    return (WY_IN_INTERACTION and b.s.decay == "vector" and b.family == "tied" and b.op("ke") == b.op("kw")
            and not residual_solve(b) and not b.op("bx"))


def _wy_in_inference_state_pass(b: _Builder) -> bool:
    """Whether an inference forward forms the WY form inside its fused state pass + output launch (FlashQLA's fused
    forward): each state program forms U = Ũ − W H_n = T (β ⊙ (Z − (E ⊙ e^B) H_n)) from the solve's T and the chunk's
    erase keys and values, so no wy launch runs and W and Ũ (512 B per token and head at dk = dv = 128, bf16) are
    never written. A training forward keeps W and Ũ for the backward's state passes and runs the wy launch; so do the
    unfused pair (few sequences × value heads: the output's unfused_when) and the backward's rerun.

    Why inference only (H100, B = 4, T = 4096, H = 16, dk = dv = 128, bf16; runs 115-118, one process): in the fused
    kernel the extra c×c product per chunk overlaps the output's chunk work (gdn forward 0.547 → 0.474 ms, deltanet
    0.410 → 0.318); in a state pass that runs alone it sits on the loop-carried chain H_n → E H_n → T x → U → H_{n+1}
    (the backward's rerun 0.144 → 0.208 ms; B = 1, T = 32768: gdn's step +9.5 %), and a training forward that forms
    it instead of keeping W and Ũ leaves the wy launch to the backward.

    Where the output is fused into the state pass (_output_in_state_pass), in the tied family with inclusive erase
    rows (an exclusive e^{b_(t-1)} is left to the wy launch) and no residual route (it stores (T − I) Z for its own
    rounding: residual_solve)."""
    return (b.family == "tied" and _output_in_state_pass(b) and not residual_solve(b) and not b.op("bx"))


# Whether a training forward forms the WY form inside its fused state pass + output too, where an inference forward
# does (_wy_in_inference_state_pass): U = T (β ⊙ (Z − (E ⊙ e^B) H_n)) as the inference kernel forms it, and each state
# program stores its share of what the backward's state passes read, Ũ = T (β ⊙ Z) for its value columns and W = T (β
# ⊙ E ⊙ e^B) for a share of the key columns (products off the loop-carried chain H_n → U → H_{n+1}), so no wy launch
# runs. The backward is unchanged: its rerun of the state pass reads the stored W and Ũ. Off until timed.
WY_IN_TRAINING_STATE_PASS = False


def _wy_in_training_state_pass(b: _Builder) -> bool:
    """Where an inference forward forms the WY form in its fused kernel (the caller checks), whether a training
    forward does too: while WY_IN_TRAINING_STATE_PASS is on."""
    return WY_IN_TRAINING_STATE_PASS


def wy_in_training_state_pass(p: Plan) -> bool:
    """The plan's decision (rule_wy): a training forward's fused state pass + output forms W and Ũ and stores them."""
    wy = p.find("wy")
    return bool(wy) and wy[0].attr("fused") == "state_pass"


def wy_in_inference_state_pass(p: Plan) -> bool:
    """The plan's decision (rule_wy): an inference forward forms W and Ũ inside its fused state pass + output."""
    wy = p.find("wy")
    return bool(wy) and wy[0].attr("inference_fused") == "state_pass"


def rule_decay_keys(b: _Builder) -> None:
    # Per-channel decay: the state passes' key operands A ⊙ e^{b_c − B} and Q ⊙ e^B, formed once per token by a
    # parallel stage, so that the sequential passes load them instead of the gates and their exponentials.
    # Untied DPLR has two write streams: F ⊙ e^{b_c − B} (the erase stream's key, whose values are U) and
    # W ⊙ e^{b_c − B} (the write key's, values V').
    if b.s.decay != "vector":
        return
    if b.family == "untied":
        outs = [b.new("Fg", "[B,T,HV,dk]", "in"), b.new("Kg", "[B,T,HV,dk]", "in"), b.new("Qg", "[B,T,HV,dk]", "in")]
        b.add("decay_keys", "decay_keys", {"F": b.op("f"), "A": b.op("kw"), "Q": _q_read(b), "b": b.op("b")}, outs,
              form="Fg = F e^(b_c - B), Kg = W e^(b_c - B), Qg = Q e^B")
        return
    # Tied and additive: the interaction loads the same A, Q and b tiles of every row for its scores, so it stores
    # Kg and Qg from them (its own launch had read k, q and the fp32 b again: ~0.1 ms of kda's forward on the H200).
    outs = [b.new("Kg", "[B,T,HV,dk]", "in"), b.new("Qg", "[B,T,HV,dk]", "in")]
    bind = {"A": b.op("kw"), "Q": _q_read(b), "Q_lo": _q_read_lo(b), "b": b.op("b")}
    form = "Kg = A e^(b_c - B), Qg = Q e^B"
    b.add("decay_keys", "decay_keys", bind, outs, form=form, fused="interaction")


def _streams(b: _Builder) -> tuple[tuple[str, str], ...]:
    """(key, value) pairs written into the state: H_{n+1} = Γ_c H_n + Σ (K ⊙ e^{b_c − B})ᵀ V."""
    if b.family == "additive":
        return ((b.op("Kg") or b.op("kw"), b.op("vp")),)  # type: ignore[return-value]
    if b.family == "tied":
        return ((b.op("Kg") or b.op("kw"), b.op("U")),)  # type: ignore[return-value]
    return ((b.op("Fg") or b.op("f"), b.op("U")), (b.op("Kg") or b.op("kw"), b.op("vp")))  # type: ignore[return-value]


def rule_state_pass(b: _Builder) -> None:
    outs = []
    if b.family != "additive":
        outs.append(b.new("U", "[B,T,HV,dv]", "in"))
    # H_n is carried in fp32 and stored per chunk in the input dtype, as FLA's h (the output's and the backward's
    # tensor-core operand in that dtype anyway)
    outs += [b.new("Hn", "[B,NT,HV,dk,dv]", "in"), b.new("S_final", "[N,HV,dk,dv]", "fp32")]
    streams = _streams(b)
    bind: dict[str, str | None] = {}
    if b.family != "additive":
        bind.update(W=b.op("W"), Ut=b.op("Ut"))
    for i, (k, v) in enumerate(streams):
        bind[f"K{i}"] = k
        bind[f"V{i}"] = None if v == b.op("U") else v
    bind.update(b=b.op("b"), S0="S0")
    if residual_solve(b):
        bind.update(beta=b.op("beta"))  # R = Ut - W H_n is the route, U = beta R (U = R without a gain)
        outs.append(b.new("r", "[B,T,HV,dv]", "in"))
        b.outputs["route"] = outs[-1].name
    # the additive family without a route couples no key rows (no U = Ut - W H_n): a program per block of them, where
    # the state pass runs alone (the output fused into it reads every key row)
    split = b.family == "additive" and b.s.route == "none"
    b.add("state_pass", "state_pass", bind, outs, family=b.family, decay=b.s.decay, streams=streams,
          keys_decayed=bool(b.op("Kg")) or None, route=b.s.route, sequential="chunks",
          key_blocks="split when alone" if split else None,
          form=("" if b.family == "additive" else
                "R = Ut - W H_n (the route r; stored for U), U = beta R; " if residual_solve(b) else "U = Ut - W H_n; ") +
          "H_(n+1) = e^(b_c) H_n + sum " +
          ("Kg^T V" if b.op("Kg") else "(K e^(b_c-B))^T V"))
    b.outputs["S"] = b.op("S_final")  # type: ignore[assignment]
    if b.s.route == "value":
        b.outputs["route"] = b.op("r")  # type: ignore[assignment]


def rule_output(b: _Builder) -> None:
    bind: dict[str, str | None] = {"Q": _q_read(b), "Hn": b.op("Hn"), "b": b.op("b")}
    if b.family == "untied":
        bind.update(M0=b.op("Aqf"), V0=b.op("U"), M1=b.op("Aqw"), V1=b.op("vp"), Qg=b.op("Qg"))
        scores = ((b.op("Aqf"), b.op("U")), (b.op("Aqw"), b.op("vp")))
        inline = False
    elif b.op("Sqa"):  # vector decay: the interaction formed Q⋆A, decay_keys Q ⊙ e^B
        (k, v), = _streams(b)
        bind.update(M0=b.op("Sqa"), V0=v, Qg=b.op("Qg"))
        scores = ((b.op("Sqa"), v),)
        inline = False
    else:
        (k, v), = _streams(b)
        bind.update(K0=k, V0=v)
        scores = ((f"{bind['Q']}*{k}", v),)
        inline = True
    fused = _output_in_state_pass(b)
    outs = [b.new("o", "[B,T,HV,dv]", "in")]
    if inline and _scores_kept(b):  # the fused kernel's, or a launch of its own where the operands are fp32
        outs.append(b.new("Sc", MATRIX, "in"))
    # Per call, on a GPU: with few sequences × value heads the fused kernel's state programs leave SMs idle while each
    # walks the output's c×c work chunk by chunk; there the output runs in a launch of its own, chunk-parallel, after
    # the state pass (which then stores H_n and U). H200, gdn at B = 1, T = 32768, H = 16 (run 79): the fused kernel
    # 1.47 ms (1.35 at BV 16) against the backward's rerun of the state pass alone, 0.64
    b.add("output", "output", bind, outs, family=b.family, decay=b.s.decay,
          scores=scores, inline_scores=inline, scale=b.ir.scale, subchunk=_subchunk(b) and inline,
          sub_chunk=b.sub_chunk, fused="state_pass" if fused else None,
          stores_scores="Sc = tril(Q' A^T e^(b_i - b_j)), a training call's, for the reverse state pass"
          if len(outs) > 1 else None,
          unfused_when="few sequences x value heads on a GPU (codegen/launch.py: few_state_programs)" if fused else None)
    b.outputs["o"] = b.op("o")  # type: ignore[assignment]


# Whether _scores_kept's form is on. Run 123 (H100, `bash benchmarks/runs/2026-12-06_run123.sh`, B 4 T 4096 H 16
# dk = dv = 128 bf16, 5 interleaved rounds; every bf16 error identical to the bwd_local_values form's): training step
# gdn 2.055 -> 1.897 ms, deltanet 1.558 -> 1.378, keep_states 1.978 -> 1.820 and 1.509 -> 1.349; B 1 T 32768 gdn
# 5.728 -> 5.294.
KEEP_SCORES = True
# Whether the tied per-channel-decay family's reverse pass forms dU's local share from the interaction's Q⋆A
# (scores_in_reverse_pass). Off: run 123 measured kda's step 3.471 -> 3.507 ms (keep_states 3.293 -> 3.333), its
# reverse pass 0.278 -> 0.403 with the Q⋆A tile loaded (131 KB of shared memory: one program per SM) against the
# 0.087 ms bwd_local_values it saves; plan_experiment.py --patch keep_scores still measures it.
QA_IN_REVERSE_PASS = False


def _scores_kept(b: _Builder) -> bool:
    """Whether a training forward stores the output's masked, decayed scores Sc = tril(Q̂ Aᵀ ⊙ e^{b_i − b_j}) (one
    c×c matrix per chunk and head, in the input dtype: 128 B per token and head at c = 64, bf16) for the backward,
    whose reverse state pass then forms the chunk-local share of dU itself, dU = scale Scᵀ dO + (A ⊙ e^{b_c − B})
    dH_{n+1}: no bwd_local_values launch, and its fp32 dU_local never makes the round trip through HBM. The fused
    kernel forms the scores in every value block anyway; its first value block stores them.

    H100, gdn at B = 4, T = 4096, H = 16, dk = dv = 128 (run 122, benchmarks/kernel_sections.py --sub): the reverse
    state pass with the scores loaded 0.271 ms against 0.300 with dU_local loaded, and bwd_local_values (0.128 ms)
    gone; formed inside the reverse pass instead of loaded, 0.516 (136 KB of shared memory: one program per SM).

    Where the output forms its scores (scalar or no decay) in the tied family, with no read correction or
    preconditioner unless their constants are on (scores_keepable); while KEEP_SCORES is on."""
    return KEEP_SCORES and scores_keepable(b)


# Whether the read-corrected specs (CCQ: ccq_gdn, ccq_gdn_uncentered) keep the output's scores too. Their output's
# scores are Q̂ Aᵀ with the corrected query Q̂ that bwd_local_values reads as well (so dU's local share is the same
# scale Scᵀ dO). H100 (run 127, `bash benchmarks/runs/2026-12-06_run127.sh`, plan_experiment.py --patch more_scores, one
# process, B 4 T 4096 H 16 dk = dv = 128 bf16, 5 rounds): ccq_gdn's step 3.915 -> 3.774 ms (predicted -0.12 to -0.15),
# its reverse pass 0.350 -> 0.321 and bwd_local_values gone; bf16 and fp32 errors of o, states and every gradient
# identical to the bwd_local_values form's (T 300), ccq_gdn_uncentered's too.
SCORES_WITH_READ_CORRECTION = True
# Whether the preconditioned specs of the tied family (pdn, pgdn, exact_atk) keep them: their output runs in a launch of
# its own (fp32 k̃ or q̂ tiles: _output_in_state_pass), which forms the scores from the same tiles bwd_local_values
# reads and stores them rounded as bwd_local_values' product rounds them. Verified under the interpreter
# (tests/test_scores_kept.py). Off: run 127 measured pgdn's step 3.205 -> 3.257 ms (errors identical), its reverse pass
# 0.313 -> 0.502 with the scores tile beside the fp32 k̃ tile (compile report 255 registers + 48 B spill, 213 KB of
# shared memory: one program per SM), no better at 2 stages (0.506; 180 registers, 119 KB), against the 0.148 ms
# bwd_local_values it saves.
SCORES_WITH_PRECONDITIONER = False


def scores_keepable(b: _Builder) -> bool:
    """The structures _scores_kept's form serves (the caller: scores formed inside the output, a scalar or no decay):
    the tied family; a route changes the reverse pass's dH terms (the residual route's dR), not dU's local share
    scale Sᵀ dO; a read correction and a preconditioner only while their constants are on."""
    s = b.s
    return b.family == "tied" and (s.read == "none" or SCORES_WITH_READ_CORRECTION) and \
        (s.precond == "none" or SCORES_WITH_PRECONDITIONER)


def scores_kept(p: Plan) -> bool:
    """The plan's decision (rule_output): a training forward stores the output's scores for the reverse state pass."""
    out = p.find("output")
    return bool(out) and out[0].attr("stores_scores") is not None


def scores_in_reverse_pass(p: Plan) -> str | None:
    """The stored scores ("stage.operand") from which the reverse state pass forms dU's chunk-local share itself, or
    None (bwd_local_values forms it, chunk-parallel, and dU_local makes an fp32 round trip to the reverse pass): the
    output's Sc where the plan keeps them (scores_kept), or, with per-channel decay in the tied family, the Q⋆A the
    interaction stores for the output (Sqa, kept for the chunk gradients anyway) — the same loaded tile and product
    bwd_local_values has, moved into the pass; only while QA_IN_REVERSE_PASS is on (off: run 123 measured it slower).
    Not the untied family (its scores are Q⋆F and Q⋆W) or a read correction (other scores); the Q⋆A form not with a
    route either (never measured there)."""
    if scores_kept(p):
        return "output.Sc"
    s = p.structure
    if QA_IN_REVERSE_PASS and p.family == "tied" and s.decay == "vector" and s.route == "none" and s.read == "none" and \
            p.find("interaction") and "Sqa" in p.stage("interaction").output_names:
        return "interaction.Sqa"
    return None


def _output_in_state_pass(b: _Builder) -> bool:
    """Whether the output runs inside the state pass's launch (one program per sequence, value head and BV value
    columns, sequential over chunks): H_n then never leaves registers in the forward, and U is not stored; the
    scores Q̂ Aᵀ are re-formed by every value block of a chunk, the price of the fusion.

    Only where the output's inputs are the state pass's own per-token loads: scalar or no decay (one c×c mask, formed
    in registers) and the one write stream of the additive and tied families. Per-channel decay keeps two launches:
    its scores Q ⋆ A come from the interaction stage and its row operand Q ⊙ e^B from decay_keys, and its state pass
    already holds 234-255 registers at dk = 128, with no room for the output's [BT, BT] scores and [BT, BV]
    accumulator. So does the untied DPLR family (two streams, and per-channel decay only). The residual route is fused
    in its solve form (residual_solve: R is the state pass's Ũ − W H_n, a store); in the explicit form,
    R = Z − (E ⊙ e^B) H_n − L′U added a third product with H_n and the fp32 L′ tile to every step: fused, cler_h_gdn's
    kernel held 255 registers and 128 KB of shared memory at dk = 128 and took 0.663 ms on the H200 against
    0.146 + 0.254 for the two launches (run 65).

    And only where the query and write key are 16-bit tiles: with a fp32 k̃ (PDN, exact ATK) or q̂ (exact ATQ; CCQ's
    before it became a pair) tile the fused kernel re-forms fp32-wide scores in every value block. H200, pgdn at
    B = 4, T = 4096, H = 16, dk = dv = 128 (run 88, benchmarks/plan_experiment.py --patch fuse_output): correct, but
    0.562 ms against 0.156 + 0.188 for the two launches (in run 40 Triton 3.6's build of it had returned NaN).

    CCQ's q̂ is a pair in the input dtype (rule_curvature_query) whose rounded part is what the fused kernel's
    matmuls read: a 16-bit tile like gdn's, so its read is fused too."""
    plain_operands = b.s.precond == "none" and b.s.read in ("none", "curvature")
    return b.s.decay != "vector" and b.family != "untied" and plain_operands


# Order is data dependence; each rule decides from the Structure whether its stage appears.
STAGE_RULES: tuple[Callable[[_Builder], None], ...] = (
    rule_l2norm, rule_gates, rule_chunk_cumsum, rule_precond_diag, rule_precond_exact, rule_curvature_state,
    rule_curvature_query, rule_interaction, rule_triangular_solve, rule_wy, rule_decay_keys, rule_state_pass, rule_output,
)

_STATE_OPERANDS = {"S": ("S0", "[N,HV,dk,dv]"), "A": ("A0", None), "P": ("P0", "[N,H,dk,dk]"),
                   "C": ("C0", "[N,H,dk,dk]"), "m": ("m0", "[N,H,dk]"), "n": ("n0", "[N]")}


def plan_inputs(ir: IR) -> tuple[Operand, ...]:
    """The plan's inputs: the spec's, each channel reduction as the fp32 per-token input the host derives before
    the launches (runtime/reductions.py), then the initial states."""
    ins = [Operand(d.name, d.shape_text().replace(" ", ""), "in") for d in ir.inputs]
    ins += [Operand(r.name, _shape("B", "T", "HV", *(() if r.op == "sum" else ("dk" if r.side == "key" else "dv",))),
                    "fp32") for r in ir.reductions]
    for st in ir.state_names:
        name, shape = _STATE_OPERANDS[st]
        if st == "A":
            assert ir.precond.diag is not None
            shape = _shape("N", "H" if ir.precond.diag.heads == "key" else "HV", "dk")
        ins.append(Operand(name, shape, "fp32"))
    return tuple(ins)


def build_plan(ir: IR, chunk_size: int = 64, sub_chunk: int = 16) -> Plan:
    """Lower the canonical IR to a typed chunk plan (typechecked before it is returned)."""
    if chunk_size < 1 or sub_chunk < 1:
        raise ValueError(f"chunk_size and sub_chunk must be positive; got {chunk_size}, {sub_chunk}")
    if ir.structure is None:
        raise ValueError(f"{ir.name}: the IR has no Structure; run compiler.ir.analyse first")
    # A spec's channel reductions enter the plan as per-token inputs: the package evaluates them on the host
    # before the launches (codegen/chunk.py: render_chunk; runtime/reductions.py).
    b = _Builder(kernel_ir(ir), chunk_size, sub_chunk)
    for rule in STAGE_RULES:
        rule(b)
    g = StageGraph()
    producer: dict[str, Stage] = {}
    for st in b.stages:
        g.add_node(st)
        for o in st.output_names:
            producer[o] = st
    for st in b.stages:
        for i in st.inputs:
            p = producer.get(i)
            if p is not None:
                if g.has_edge(p, st):
                    g.edges[p, st]["operands"].append(i)
                else:
                    g.add_edge(p, st, operands=[i])
    order = ("o", "route", "S", "A", "P", "C", "m", "n")
    outputs = tuple((k, b.outputs[k]) for k in order if k in b.outputs)
    parts, elementwise = _grad_parts(ir)
    plan = Plan(ir.name, g, plan_inputs(ir), outputs, ir.structure, b.family, chunk_size, sub_chunk, parts,
                elementwise, tuple(b.exprs.items()))
    typecheck(plan)
    return plan


def _grad_parts(ir: IR) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[str, ...]]:
    """(adjoint -> the inputs its chunk operand reads, the inputs whose gradient is elementwise in them)."""
    s = ir.solve
    # a channel reduction is a per-token input of the kernels: an adjoint it reads goes to bwd_inputs (and from there
    # through the reduction's adjoint on the host)
    names = {d.name for d in ir.inputs} | {r.name for r in ir.reductions}

    def reads(expr: Any) -> tuple[str, ...]:
        return tuple(sorted(n for n in (x.name for x in getattr(expr, "free_symbols", ())) if n in names))

    # the value stream: Z (the delta and additive solves: β is its own part) or V' = β Z (a DPLR solve, tied or
    # untied: role_exprs' z and vp)
    value = s.canonical()[2] if s.kind == "dplr" else s.target
    parts = [("dqp", ("q",)), ("dkw", reads(s.write_key)), ("dz", reads(value))]
    # the erase key: the delta solve's, or a tied DPLR's −e (role_exprs' ke)
    erase = s.erase_key if s.kind != "dplr" else (-s.e if ir.structure.tied and s.e is not None else None)
    if not ir.structure.additive and erase is not None and erase != s.write_key:
        # tied keys (E = A) have one adjoint for both roles: bwd_grads sums them (one fp32 [T, HV, dk] buffer fewer)
        parts.append(("dke", reads(erase)))
    if not ir.structure.tied:  # untied DPLR: the erase vector e and the write-back vector f
        e, f, _, _ = s.canonical()
        parts += [("dke", reads(e)), ("dkf", reads(f))]
    if ir.precond.kind == "exact":
        return tuple(parts), ()  # k (and q under ATQ) also reach the Gram adjoint's passes: nothing is elementwise
    # inputs whose adjoint other stages also feed: gates and gains (sums over key blocks), what the PDN statistic
    # reads (its reverse pass adds to them), and the curvature read's q (its reverse pass turns the adjoint of q̂
    # into q's), keys and λ
    others = set(reads(ir.decay.log_gate)) | set(reads(s.beta))
    diag = ir.precond.diag
    if diag is not None:
        others |= {"k"} | {n for e in (diag.stat, diag.decay, diag.gain, diag.map) for n in reads(e)}
    if ir.read.kind == "curvature":
        others |= {"q", "k"} | set(reads(ir.read.lam))
    elementwise = tuple(d.name for d in ir.inputs if d.vector in ("key", "value") and not d.is_param
                        and d.name not in ir.normalize and d.name not in others)
    return tuple(parts), elementwise


# --- the backward plan (docs/chunk_forms.md §8): store inputs, recompute the rest, reverse the stages ------------
BACKWARD_KINDS = ("bwd_local_values", "bwd_state_pass", "bwd_scores", "bwd_intra", "bwd_solve", "bwd_grads",
                  "bwd_curvature_sums", "bwd_curvature_query", "bwd_curvature_carry", "bwd_curvature_key",
                  "bwd_precond_diag", "bwd_precond_exact", "bwd_precond_gram", "bwd_inputs")


@dataclass(frozen=True, eq=False)
class BackwardPlan:
    """What the chunked backward keeps, what it recomputes and which stages it runs, in launch order.

    saved:      operands kept from the forward call: the spec's inputs and initial states;
    kept:       forward stages whose buffers the forward call also returns for the backward (normalised q/k,
                the gate cumsum, k̃ and the statistic's chunk-start carries, L', the solve's Ai, W, Ũ): their size is
                fixed by the input shapes, so the forward op can return them; `kept_bytes` is their size per
                token and value head at dk = dv = 128, bf16 (the memory model's price for not recomputing);
    recomputed: forward stages rerun at the start of the backward (per-chunk operands: H_n and U from the
                state pass, the CCQ chunk sums; the decayed keys) or evaluated on loads (gates), plus every stage
                of `kept` when the forward kept nothing;
    memory:     the memory model's decision per forward stage kind (memory_model): kept operands, cost, why;
    stages:     the backward stages; each reads adjoints produced by earlier ones (or given: dO, the
                final-state and route gradients) and the recomputed forward operands named in `reads`.
    """

    name: str
    saved: tuple[str, ...]
    recomputed: tuple[str, ...]
    stages: tuple[Stage, ...]
    kept: tuple[str, ...] = ()
    kept_bytes: int = 0
    memory: tuple[MemoryDecision, ...] = ()

    def kinds(self) -> list[str]:
        return [s.kind for s in self.stages]

    def reads(self) -> set[str]:
        """The forward operands ("stage.operand") its stages read back."""
        return {r for st in self.stages for r in st.attr("reads", ())}


def split_reverse_pass(p: Plan) -> bool:
    """Whether the state passes split over blocks of key rows, as the forward's `key_blocks` attribute says
    (rule_state_pass: the additive family without a route). The reverse pass then carries dH alone: its dH_n =
    e^(b_c) dH_(n+1) + scale (Q' e^B)^T dO couples no key rows (no W^T dU term), so each key block is a program of its
    own (twice the programs at dk = 128, as FLA's chunk_bwd_kernel_dh), and dU, which sums over every key row, is
    formed chunk-parallel after it (bwd_local_values, as FLA's chunk_bwd_kernel_dv) rather than on the sequential
    path."""
    return bool(p.find("state_pass") and p.stage("state_pass").attr("key_blocks"))


def _bwd_local_values(p: Plan) -> Stage | None:
    # The chunk-local share of dU needs no carried state: computed for all chunks at once, it leaves the
    # sequential reverse pass only the products with dH.
    if split_reverse_pass(p) or scores_in_reverse_pass(p):
        return None
    form = "dU_local = scale (Q'*" + ("F" if p.family == "untied" else "A") + ")^T dO"
    return Stage("bwd_local_values", "bwd_local_values", ("dO",), (Operand("dUl", "[B,T,HV,dv]", "fp32"),),
                 (("form", form), ("reads", ("output.scores",))))


def _bwd_values(p: Plan) -> Stage | None:
    # split_reverse_pass: the whole of dU per chunk, after the reverse pass (same kind and kernel as the local share)
    if not split_reverse_pass(p):
        return None
    reads = ("output.scores",) + (("decay_keys.Kg",) if p.find("decay_keys") else ())
    return Stage("bwd_local_values", "bwd_local_values", ("dO", "dHn1"), (Operand("dU", "[B,T,HV,dv]", "in"),),
                 (("form", "dU = scale (Q'*A)^T dO + (A e^(b_c-B)) dH_(n+1)"), ("reads", reads)))


def _bwd_state_pass(p: Plan) -> Stage | None:
    untied = p.family == "untied"
    kg = ("decay_keys.Kg",) if p.find("decay_keys") else ()
    if split_reverse_pass(p):
        form = "dH_n = e^(b_c) dH_(n+1) + scale (Q' e^B)^T dO"
        return Stage("bwd_state_pass", "bwd_state_pass", ("dO", "dS_final"),
                     (Operand("dHn1", "[B,NT,HV,dk,dv]", "in"), Operand("dS0", "[N,HV,dk,dv]", "fp32")),
                     (("form", form), ("reads", ("decay_keys.Qg",) if kg else ()), ("sequential", "chunks, reversed"),
                      ("key_blocks", "split")))
    local = scores_in_reverse_pass(p)  # the chunk-local share of dU from stored scores, in this pass
    ins = ([] if local else ["dUl"]) + ["dO", "dS_final"] + (["dR"] if p.structure.route != "none" else [])
    outs = (Operand("dHn1", "[B,NT,HV,dk,dv]", "in"), Operand("dU", "[B,T,HV,dv]", "in"),
            Operand("dS0", "[N,HV,dk,dv]", "fp32"))
    if untied:  # the write key's stream: its share of dV' sums over every key channel of dH
        outs += (Operand("dVs", "[B,T,HV,dv]", "fp32"),)
    reads = ("state_pass.Hn",) + (("wy.W",) if p.family != "additive" else ()) + \
        ((("decay_keys.Fg", "decay_keys.Kg") if untied else kg) + ("decay_keys.Qg",) if kg else ()) + \
        ((local,) if local else ())
    form = ("dU = dU_local + (F e^(b_c-B)) dH_(n+1); dV_state = (W e^(b_c-B)) dH_(n+1)" if untied else
            f"dU = scale {local.split('.')[1]}^T dO + (A e^(b_c-B)) dH_(n+1)" if local else
            "dU = dU_local + (A e^(b_c-B)) dH_(n+1)") + "; dH_n = e^(b_c) dH_(n+1) + scale (Q' e^B)^T dO" + \
        (" - W^T (beta dU + dR)" if residual_solve(p) else " - W^T dU" if p.family != "additive" else "")
    return Stage("bwd_state_pass", "bwd_state_pass", tuple(ins), outs,
                 (("form", form), ("reads", reads), ("sequential", "chunks, reversed")))


def stored_adjoints(p: Plan) -> tuple[str, ...]:
    """The chunk-operand adjoints bwd_grads writes to memory: those an input outside `elementwise_grads` reads, the
    write key's for the PDN statistic's reverse pass and the query's for the curvature read's."""
    rest = {o.name for o in p.inputs} - set(p.elementwise_grads)
    exact = p.find("precond_exact")
    later = ({"dkw"} if p.find("precond_diag") else set()) | ({"dqp"} if p.find("curvature_query") else set()) | \
        ({"dkw" if exact[0].attr("placement") == "write_key" else "dqp"} if exact else set())
    return tuple(name for name, reads in p.grad_parts if rest & set(reads) or name in later)


def tied_keys_of(p: Plan) -> bool:
    """Whether the delta family's erase key is its write key: `_grad_parts` then gave both roles one adjoint."""
    return p.family == "tied" and "dke" not in dict(p.grad_parts)


def _bwd_scores(p: Plan) -> Stage | None:
    # Per-channel decay: the score matrices' gradients go to memory once per chunk and head, so that the pair
    # gradients are formed on 16×16 sub-blocks (bwd_intra) and not as masked 64-wide products in every key block.
    if p.structure.decay != "vector":
        return None
    if p.family == "untied":
        outs = (Operand("dAqf", MATRIX, "fp32"), Operand("dAqw", MATRIX, "fp32"), Operand("dAef", MATRIX, "fp32"),
                Operand("dAew", MATRIX, "fp32"))
        form = "dAqf = scale mask(dO U^T), dAqw = scale mask(dO V'^T); dY = T^T dU, dAef = mask(dY U^T), dAew = mask(dY V'^T)"
        return Stage("bwd_scores", "bwd_scores", ("dO", "dU"), outs,
                     (("form", form), ("reads", ("state_pass.U", "triangular_solve.Tm"))))
    delta = p.family == "tied"
    residual = p.structure.route == "residual"
    outs = [Operand("dSqa", MATRIX, "fp32")]
    form = "dSqa = scale mask(dO U^T)"
    attrs: tuple[tuple[str, Any], ...] = ()
    if delta:
        dbeta = beta_gradient(p)
        outs += [Operand("dL", MATRIX, "fp32")] + ([Operand("dbeta_c", "[B,T,HV]", "fp32")] if dbeta else [])
        if residual:  # the solve's form (residual_solve): T = (I + L' Diag(beta))^-1, U = beta R (R stored)
            form += "; dY = T^T (beta dU + dR), dN = -dY R^T, dL' = dN Diag(beta)" + \
                ("; dbeta_c = sum dU R + column sums of dN L'" if dbeta else "")
        else:
            form += "; dY = Ai^T dU, dM = -dY U^T, dL' = beta dM" + ("; dbeta_c = sum dY Z + sum dM L'" if dbeta else "")
        # value_side_once: dY, dZ and the value inputs' gradients, once per chunk
        outs.append(Operand("dY", "[B,T,HV,dv]", "in"))
        if "dz" in stored_adjoints(p):
            outs.append(Operand("dz", "[B,T,HV,dv]", "fp32"))
        outs += [Operand(f"grad_{o.name}", o.shape, "in") for o in p.inputs if o.name in _value_grads(p)]
        form += "; dY in the input dtype"
        if _value_grads(p):
            attrs += (("fused", "bwd_inputs for " + ", ".join(f"grad_{n}" for n in _value_grads(p))),)
    reads = ("state_pass.U",) + (("triangular_solve.Tm", "interaction.L") if delta else ())
    ins = ("dO", "dU") + (("dR",) if residual else ())
    return Stage("bwd_scores", "bwd_scores", ins, tuple(outs), (("form", form), ("reads", reads)) + attrs)


def _bwd_intra(p: Plan) -> Stage | None:
    if p.structure.decay != "vector":
        return None
    if p.family == "untied":
        outs = tuple(Operand(n, "[B,T,HV,dk]", "fp32") for n in ("dq_pair", "de_pair", "df_pair", "da_pair", "db_pair"))
        excl = p.structure.erase_reads == "undecayed"
        form = "pair gradients of Q*F, Q*W, E*-F, E*-W on 16x16 sub-blocks (erase rows decayed with " + \
            ("b_(t-1)" if excl else "b_t") + "); db_pair = q dq - f df - w dw" + ("" if excl else " + e de") + \
            " in the buffer of dg"
        # the interaction of this family keeps its own form (chunk_interaction_dplr.jinja); the diagonal blocks here
        # take VECTOR_DIAG_FORM's per-block products where the gates bound them ("chunk" is "blocks" in bwd_intra)
        diag = "levels" if VECTOR_DIAG_FORM == "levels" else "blocks"
        form += ("; diagonal blocks token by token" if diag == "levels" else
                 "; diagonal blocks as products through one reference where the gates bound them, else token by token")
        return Stage("bwd_intra", "bwd_intra", ("dAqf", "dAqw", "dAef", "dAew"), outs,
                     (("form", form), ("reads", ("chunk_cumsum.b",)), ("sub_chunk", p.sub_chunk),
                      ("diag_blocks", diag), ("diag_range_log2", DIAG_RANGE_LOG2)))
    delta = p.family == "tied"
    # with tied keys (E = A) one adjoint holds both roles' shares; the shares of the log-gate's db are written where
    # bwd_grads then leaves dg (one fp32 [T, HV, dk] buffer fewer)
    tied_keys = tied_keys_of(p)
    outs = [Operand("dq_pair", "[B,T,HV,dk]", "fp32"), Operand("da_pair", "[B,T,HV,dk]", "fp32"),
            Operand("db_pair", "[B,T,HV,dk]", "fp32")]
    if delta and not tied_keys:
        outs.append(Operand("de_pair", "[B,T,HV,dk]", "fp32"))
    form = "pair gradients of Q*A" + (" and E*-A" if delta else "") + \
        " on 16x16 sub-blocks: J != I through one reference per block, diagonal blocks token by token; " + \
        ("da_pair holds both roles of the tied keys; " if tied_keys else "") + "db_pair in the buffer of dg"
    inter = p.stage("interaction")  # the forward's choice (VECTOR_DIAG_FORM) and bound hold here too
    return Stage("bwd_intra", "bwd_intra", ("dSqa",) + (("dL",) if delta else ()), tuple(outs),
                 (("form", form), ("reads", ("chunk_cumsum.b",)), ("sub_chunk", p.sub_chunk),
                  ("diag_blocks", inter.attr("diag_blocks")), ("diag_range_log2", inter.attr("diag_range_log2"))))


def _solve_split(p: Plan) -> bool:
    """Whether the scalar- or no-decay delta family's chunk gradients run in two stages: bwd_solve once per chunk and
    head (the c×c adjoints, which do not depend on the key channels), then bwd_grads per block of key channels.

    The fused form formed dS = dO Uᵀ, dY = Aiᵀ dU, dM = −dY Uᵀ, L′ and Q⋆A again in every key block, with
    those [BT, BT] accumulators live next to the [BT, BK] ones: 255 registers at 8 warps (gdn, dk = dv = 128, sm_90), one
    program per SM. The additive family keeps the fused kernel: it has no solve, its only c×c work per key block is
    the output scores' gradient, and it holds fewer tiles (simple_gla: 157 registers at 8 warps, no spill).
    Per-channel decay has its own split (bwd_scores, bwd_intra)."""
    return p.family == "tied" and p.structure.decay != "vector"


def value_side_once(p: Plan) -> bool:
    """Whether the delta family's per-chunk c×c stage — bwd_solve under scalar or no decay, bwd_scores under a
    per-channel decay — forms dY = Aiᵀ dU, the target's adjoint dZ and the value inputs' gradients once per chunk and
    head, and bwd_grads reads dY (input dtype: its product with H rounds dY to it anyway) instead of forming it again
    in every block of key channels. With BK 32 that product was 40 % of the vector family's bwd_grads loop MMA work
    (kda: Aiᵀ dU is 64×64×64 per value block, the loop's three other products 64×64×32 each)."""
    return p.family == "tied"


def _value_grads(p: Plan) -> tuple[str, ...]:
    """The elementwise gradients of value-side inputs (they read only the target's adjoint)."""
    return tuple(o.name for o in p.inputs if o.name in p.elementwise_grads and o.dims[-1] == "dv")


def beta_gradient(p: Plan) -> bool:
    """Whether the backward forms a gain's gradient dβ: the delta family's β role (absent where the gain is 1, as in
    gdn2, whose gains sit in its erase key and target instead), or the additive family's gain."""
    if p.family == "tied":
        return "beta" in dict(p.roles)
    return p.family == "additive" and p.structure.gain != "none"


def gate_gradient(p: Plan) -> bool:
    """Whether the backward forms the log-gate's gradient: a decay whose gate reads an input or param (RetNet's
    const(1 − 2^(−5 − h)) reads none: its gradient would go nowhere). A per-channel decay's gradient is formed by
    bwd_intra and bwd_grads together and is kept whatever its gate reads."""
    if p.structure.decay == "none":
        return False
    if p.structure.decay == "vector":
        return True
    names = {o.name for o in p.inputs}
    return any(x.name in names for x in getattr(p.role("g"), "free_symbols", ()))


def direct_gate_input(p: Plan) -> str | None:
    """The input whose gradient bwd_grads stores itself because it is the log gate's: a per-channel decay (tied or
    additive family) whose log gate is one key-channel token input that nothing else reads and that is not
    normalised. One block of key channels holds that adjoint whole (the gate's cumsum runs within the chunk, channel
    by channel), so its fp32 [T, HV, dk] tile need not go to memory for bwd_inputs to read back and cast: kda's
    bwd_inputs was 0.071 ms of a 3.917 ms step, most of it that round trip (H100, run 99). Under a diagonal
    preconditioner too: pkda's bwd_grads (k̃ and two key adjoints, 255 registers at BK 64 / 8 warps) spilled 24 B with
    it (compile report, sm_90, dk = 128) while it measured faster (H100, run 106: bwd_inputs 0.215 → 0.143 ms,
    bwd_grads 1.046 → 1.040; pkda's step 4.646 → 4.552 in run 108); reading k̃ again for a's share of the gate's
    gradient (chunk_bwd_grad.jinja) leaves no spill, untimed as such."""
    if p.structure.decay != "vector" or p.family == "untied":
        return None
    g = p.role("g")
    if not getattr(g, "is_Symbol", False):
        return None
    d = next((o for o in p.inputs if o.name == g.name), None)
    if d is None or d.dims[:2] != ("B", "T") or d.dims[-1] != "dk" or d.name in p.structure.normalize:
        return None
    others = {x.name for n, e in p.roles if n != "g" for x in getattr(e, "free_symbols", ())}
    return None if d.name in others else d.name


def _bwd_solve(p: Plan) -> Stage | None:
    # Once per chunk and head, over the value channels: everything bwd_grads needs that is a c×c product or a sum over
    # all the key channels. dY and the decayed pair gradients go to memory in the input dtype (bwd_grads' products
    # round their operands to it anyway: its results are the fused kernel's); the per-token c×c shares of dβ and db
    # go in fp32, added by bwd_grads' first key block. bwd_grads then reads dY where it read dU.
    if not _solve_split(p):
        return None
    decays = p.structure.decay != "none"
    grads = gate_gradient(p)
    dbeta = beta_gradient(p)
    outs = [Operand("dY", "[B,T,HV,dv]", "in"), Operand("dSg", MATRIX, "in"), Operand("dLg", MATRIX, "in")] + \
        ([Operand("dbeta_c", "[B,T,HV]", "fp32")] if dbeta else [])
    if grads:
        outs += [Operand("db_s", "[B,T,HV]", "fp32"), Operand("db_l", "[B,T,HV]", "fp32")]
    if "dz" in stored_adjoints(p):
        outs.append(Operand("dz", "[B,T,HV,dv]", "fp32"))
    outs += [Operand(f"grad_{o.name}", o.shape, "in") for o in p.inputs if o.name in _value_grads(p)]
    form = "dS = scale mask(dO U^T); dY = Ai^T dU, dZ = beta dY" + (" + dR" if p.structure.route != "none" else "") + \
        ", dM = -dY U^T, dL' = beta dM" + ("; dbeta_c = sum dY Z + sum dM L'" if dbeta else "")
    if residual_solve(p):  # T = (I + L' Diag(beta))^-1, U = beta R (R stored)
        form = "dS = scale mask(dO U^T); dY = T^T (beta dU + dR), dZ = dY, dN = -dY R^T, dL' = dN Diag(beta)" + \
            ("; dbeta_c = sum dU R + column sums of dN L'" if dbeta else "")
    form += ("; db_s, db_l = rows - columns of dS S, dL' L'" if grads else "") + \
        "; dSg = dS" + (" Gamma, dLg = dL' Gamma (Gamma = e^(b_i - b_j))" if decays else ", dLg = dL'") + \
        "; dY, dSg, dLg in the input dtype"
    reads = ("state_pass.U", "triangular_solve.Tm") + (("chunk_cumsum.b",) if decays else ())
    attrs: tuple[tuple[str, Any], ...] = (("form", form), ("reads", reads),
                                          ("forms", "L'" + (" and Q*A" if grads else "") +
                                           " over the key channels, once per chunk"))
    if _value_grads(p):
        attrs += (("fused", "bwd_inputs for " + ", ".join(f"grad_{n}" for n in _value_grads(p))),)
    ins = ("dO", "dU") + (("dR",) if p.structure.route != "none" else ())
    return Stage("bwd_solve", "bwd_solve", ins, tuple(outs), attrs)


def _bwd_grads(p: Plan) -> Stage | None:
    shapes = {"dqp": "[B,T,HV,dk]", "dkw": "[B,T,HV,dk]", "dz": "[B,T,HV,dv]", "dke": "[B,T,HV,dk]", "dkf": "[B,T,HV,dk]"}
    if p.family == "untied":
        outs = [Operand(name, shapes[name], "fp32") for name in stored_adjoints(p)]
        outs += [Operand(f"grad_{o.name}", o.shape, "in") for o in p.inputs if o.name in p.elementwise_grads]
        outs.append(Operand("dg", "[B,T,HV,dk]", "fp32"))
        excl = p.structure.erase_reads == "undecayed"
        form = "dY = T^T dU; dq, de, df, dw = per-token terms + pair shares; dV' = dV_state + scale Aqw^T dO + Aew^T dY; " + \
            "dg = reverse cumsum of db" + (" + strict reverse cumsum of dbx = e de" if excl else "")
        attrs: tuple[tuple[str, Any], ...] = (("form", form), ("reads", ("state_pass.Hn", "state_pass.U",
                                                                          "triangular_solve.Tm", "interaction.Aew",
                                                                          "interaction.Aqw")))
        if p.elementwise_grads:
            attrs += (("fused", "bwd_inputs for " + ", ".join(f"grad_{n}" for n in p.elementwise_grads)),)
        ins = ("dO", "dHn1", "dU", "dVs", "dq_pair", "de_pair", "df_pair", "da_pair", "db_pair")
        return Stage("bwd_grads", "bwd_grads", ins, tuple(outs), attrs)
    delta = p.family == "tied"
    vec = p.structure.decay == "vector"
    split = _solve_split(p)
    once = value_side_once(p)
    # bwd_solve or (per-channel decay) bwd_scores forms the target's adjoint and the value inputs' gradients
    mine = [n for n in p.elementwise_grads if not (once and n in _value_grads(p))]
    outs = [Operand(name, shapes[name], "fp32") for name in stored_adjoints(p) if not (once and name == "dz")]
    outs += [Operand(f"grad_{o.name}", o.shape, "in") for o in p.inputs if o.name in mine]
    if beta_gradient(p):
        outs.append(Operand("dbeta", "[B,T,HV]", "fp32"))
    grads = gate_gradient(p)
    direct = direct_gate_input(p)
    if direct:  # the log gate's input gradient, stored here in the input dtype (direct_gate_input)
        outs.append(Operand(f"grad_{direct}", "[B,T,HV,dk]", "in"))
    elif grads:
        outs.append(Operand("dg", "[B,T,HV,dk]" if vec else "[B,T,HV]", "fp32"))
    # per-token sums over the key channels, which each block of them leaves as a partial (codegen/address.py)
    partials = [o.name for o in outs if o.dims == ("B", "T", "HV")]
    reads = ("state_pass.Hn", "state_pass.U")
    if vec:  # the c×c parts came from bwd_scores and bwd_intra
        form = ("dW = dY H^T (dY from bwd_scores); " if delta else "dZ = beta dU; ") + \
            "adds the pair gradients of bwd_intra; dg = reverse cumsum of db"
    elif split:  # the c×c parts came from bwd_solve
        form = "dW = dY H^T; score pairs from dSg, dLg as matmuls with this block's keys" + \
            ("; dg = reverse cumsum of db" if grads else "")
    else:
        form = "dZ = beta dU; score pairs as masked matmuls" + ("; dg = reverse cumsum of db" if grads else "")
    attrs: tuple[tuple[str, Any], ...] = (("form", form), ("reads", reads))
    if partials:
        attrs += (("partial_sums", tuple(partials)),)
    if mine or direct:
        # the chain rule to these inputs is elementwise: applied where the adjoints are formed, so their fp32
        # per-token adjoints never go to memory
        attrs += (("fused", "bwd_inputs for " + ", ".join(f"grad_{n}" for n in mine + ([direct] if direct else []))),)
    ins = ("dO", "dHn1") + (() if once else ("dU",)) + \
        (("dR",) if p.structure.route != "none" and not once else ())
    if vec:
        ins += (("dY",) if delta else ()) + ("dq_pair", "da_pair", "db_pair") + \
            (("dbeta_c",) if delta and beta_gradient(p) else ()) + (("de_pair",) if delta and not tied_keys_of(p) else ())
    if split:
        ins += ("dY", "dSg", "dLg") + (("dbeta_c",) if beta_gradient(p) else ()) + (("db_s", "db_l") if grads else ())
    return Stage("bwd_grads", "bwd_grads", ins, tuple(outs), attrs)


def _centered(p: Plan) -> bool:
    return bool(p.find("curvature_query")[0].attr("centered"))


def _bwd_curvature_sums(p: Plan) -> Stage | None:
    # C_n (and m_n) re-formed as the forward formed them (its curvature_state kernel), where bwd_curvature_query reads
    # them: C_n is dk·dk per other chunk and key head (134 MB at the reference shape), so neither kept from the forward nor
    # rerun with the forward's stages at the backward's start, where it would be live across the chunk gradients' peak
    if not p.find("curvature_state"):
        return None
    outs = (Operand("Cn_b", "[B,NT,H,dk,dk]", "fp32"),) + \
        ((Operand("m_n_b", "[B,NT,H,dk]", "fp32"),) if _centered(p) else ())
    return Stage("bwd_curvature_sums", "bwd_curvature_sums", (), outs,
                 (("form", "curvature_state rerun: C_(n+1) = C_n + K^T K; m_(n+1) = m_n + K^T 1"),
                  ("reforms", "curvature_state"), ("sequential", "chunks"),
                  ("tiles", "BK rows x BV columns of C per sequence and key head")))


def _bwd_curvature_query(p: Plan) -> Stage | None:
    # Per chunk, in parallel, from the re-formed C_n; it needs the adjoint of q̂, so it runs after bwd_grads. The sums
    # are per key head: so is their share of dq (bwd_inputs adds it to the group's first value head), and S, which the
    # later passes read.
    if not p.find("curvature_query"):
        return None
    centered = _centered(p)
    outs = (Operand("dq_c", "[B,T,H,dk]", "fp32"), Operand("dlam", "[B,T,HV]", "fp32"),
            Operand("S_hi", "[B,T,H,dk]", "in"), Operand("S_lo", "[B,T,H,dk]", "in"))
    if centered:  # for the reverse pass, which carries no m
        outs += (Operand("ms", "[B,T,H]", "fp32"),)
    form = "S = sum_hv (lam_hv / tau) dqp_hv = S_hi + S_lo; dq_c = -(S C_n + tril(S K^T) K)" + \
        (" + M (m^T S) / tau" if centered else "") + "; dlam = -<dqp, corr>"
    attrs: tuple[tuple[str, Any], ...] = (("form", form), ("tiles", "BV columns of C per chunk and key head"),
                                          ("partial_sums", ("dlam",)))
    # corr as the forward formed it
    attrs += (("reads", ("curvature_query.corr",)),)
    ins = ("dqp", "Cn_b") + (("m_n_b",) if centered else ())
    return Stage("bwd_curvature_query", "bwd_curvature_query", ins, outs, attrs)


def _bwd_curvature_carry(p: Plan) -> Stage | None:
    # The sums' adjoint: dC_t = -S_t q_t^T is summed from the end (the keys' share is an anti-causal linear attention
    # with E = D + D^T). D = dC_final + the later dC_t couples no rows: a reverse pass of [BK, BV] tiles whose only
    # products are its tile's update, storing every chunk's D (1024 B per token and head, after the chunk gradients'
    # peak) for the chunk-parallel bwd_curvature_key, and ending at dC0 (a launch of its own before: it ran wherever C0
    # had a gradient, under CP in every slice but the first). As one reverse pass carrying E with the in-chunk products
    # inside it: 0.40 ms of ccq_gdn's 3.4 ms step (H200, run 86)
    if not p.find("curvature_query"):
        return None
    centered = _centered(p)
    outs = (Operand("Dn_b", "[B,NT,H,dk,dk]", "fp32"),) + \
        ((Operand("dmc_b", "[B,NT,H,dk]", "fp32"),) if centered else ()) + \
        (Operand("dC0", "[N,H,dk,dk]", "fp32"), Operand("dm0", "[N,H,dk]", "fp32"))
    form = "D_n = D before chunk n's terms, D = dC_final; D -= (S_hi + S_lo)^T Q; dC0 = D at the start" + \
        ("; dm_c before chunk n, dm_c = dm_final; dm_c += sum_t dm_t, dm_t = (S m^T q + q m^T S) / tau" if centered
         else "; dm0 = dm_final")
    ins = ("S_hi", "S_lo", "dC_final", "dm_final") + (("ms",) if centered else ())
    attrs: tuple[tuple[str, Any], ...] = (("form", form), ("sequential", "chunks, reversed"),
                                          ("tiles", "BK rows x BV columns of D per sequence and key head"))
    if centered:
        attrs += (("reads", ("curvature_query.mq",)),)
    return Stage("bwd_curvature_carry", "bwd_curvature_carry", ins, outs, attrs)


def _bwd_curvature_key(p: Plan) -> Stage | None:
    # per chunk, in parallel, from the carry's E_n (and dm_c)
    if not p.find("curvature_query"):
        return None
    centered = _centered(p)
    form = "dk_c = K E_n - triu(K Q^T) S - triu(K S^T) Q + dm_c, E_n = D_n + D_n^T" + \
        (" + reverse cumsum of dm_t in the chunk" if centered else "")
    ins = ("S_hi", "Dn_b") + (("S_lo", "ms", "dmc_b") if centered else ("dm_final",))
    attrs: tuple[tuple[str, Any], ...] = (("form", form), ("tiles", "BV columns of E per chunk and key head"))
    if centered:
        attrs += (("reads", ("curvature_query.mq",)),)
    return Stage("bwd_curvature_key", "bwd_curvature_key", ins, (Operand("dk_c", "[B,T,H,dk]", "fp32"),), attrs)


def precond_shares(p: Plan) -> tuple[tuple[str, bool], ...]:
    """The inputs that the PDN statistic's two local parts read: k̃ = map(A) ⊙ k (k, the map's inputs) and the
    increment (`p_inc`), each with whether its share is a key tile (the input has key channels) rather than a per-token
    sum over them (a per-token input, a per-head param, a channel reduction). bwd_precond_diag holds A and both parts'
    adjoints (dk̃ summed over the value heads, and the increment's, the reverse scan's output), so it forms each such
    input's share of its gradient there: bwd_inputs reads one share per input instead of A_t, dk̃ and the increment's
    adjoint (three fp32 key tiles per token), and no longer evaluates the map's transcendentals again. Sorted by name."""
    st = p.find("precond_diag")
    if not st:
        return ()
    exprs = (st[0].attr("map"), p.role("p_inc"))
    names = {"k"} | {x.name for e in exprs for x in e.free_symbols}
    dims = {o.name: o.dims for o in p.inputs}
    return tuple((x, "dk" in dims.get(x, ())) for x in sorted(names - {KTILDE.name, STAT.name, HEAD_INDEX.name}))


def _bwd_precond_diag(p: Plan) -> Stage | None:
    if not p.find("precond_diag"):
        return None
    heads = "H" if p.find("precond_diag")[0].attr("heads") == "key" else "HV"
    # an input's share: a key tile per token where the input has key channels, else its sum over this program's key
    # channels (a per-token partial sum per block of them, as the decay's adjoint)
    shares = tuple(Operand(f"dpre_{x}", f"[B,T,{heads},dk]" if key else f"[B,T,{heads}]", "fp32")
                   for x, key in precond_shares(p))
    outs = (Operand("ddec", f"[B,T,{heads}]", "fp32"), Operand("dA0", f"[N,{heads},dk]", "fp32")) + shares
    form = "A = e^c A_n + Lambda (stat) per chunk; dinc = reverse decayed cumsum of the statistic's adjoint; " \
        "dpre_x = d(map(A) k)/dx dkw + d(inc)/dx dinc"
    partials = tuple(o.name for o in outs if o.dims == ("B", "T", heads))
    return Stage("bwd_precond_diag", "bwd_precond_diag", ("dkw", "dA_final"), outs,
                 (("form", form), ("reads", ("precond_diag.An",)), ("sequential", "chunks, reversed"),
                  ("partial_sums", partials)))


def _bwd_precond_exact(p: Plan) -> Stage | None:
    if not p.find("precond_exact"):
        return None
    atk = p.find("precond_exact")[0].attr("placement") == "write_key"
    outs = (Operand("dk_x", "[B,T,H,dk]", "fp32"),) + (() if atk else (Operand("dq_x", "[B,T,H,dk]", "fp32"),)) + \
        (Operand("u_x", "[B,T,H,dk]", "fp32"), Operand("dGc", "[B,NT,H,dk,dk]", "fp32"),
         Operand("dPa", "[B,NT,H,dk,dk]", "fp32"))
    form = "x = P_t a_t, z = P_t dx_t (" + ("a = k, dx = dkw" if atk else "a = q, dx = dqp") + \
        "); dGc = -Z^T X; in-chunk 2 sym(Psi_t) k_t = -(triu(K X^T) Z + triu(K Z^T) X)"
    return Stage("bwd_precond_exact", "bwd_precond_exact", ("dkw" if atk else "dqp",), outs,
                 (("form", form), ("reads", ("precond_gram.Gn",))))


def _bwd_precond_gram(p: Plan) -> Stage | None:
    if not p.find("precond_exact"):
        return None
    outs = (Operand("dk_g", "[B,T,H,dk]", "fp32"), Operand("dP0", "[N,H,dk,dk]", "fp32"))
    form = "Psi = -P_T dP_final P_T; reverse over chunks: dk += 2 K sym(Psi), Psi += dGc; " \
        "dP0 = -G_0 sym(Psi) G_0 + antisym(dP_final + sum dPa + sum (G_t u_t) k_t^T)"
    return Stage("bwd_precond_gram", "bwd_precond_gram", ("dk_x", "u_x", "dGc", "dPa", "dP_final"), outs,
                 (("form", form), ("reads", ("precond_gram.Gn", "precond_gram.P_final")),
                  ("sequential", "chunks, reversed")))


def _bwd_inputs(p: Plan) -> Stage | None:
    # the exact preconditioner's per-chunk stage leaves the Gram pass its intermediates; bwd_inputs reads dq_x, dk_g
    # (and the curvature's forward-direction pass leaves the later ones S and m^T S)
    inner = {"dk_x", "u_x", "dGc", "dPa", "S_hi", "S_lo", "ms", "Cn_b", "m_n_b", "Dn_b", "dmc_b", "dY", "dSg", "dLg",
             "dbeta_c", "db_s", "db_l"}
    adj = [o.name for st in (_bwd_solve(p), _bwd_grads(p), _bwd_curvature_sums(p), _bwd_curvature_query(p),
                             _bwd_curvature_carry(p), _bwd_curvature_key(p), _bwd_precond_diag(p), _bwd_precond_exact(p),
                             _bwd_precond_gram(p))
           if st is not None
           for o in st.outputs if o.dims[0] == "B" and not o.name.startswith("grad_") and o.name not in inner]
    states = {name for name, _ in _STATE_OPERANDS.values()}
    outs = tuple(Operand(f"grad_{o.name}", o.shape, "in") for o in p.inputs
                 if o.name not in states and o.name not in p.elementwise_grads and o.name != direct_gate_input(p))
    if not outs:
        return None  # bwd_grads finished every gradient
    return Stage("bwd_inputs", "bwd_inputs", tuple(adj), outs,
                 (("form", "d x = sum over parts of (d part / d x) * adjoint (sympy), then the L2-norm backward"),))


# Order is launch order; each rule decides from the forward plan whether its stage appears.
BACKWARD_RULES: tuple[Callable[[Plan], Stage | None], ...] = (
    _bwd_local_values, _bwd_state_pass, _bwd_values, _bwd_scores, _bwd_intra, _bwd_solve, _bwd_grads, _bwd_curvature_sums,
    _bwd_curvature_query, _bwd_curvature_carry, _bwd_curvature_key, _bwd_precond_diag, _bwd_precond_exact,
    _bwd_precond_gram, _bwd_inputs,
)


def build_backward_plan(plan: Plan) -> BackwardPlan | None:
    """The chunked backward of `plan`, or None where no chunk backward exists (the untied DPLR family without a
    per-channel decay keeps the recurrent backward). What it keeps and what it recomputes: `memory_model`."""
    if plan.family == "untied" and plan.structure.decay != "vector":
        return None
    stages = tuple(st for rule in BACKWARD_RULES if (st := rule(plan)) is not None)
    memory = memory_model(plan, stages)
    kept = tuple(m.kind for m in memory if not m.recompute and m.reformed_by is None)
    recomputed = tuple(m.kind for m in memory if m.recompute)
    bp = BackwardPlan(plan.name, tuple(o.name for o in plan.inputs), recomputed, stages, kept,
                      sum(m.kept_bytes for m in memory), memory)
    typecheck_backward(plan, bp)
    return bp


# --- the memory model: what the backward keeps from the forward, what it forms again, and why -----------------------
# The backward runs in three phases, in launch order: the state passes (the forward's state pass rerun, bwd_local_values,
# the reverse state pass); the chunk gradients (bwd_scores, bwd_intra, bwd_solve, bwd_grads), where H_n, dH_n, dU, the
# score and pair gradients and the chunk-operand adjoints are all live: the step's peak; the chain rule (the preconditioner's
# and the curvature read's reverse passes, bwd_inputs). The host frees every buffer after the last kernel that reads
# it, the kept ones too (the eager path hands them to the backward), so a kept output costs memory at the peak
# exactly when a stage at or after the chunk gradients reads it; what only the state passes read is gone by then,
# kept or recomputed, and recomputing it shortens only what a training forward holds until its backward (per layer,
# in a model).
BACKWARD_PHASES = ("state passes", "chunk gradients", "chain rule")
PHASE_OF = {"bwd_local_values": 0, "bwd_state_pass": 0, "bwd_scores": 1, "bwd_intra": 1, "bwd_solve": 1, "bwd_grads": 1,
            "bwd_curvature_sums": 2, "bwd_curvature_query": 2, "bwd_curvature_carry": 2, "bwd_curvature_key": 2,
            "bwd_precond_diag": 2, "bwd_precond_exact": 2, "bwd_precond_gram": 2, "bwd_inputs": 2}
PEAK_PHASE = 1

# What rerunning a forward stage in the backward costs, cheapest first: evaluated on its consumers' tile loads (no
# launch, nothing stored); one elementwise pass over its inputs; per-chunk matmuls; per-chunk matmuls and the 16×16
# triangular solve; a scan along the sequence (sequential over chunks, parallel over heads and channels); the state
# pass (sequential over chunks with a dk × dv carry). H200, reference shape (benchmarks/latest.json, pgdn / pkda):
# l2norm 0.065 ms, wy 0.085 / 0.122, interaction 0.136 / 0.698, precond_diag 0.33, state pass 0.42 / 0.34 (two calls).
RECOMPUTE_COSTS = ("loads", "elementwise", "chunk_matmul", "chunk_solve", "scan", "state_pass")
# (the output: its stored scores, formed again only with a state pass)
RECOMPUTE_COST = {"output": "state_pass",
                  "gates": "loads", "l2norm": "elementwise", "chunk_cumsum": "elementwise", "decay_keys": "elementwise",
                  "wy": "chunk_matmul", "precond_exact": "chunk_matmul", "interaction": "chunk_solve",
                  "triangular_solve": "chunk_solve", "precond_diag": "scan", "precond_gram": "scan",
                  "curvature_state": "scan", "curvature_query": "chunk_matmul", "state_pass": "state_pass"}

# The last backward phase that reads a forward operand: the WY operands (W: the reverse state pass; Ũ: the rerun of
# the forward's), the decayed keys (the state passes) and the decayed scores Q⋆A (bwd_local_values) only the state
# passes; every other operand is read by the chunk gradients or later. Keyed by operand name (one the builder suffixed
# with "_", to avoid a spec input's name, by its base). tests/test_plan_launch.py holds this against the operands of
# the generated kernels.
LAST_READ_PHASE = {"W": 0, "Ut": 0, "Kg": 0, "Qg": 0, "Fg": 0, "Sqa": 0, "Sc": 0}


def last_read_phase(p: Plan, sts: list[Stage], read: set[str]) -> int:
    """The last backward phase reading the stored outputs of a forward stage kind (of all its outputs where none is
    stored)."""
    outs = [o for st in sts for o in st.outputs if stored(p, st, o, read)] or [o for st in sts for o in st.outputs]
    return max(LAST_READ_PHASE.get(o.name.rstrip("_"), PEAK_PHASE) for o in outs)


@dataclass(frozen=True)
class MemoryDecision:
    """What the backward does with one forward stage kind's outputs. kept: the operands a training forward returns
    for the backward (all of them per token or per chunk, priced by bytes_per_token); recompute: the backward reruns
    the stage's launch instead; reformed_by: a backward stage forms the outputs again where it reads them (neither
    kept nor rerun); why: the rule that decided."""

    kind: str
    cost: str
    kept: tuple[Operand, ...]
    recompute: bool
    why: str
    last_read: int
    reformed_by: str | None = None

    @property
    def kept_bytes(self) -> int:
        return sum(bytes_per_token(o) for o in self.kept)


def stored(p: Plan, st: Stage, o: Operand, read: set[str]) -> bool:
    """Whether a forward stage's output exists in memory at all. Not where it is evaluated on its consumers' loads or
    accumulated inside its consumer's scan (the statistic's decay cumsum; the decay's cumsum formed at the start of
    the interaction's launch is stored there: _cumsum_in_interaction); not the exclusive cumsum b_(t-1) (the
    kernels read b one token earlier); not a matrix whose every consumer runs inside its producer's launch and that
    no backward stage reads back (L' or E⋆⁻F: the fused solve takes its blocks from registers; bwd_solve re-forms
    a scalar-decay L' from the keys); not a final state (a result)."""
    if st.attr("fused") == "loads" or (st.kind == "chunk_cumsum" and st.attr("fused") == "precond_diag") or \
            o.dims[0] == "N":
        return False
    if st.kind == "chunk_cumsum" and o is not st.outputs[0]:
        return False
    consumers = [c for c in p.stages() if o.name in c.inputs]
    in_launch = consumers and all(c.attr("fused") == st.kind for c in consumers)
    return not (in_launch and f"{st.kind}.{o.name}" not in read)


def _per_chunk(p: Plan, sts: list[Stage], rerun: set[str], read: set[str]) -> str | None:
    big = [o for st in sts for o in st.outputs if o.dims[:2] == ("B", "NT") and o.dims[-2:] in (("dk", "dv"), ("dk", "dk"))]
    if big:
        o = big[0]
        why = (f"its per-chunk {o.name} ({bytes_per_token(o)} B, {'×'.join(o.dims[-2:])} per chunk and head) would "
               "outweigh any per-token buffer: rerun for the reverse passes")
        if sts[0].kind == "state_pass":  # the call's choice, as FLA's disable_recompute
            why += (f"; a call's keep_states=True keeps {' and '.join(x.name for x in kept_states(p))} instead "
                    f"({kept_states_bytes(p)} B), one launch less")
            if rerun_reads_route(p):
                why += "; the rerun reads R from the training forward's route output (rerun_reads_route)"
        return why
    feeds = [i for st in sts for i in st.inputs
             if (q := p.producer(i)) is not None and q.kind in rerun and q.out(i).dims[:2] == ("B", "NT")]
    if feeds:
        return f"it reads {feeds[0]}, which the backward forms again: rerun after it"
    return None


def _on_loads(p: Plan, sts: list[Stage], rerun: set[str], read: set[str]) -> str | None:
    if all(st.attr("fused") == "loads" for st in sts):
        return "evaluated on every consumer's tile loads: never stored"
    return None


def _kept(p: Plan, sts: list[Stage], rerun: set[str], read: set[str]) -> str:
    kind = sts[0].kind
    cost = RECOMPUTE_COST[kind]
    if not any(stored(p, st, o, read) for st in sts for o in st.outputs):
        again = (f": bwd_solve re-forms {sts[0].outputs[0].name} from the keys (one masked product per chunk)"
                 if kind == "interaction" else "")
        return f"{cost}, not rerun; nothing of it is stored{again}"
    carries = [o for st in sts for o in st.outputs if o.dims[:2] == ("B", "NT") and len(o.dims) == 4]
    if carries and kind == "precond_diag":
        return (f"{cost}: kept; its per-token statistic is not: the carries {carries[0].name} "
                f"({bytes_per_token(carries[0])} B) at each chunk's start let bwd_precond_diag re-form it, after the "
                "peak, where only the chain rule reads it")
    if last_read_phase(p, sts, read) < PEAK_PHASE:
        # freed before the peak whether kept or rerun: a rerun would only shorten what a training forward holds until
        # its backward (per layer, in a model), and every launch costs a pass over HBM (decay_keys: ~0.1 ms of kda's
        # 4.3 ms step); a per-model memory budget would be the place to trade that
        return f"{cost}: read only by the state passes, freed before the peak whether kept or rerun: kept (no launch)"
    if cost == "elementwise":
        return "elementwise, but read by the chunk gradients or later: rerun, it would be live at the peak too: kept"
    return f"{cost}: read at the peak or later, and rerunning costs more than holding it: kept"


# Ordered: the first rule that decides (returns why) recomputes the stage; a stage no rule recomputes is kept.
MEMORY_RULES: tuple[Callable[[Plan, list[Stage], set[str], set[str]], str | None], ...] = (_on_loads, _per_chunk)


def memory_model(plan: Plan, stages: tuple[Stage, ...]) -> tuple[MemoryDecision, ...]:
    """Per forward stage kind, in the plan's order: keep or recompute, the kept operands and why. The output is a
    result, not an operand of the backward, except for the scores a training forward stores (scores_kept)."""
    read = {r for st in stages for r in st.attr("reads", ())}
    reformed = {st.attr("reforms"): st.kind for st in stages if st.attr("reforms")}
    rerun: set[str] = set()
    out = []
    for kind in dict.fromkeys(k for k in plan.kinds() if k != "output" or scores_kept(plan)):
        sts = plan.find(kind)
        kept: tuple[Operand, ...] = ()
        if kind == "output":
            kept = tuple(o for st in sts for o in st.outputs if f"{kind}.{o.name}" in read)
            out.append(MemoryDecision(kind, RECOMPUTE_COST[kind], kept, False,
                                      "state_pass: its scores, read only by the reverse state pass, which would form "
                                      "them again in every value block: kept (compiler/plan.py: _scores_kept)",
                                      max(LAST_READ_PHASE.get(o.name, PEAK_PHASE) for o in kept)))
            continue
        if kind in reformed:
            # a backward stage forms its outputs again where they are read (after the peak): neither kept nor rerun
            out.append(MemoryDecision(kind, RECOMPUTE_COST[kind], kept, False,
                                      f"{RECOMPUTE_COST[kind]}: formed again by {reformed[kind]} where it is read, "
                                      "after the peak: not kept, not rerun", PEAK_PHASE + 1, reformed[kind]))
            continue
        why = next((w for rule in MEMORY_RULES if (w := rule(plan, sts, rerun, read)) is not None), None)
        if why is not None:
            rerun.add(kind)
        else:
            why = _kept(plan, sts, rerun, read)
            kept = tuple(o for st in sts for o in st.outputs if stored(plan, st, o, read))
            if kind == "wy" and rerun_reads_route(plan):
                # only the rerun of the state pass read Ũ, and it reads R from the route instead: a backward without
                # the route (a direct chunk_backward call, not given it) reruns wy as well (rerun_without_route)
                kept = tuple(o for o in kept if o.name.rstrip("_") != "Ut")
                why += "; Ũ is not: the rerun of the state pass reads R from the route (rerun_reads_route)"
        out.append(MemoryDecision(kind, RECOMPUTE_COST[kind], kept, kind in rerun, why, last_read_phase(plan, sts, read)))
    return tuple(out)


def kept_outputs(plan: Plan, bp: BackwardPlan) -> list[tuple[Stage, tuple[Operand, ...]]]:
    """Per forward stage the backward keeps, the outputs a training forward returns for it (their bytes per token sum
    to `bp.kept_bytes`)."""
    kept = {o.name for m in bp.memory for o in m.kept}
    return [(st, tuple(o for o in st.outputs if o.name in kept)) for st in plan.stages() if st.kind in bp.kept]


_DIM_AT_REFERENCE = {"dk": 128, "dv": 128, "C": 64}


# the state pass's outputs the backward reads (the route r is an output beside o, not read back)
STATE_PASS_READ_BACK = ("Hn", "U")


def kept_states(p: Plan) -> list[Operand]:
    """The state pass's outputs a training forward keeps on request (keep_states; FLA's disable_recompute) instead of
    the backward's rerun of the state pass: H_n, and U where the state pass outputs it (the additive family forms
    U = β Z on its loads)."""
    return [o for o in p.stage("state_pass").outputs if o.name in STATE_PASS_READ_BACK]


def kept_states_bytes(p: Plan) -> int:
    """What keep_states adds per token and head at dk = dv = 128 (the memory model's prices)."""
    return sum(bytes_per_token(o) for o in kept_states(p))


def bytes_per_token(op: Operand) -> int:
    """Bytes per token and head of a token-level or per-chunk operand at dk = dv = 128 (2 for "in": bf16, 4 for fp32);
    a per-chunk operand counts its values over the chunk's C tokens (a C×C matrix: C per token; H_n: dk·dv / C);
    0 for per-sequence operands (final states)."""
    d = op.dims
    if d[:2] == ("B", "T"):
        n, per = 1, 1
    elif d[:2] == ("B", "NT"):
        n, per = 1, _DIM_AT_REFERENCE["C"]
    else:
        return 0
    for x in d[3:]:
        n *= _DIM_AT_REFERENCE.get(x, 1)
    return n * (2 if op.dtype == "in" else 4) // per


def typecheck_backward(plan: Plan, bp: BackwardPlan) -> None:
    """Every adjoint a stage consumes is given or produced by an earlier stage; every `reads` names a stage of
    the forward plan that the backward recomputes."""
    have = {"dO", "dR", "dS_final", "dA_final", "dP_final", "dC_final", "dm_final"}
    for st in bp.stages:
        if st.kind not in BACKWARD_KINDS:
            raise PlanTypeError(f"{st.name}: unknown backward stage kind {st.kind!r}")
        for i in st.inputs:
            if i not in have:
                raise PlanTypeError(f"{plan.name}: backward stage {st.name} consumes `{i}`, which nothing produces")
        for r in st.attr("reads", ()):
            kind = r.split(".")[0]
            if kind not in plan.kinds():
                raise PlanTypeError(f"{plan.name}: backward stage {st.name} reads `{r}`, but the plan has no {kind}")
        have |= set(st.output_names)


# --- typechecking (abstract evaluation of shapes, one rule per kind) -----------------------------------
HEADS = ("H", "HV")


def _token(op: Operand, last: str | None = None, what: str = "") -> None:
    d = op.dims
    ok = len(d) >= 3 and d[:2] == ("B", "T") and d[2] in HEADS or (len(d) >= 1 and d[0] in HEADS) or d == ()
    if not ok:
        raise PlanTypeError(f"{what}: operand {op} is not a token-level or per-head operand")
    if last is not None and (not d or d[-1] != last):
        raise PlanTypeError(f"{what}: operand {op} must end with {last}")


def _tc_l2norm(st: Stage, t: dict[str, Operand]) -> None:
    for i, o in zip(st.inputs, st.outputs, strict=True):
        if t[i].shape != o.shape:
            raise PlanTypeError(f"{st.name}: {o} must have the shape of {t[i]}")


def _tc_gates(st: Stage, t: dict[str, Operand]) -> None:
    for o in st.outputs:
        _token(o, what=st.name)


def _tc_chunk_cumsum(st: Stage, t: dict[str, Operand]) -> None:
    (g,) = st.inputs
    gd = t[g].dims
    for o in st.outputs:
        if o.dtype != "fp32" or o.dims[:2] != ("B", "T") or (gd[-1:] == ("dk",)) != (o.dims[-1] == "dk"):
            raise PlanTypeError(f"{st.name}: {o} is not the fp32 chunk cumsum of {t[g]}")


def _tc_precond(st: Stage, t: dict[str, Operand]) -> None:
    for i in st.inputs:
        if i in ("A0", "P0"):
            fin = st.outputs[1]
            if t[i].shape != fin.shape:
                raise PlanTypeError(f"{st.name}: initial {t[i]} and final {fin} differ")
    _token(st.outputs[0], "dk", st.name)


def _tc_precond_gram(st: Stage, t: dict[str, Operand]) -> None:
    _token(t[st.bind["k"]], "dk", st.name)
    if t["P0"].shape != st.outputs[1].shape or st.outputs[0].shape != "[B,NT,H,dk,dk]":
        raise PlanTypeError(f"{st.name}: P0 and P_final must agree, G_n be [B,NT,H,dk,dk]")


def _per_key_head(st: Stage, op: Operand) -> None:
    _token(op, "dk", st.name)
    # the sums, and every pass over them, are tiled per key head (λ alone is per value head)
    if op.dims[:3] != ("B", "T", "H"):
        raise PlanTypeError(f"{st.name}: {op} must be per key head: the curvature sums are")


def _tc_curvature_state(st: Stage, t: dict[str, Operand]) -> None:
    _per_key_head(st, t[st.bind["k"]])
    if st.outputs[0].shape != "[B,NT,H,dk,dk]":
        raise PlanTypeError(f"{st.name}: C_n {st.outputs[0]} must be [B,NT,H,dk,dk]")
    finals = st.outputs[-3:]
    for n, o in zip("Cmn", finals, strict=True):
        if t[f"{n}0"].shape != o.shape:
            raise PlanTypeError(f"{st.name}: {n}0 and {n}_final differ")


def _tc_curvature(st: Stage, t: dict[str, Operand]) -> None:
    for r in ("q", "k"):
        _per_key_head(st, t[st.bind[r]])
    if t[st.bind["Cn"]].shape != "[B,NT,H,dk,dk]":
        raise PlanTypeError(f"{st.name}: C_n {t[st.bind['Cn']]} must be [B,NT,H,dk,dk]")
    if st.outputs[0].shape != "[B,T,HV,dk]":
        raise PlanTypeError(f"{st.name}: the read query {st.outputs[0]} must be [B,T,HV,dk]")
    if st.outputs[1].shape != st.outputs[0].shape or st.outputs[1].dtype != st.outputs[0].dtype:
        raise PlanTypeError(f"{st.name}: q̂'s remainder {st.outputs[1]} must be typed as q̂ {st.outputs[0]}")


def _tc_interaction(st: Stage, t: dict[str, Operand]) -> None:
    for r, i in st.bind.items():
        if r in ("E", "A", "F", "Wk", "Q", "Q_lo"):
            _token(t[i], "dk", st.name)
        elif t[i].dims[:2] != ("B", "T") or t[i].dtype != "fp32":
            raise PlanTypeError(f"{st.name}: the decay {t[i]} must be an fp32 chunk cumsum")
    for o in st.outputs:
        if o.shape != "[B,NT,HV,C,C]":
            raise PlanTypeError(f"{st.name}: {o} must be [B,NT,HV,C,C]")


def _tc_triangular_solve(st: Stage, t: dict[str, Operand]) -> None:
    if t[st.bind["L"]].shape != MATRIX or st.outputs[0].shape != MATRIX:
        raise PlanTypeError(f"{st.name}: the solve maps [B,NT,HV,C,C] to [B,NT,HV,C,C]")
    if "beta" in st.bind:
        i = st.bind["beta"]
        if t[i].dims[-1:] in (("dk",), ("dv",)):  # a constant gain (gain 0.5) has no dims
            raise PlanTypeError(f"{st.name}: the gain {t[i]} must be one number per token")


def _tc_wy(st: Stage, t: dict[str, Operand]) -> None:
    W, Ut = st.outputs
    if t[st.bind["T"]].shape != MATRIX:
        raise PlanTypeError(f"{st.name}: {t[st.bind['T']]} must be a per-chunk matrix")
    _token(t[st.bind["E"]], "dk", st.name)
    if W.dims[-1] != "dk" or Ut.dims[-1] != "dv":
        raise PlanTypeError(f"{st.name}: W must end with dk and Ũ with dv")


def _tc_decay_keys(st: Stage, t: dict[str, Operand]) -> None:
    for r in ("F", "A", "Q", "Q_lo", "b"):
        if r in st.bind:
            _token(t[st.bind[r]], "dk", st.name)
    for o in st.outputs:
        if o.shape != "[B,T,HV,dk]":
            raise PlanTypeError(f"{st.name}: {o} must be [B,T,HV,dk]")


def _tc_state_pass(st: Stage, t: dict[str, Operand]) -> None:
    for k, v in st.attr("streams"):
        _token(t[k], "dk", st.name)
        vt = st.out(v) if v in st.output_names else t[v]
        _token(vt, "dv", st.name)
    fin = st.outputs[-2] if st.attr("route") == "residual" else st.outputs[-1]
    if t["S0"].shape != fin.shape or fin.shape != "[N,HV,dk,dv]":
        raise PlanTypeError(f"{st.name}: S0 and S_final must both be [N,HV,dk,dv]")
    if not any(o.shape == "[B,NT,HV,dk,dv]" for o in st.outputs):
        raise PlanTypeError(f"{st.name}: Hn must be [B,NT,HV,dk,dv]")
    if "W" in st.bind and (t[st.bind["W"]].dims[-1] != "dk" or t[st.bind["Ut"]].dims[-1] != "dv"):
        raise PlanTypeError(f"{st.name}: W/Ũ shapes")


def _tc_output(st: Stage, t: dict[str, Operand]) -> None:
    _token(t[st.bind["Q"]], "dk", st.name)
    if t[st.bind["Hn"]].shape != "[B,NT,HV,dk,dv]" or st.outputs[0].shape != "[B,T,HV,dv]":
        raise PlanTypeError(f"{st.name}: O = Q' H_n + ... needs Hn [B,NT,HV,dk,dv] and gives [B,T,HV,dv]")
    for _, v in st.attr("scores"):
        _token(t[v], "dv", st.name)


TYPE_RULES: dict[str, Callable[[Stage, dict[str, Operand]], None]] = {
    "l2norm": _tc_l2norm, "gates": _tc_gates, "chunk_cumsum": _tc_chunk_cumsum, "precond_diag": _tc_precond,
    "precond_gram": _tc_precond_gram, "precond_exact": _tc_precond, "curvature_state": _tc_curvature_state,
    "curvature_query": _tc_curvature,
    "interaction": _tc_interaction,
    "triangular_solve": _tc_triangular_solve, "wy": _tc_wy, "decay_keys": _tc_decay_keys, "state_pass": _tc_state_pass,
    "output": _tc_output,
}


def typecheck(plan: Plan) -> None:
    """Every consumed operand is produced upstream (or is a plan input), exactly once; shapes agree."""
    g = plan.graph
    if not g.is_acyclic():
        raise PlanTypeError(f"{plan.name}: the plan has a cycle")
    types: dict[str, Operand] = {o.name: o for o in plan.inputs}
    for st in plan.stages():
        if st.kind not in STAGE_KINDS:
            raise PlanTypeError(f"{st.name}: unknown stage kind {st.kind!r}")
        for i in st.inputs:
            if i not in types:
                raise PlanTypeError(f"{plan.name}: stage {st.name} consumes `{i}`, which no earlier stage produces")
            p = plan.producer(i)
            if p is not None and not g.has_edge(p, st):
                raise PlanTypeError(f"{plan.name}: stage {st.name} consumes `{i}` without an edge from {p.name}")
        for o in st.outputs:
            if o.name in types:
                raise PlanTypeError(f"{plan.name}: operand `{o.name}` is produced twice")
            if o.dtype not in ("in", "fp32"):
                raise PlanTypeError(f"{st.name}: {o} has an unknown dtype")
            for d in o.dims:
                if d not in ("B", "T", "H", "HV", "dk", "dv", "NT", "C", "N"):
                    raise PlanTypeError(f"{st.name}: {o} has an unknown dimension {d}")
        TYPE_RULES[st.kind](st, types)
        for o in st.outputs:
            types[o.name] = o
    for result, name in plan.outputs:
        if name not in types:
            raise PlanTypeError(f"{plan.name}: result `{result}` reads `{name}`, which is never produced")


# --- printing ----------------------------------------------------------------------------------------
def _attr_text(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_attr_text(x) for x in v) + ")"
    return str(v)


def format_plan(plan: Plan) -> str:
    """`dgps show --stage plan`: one line per stage in topological order, with operands and shapes."""
    s = plan.structure
    lines = [f"plan {plan.name}  (family {plan.family}; decay {s.decay}; chunk {plan.chunk_size}, sub-chunk "
             f"{plan.sub_chunk})",
             "  inputs: " + ", ".join(str(o) for o in plan.inputs)]
    for st in plan.stages():
        outs = ", ".join(str(o) for o in st.outputs)
        ins = ", ".join(o if r == o else f"{r}={o}" for r, o in st.attr("bind", ()))
        attrs = "; ".join(f"{k}={_attr_text(v)}" for k, v in st.attributes if v is not None and k != "bind")
        lines.append(f"  {st.name:<16} {st.kind:<16} ({ins}) -> {outs}" + (f"  {{{attrs}}}" if attrs else ""))
    lines.append("  results: " + ", ".join(f"{r} = {n}" for r, n in plan.outputs))
    lines.append("  roles: " + ", ".join(f"{r} = {e}" for r, e in plan.roles))
    bp = build_backward_plan(plan)
    if bp is None:
        lines.append("  backward: recurrent (no chunk backward for this family)")
        return "\n".join(lines)
    lines.append("  backward (chunked): saves " + ", ".join(bp.saved) + "; keeps from the forward "
                 + (", ".join(bp.kept) or "-") + f" ({bp.kept_bytes} B per token and head at dk = dv = 128)"
                 + "; recomputes " + (", ".join(bp.recomputed) or "-"))
    lines.append(f"  memory model (B per token and head at dk = dv = 128; the peak: the {BACKWARD_PHASES[PEAK_PHASE]}):")
    for m in bp.memory:
        action = "on loads" if m.cost == "loads" else "rerun" if m.recompute else "again" if m.reformed_by else "keep"
        names = ", ".join(f"{o.name} {bytes_per_token(o)}" for o in m.kept) or "-"
        lines.append(f"    {action:<8} {m.kind:<16} {m.kept_bytes:>5} B  ({names})  {m.why}")
    for st in bp.stages:
        outs = ", ".join(str(o) for o in st.outputs)
        attrs = "; ".join(f"{k}={_attr_text(v)}" for k, v in st.attributes if v is not None)
        lines.append(f"  {st.name:<20} ({', '.join(st.inputs)}) -> {outs}  {{{attrs}}}")
    return "\n".join(lines)


def _dot_quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_to_dot(plan: Plan) -> str:
    """Graphviz dot text of the plan: stages as boxes, plan inputs and results as ellipses."""
    lines = [f"digraph {_dot_quote('plan_' + plan.name)} {{", "  rankdir=TB;",
             '  node [fontname="Helvetica", fontsize=10];']
    used = {i for st in plan.graph.nodes for i in st.inputs}
    for o in plan.inputs:
        if o.name in used:
            lines.append(f"  {_dot_quote('in:' + o.name)} [shape=ellipse, label={_dot_quote(o.name + ' ' + o.shape)}];")
    for st in plan.stages():
        label = f"{st.name}\\n[{st.kind}]"
        lines.append(f"  {_dot_quote(st.name)} [shape=box, style=rounded, label=\"{label}\"];")
    for st in plan.stages():
        for i in st.inputs:
            p = plan.producer(i)
            src = p.name if p is not None else "in:" + i
            shape = plan.operand(i).shape
            lines.append(f"  {_dot_quote(src)} -> {_dot_quote(st.name)} [label={_dot_quote(i + ' ' + shape)}];")
    for result, name in plan.outputs:
        p = plan.producer(name)
        src = p.name if p is not None else "in:" + name
        lines.append(f"  {_dot_quote('out:' + result)} [shape=ellipse, style=bold, label={_dot_quote(result)}];")
        lines.append(f"  {_dot_quote(src)} -> {_dot_quote('out:' + result)} [label={_dot_quote(name)}];")
    lines.append("}")
    return "\n".join(lines)


# --- context parallelism: which stages a slice runs once, which per pass (runtime/cp.py) ---------------------------
# A CP slice maps its incoming state affinely, h_out = M h_in + h0 (docs/context_parallel.md). The chunk plan says
# which stages read an incoming state: only those run more than once. The forward of a slice:
#   once        the stages that read no incoming state (the intra-chunk work: interaction, solve, w/u, ...)
#   aux         the auxiliary states' own scans from the states a slice knows (zero for the continued segment):
#               their offsets A0 / C0, m0, n0; then one exchange
#   after_aux   with the true incoming auxiliary states: the stages that read them but not S (their scans again,
#               and what reads k~ or q^), once
#   transition  the state pass alone, from [0 | I] for the continued segment, the values widened by dk zero
#               columns: its final state is [h0 | M]; then one exchange
#   final       the stages that read S (the state pass and the output), from the true incoming state
# The backward mirrors it on the backward plan: the stages on the way from the final-state adjoint to the initial
# state's (the reverse state pass; the auxiliary states' reverse passes) run once with the slice's own adjoints, which
# gives the exchange d0 (the adjoint of the incoming state), and again with the later ranks' adjoint g of the
# outgoing state added; every other backward stage runs once.
AUX_STATE_OPERANDS = ("A0", "C0", "m0", "n0")
AUX_FINAL_ADJOINTS = ("dA_final", "dC_final", "dm_final")
AUX_INITIAL_ADJOINTS = ("dA0", "dC0", "dm0")


@dataclass(frozen=True)
class CPStages:
    """The forward plan's stage names per CP phase (in plan order) and the backward plan's kinds per phase."""

    once: tuple[str, ...]
    aux: tuple[str, ...]
    after_aux: tuple[str, ...]
    transition: tuple[str, ...]
    final: tuple[str, ...]
    bwd_first: tuple[str, ...]  # before the S exchange: every stage the adjoint of the incoming S needs
    bwd_again: tuple[str, ...]  # after it: the ones of those that read the final-state adjoint
    bwd_aux_first: tuple[str, ...]  # before the auxiliary exchange: what the auxiliary adjoints need besides
    bwd_aux_again: tuple[str, ...]  # after it: the ones of those that read the auxiliary final adjoints
    bwd_rest: tuple[str, ...]  # once, last

    def backward_order(self) -> list[tuple[str, str | None]]:
        """(backward kind or exchange, tag) in launch order: tag 'first' / 'again' marks a stage of a pass."""
        seq: list[tuple[str, str | None]] = [(k, "first" if k in self.bwd_again else None) for k in self.bwd_first]
        seq.append(("exchange S", None))
        seq += [(k, "again") for k in self.bwd_again]
        if self.aux:
            seq += [(k, "aux_first" if k in self.bwd_aux_again else None) for k in self.bwd_aux_first]
            seq.append(("exchange aux", None))
            seq += [(k, "aux_again") for k in self.bwd_aux_again]
        return seq + [(k, None) for k in self.bwd_rest]


def _downstream(stages: list[Stage], sources: set[str]) -> set[str]:
    """Names of the stages (in topological order) that read one of `sources`, directly or through another's outputs."""
    hit, live = set(), set(sources)
    for st in stages:
        if live & set(st.inputs):
            hit.add(st.name)
            live |= set(st.output_names)
    return hit


def _upstream(stages: list[Stage], targets: set[str]) -> set[str]:
    """Names of the stages that produce one of `targets`, directly or through a stage that reads their outputs."""
    hit, need = set(), set(targets)
    for st in reversed(stages):
        if need & set(st.output_names):
            hit.add(st.name)
            need |= set(st.inputs)
    return hit


def cp_stages(plan: Plan, bp: BackwardPlan | None = None) -> CPStages:
    """Partition the forward plan's stages (and the backward plan's, where there is one) into the CP phases above."""
    sts = plan.stages()
    dep_s = _downstream(sts, {"S0"})
    dep_aux = _downstream(sts, set(AUX_STATE_OPERANDS))
    aux_finals = {n for r, n in plan.outputs if r in ("A", "C", "m", "n")}
    host = {st.name: launch_of(st) for st in sts}

    def phase(st: Stage) -> str:
        # a fused stage runs in its host's launch: its phase is the host's (the statistic's decay cumsum, for one,
        # reads no state but is accumulated inside the statistic's scan)
        h = host[st.name]
        if h is not None and h != st.kind:
            st = next(s for s in sts if s.kind == h)
        if st.name in dep_s:
            return "final"
        if st.name in dep_aux:
            return "after_aux"
        return "once"

    phases = {st.name: phase(st) for st in sts}
    pick = {p: tuple(st.name for st in sts if phases[st.name] == p) for p in ("once", "after_aux", "final")}
    aux_hosts = {st.kind for st in sts if set(st.output_names) & aux_finals}
    aux = tuple(st.name for st in sts if host[st.name] in aux_hosts)  # with the stages fused into them
    s_final = dict(plan.outputs)["S"]
    transition = tuple(n for n in pick["final"] if n in _upstream(sts, {s_final}))
    first = again = aux_first = aux_again = rest = ()
    if bp is not None:
        bsts = list(bp.stages)
        up_s = _upstream(bsts, {"dS0"})
        up_aux = _upstream(bsts, set(AUX_INITIAL_ADJOINTS)) - up_s
        first = tuple(st.kind for st in bsts if st.name in up_s)
        again = tuple(st.kind for st in bsts if st.name in up_s & _downstream(bsts, {"dS_final"}))
        aux_first = tuple(st.kind for st in bsts if st.name in up_aux)
        aux_again = tuple(st.kind for st in bsts if st.name in up_aux & _downstream(bsts, set(AUX_FINAL_ADJOINTS)))
        rest = tuple(st.kind for st in bsts if st.name not in up_s | up_aux)
    return CPStages(pick["once"], aux, pick["after_aux"], transition, pick["final"], first, again, aux_first,
                    aux_again, rest)


def format_cp_stages(cs: CPStages, plan: Plan, bp: BackwardPlan | None) -> list[str]:
    """The lines `dgps show --stage plan --cp` prints: every launch of a CP slice, once or per pass."""
    sts = plan.stages()
    lines = ["  stages per slice (compiler.plan.cp_stages), forward, in launch order:"]
    on_loads = [st.name for st in sts if launch_of(st) is None]
    for host in dict.fromkeys(h for st in sts if (h := launch_of(st)) is not None):
        names = [st.name for st in sts if launch_of(st) == host]
        label = " + ".join(names)
        first = names[0] if host not in {plan.stage(n).kind for n in names} else \
            next(n for n in names if plan.stage(n).kind == host)
        if first in cs.transition:
            what = ("per pass: transition (alone, from [0 | I], value width dv + dk: [h0 | M]); exchange; final (from "
                    "the true incoming S" + (", one launch with " + ", ".join(names[1:]) if len(names) > 1 else "") + ")")
        elif first in cs.final:
            what = "once: in the final pass (from the true incoming S)"
        elif first in cs.aux:
            what = ("per pass: the offsets (the continued segment from zero); exchange; again from the true incoming "
                    "auxiliary states")
        elif first in cs.after_aux:
            what = "once: after the auxiliary exchange (reads the true incoming auxiliary states, not S)"
        else:
            what = "once: reads no incoming state"
        lines.append(f"    {label:<34} {what}")
    if on_loads:
        lines.append(f"    {', '.join(on_loads):<34} on its consumers' tile loads (no launch)")
    if bp is None:
        lines.append("  backward: recurrent (no chunk backward): under autograd")
        return lines
    lines.append("  backward, in launch order (after the forward's recomputed stages, as without CP: "
                 + (", ".join(bp.recomputed) or "-") + "):")
    per_pass = set(cs.bwd_again) | set(cs.bwd_aux_again)
    for k in bp.kinds():
        if k in per_pass:
            which = "S" if k in cs.bwd_again else "auxiliary states"
            what = (f"per pass: the slice's own adjoints (d0 of the incoming {which}); exchange; + the later ranks' "
                    "adjoint g of the outgoing ones")
        else:
            what = "once"
        lines.append(f"    {k:<34} {what}")
    lines.append("    (a pass whose adjoint is zero by the layout is skipped: no d0 where the slice continues no "
                 "sequence, no g where the next rank starts one)")
    return lines
