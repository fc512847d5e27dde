"""The canonical IR: the canonical recurrence (README, "The spec language") as small frozen dataclasses.

    S̄_t = S_{t-1} D_t
    S_t = S̄_t + (X_t e_t) f_tᵀ + v'_t w_tᵀ      X_t = S̄_t (erase reads the decayed state) or S_{t-1}
    o_t = scale · S_t q'_t

Elementwise parts are sympy expressions over the input symbols (lets are inlined). Two symbols are
not inputs: `ktilde`, the write key after the preconditioner (k itself when there is none), and `A`,
the diagonal preconditioner's statistic inside its map. Vector expressions are elementwise over
their channel (dk for key-side, dv for value-side).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy as sp

KTILDE = sp.Symbol("ktilde", real=True)
STAT = sp.Symbol("A", positive=True)
HEAD_INDEX = sp.Symbol("head_index", integer=True, nonnegative=True)

ROLES_INPUT = ("key", "value", "token", "key_channel", "value_channel")
ROLES_PARAM = ("head", "key_channel", "value_channel")
DOMAINS = ("log_gate", "unit", "positive", "free")


@dataclass(frozen=True)
class TensorDecl:
    """A declared input (per token) or param (per head); `heads` is 'key' (H) or 'value' (HV)."""

    name: str
    role: str
    is_param: bool
    heads: str
    domain: str
    default: float | None = None

    @property
    def vector(self) -> str | None:
        return {"key": "key", "key_channel": "key", "value": "value", "value_channel": "value"}.get(self.role)

    def shape(self, B: int, T: int, H: int, HV: int, dk: int, dv: int) -> tuple[int, ...]:
        nh = H if self.heads == "key" else HV
        last = {"key": (dk,), "key_channel": (dk,), "value": (dv,), "value_channel": (dv,)}.get(self.role, ())
        return (nh, *last) if self.is_param else (B, T, nh, *last)

    def shape_text(self) -> str:
        nh = "H" if self.heads == "key" else "HV"
        last = {"key": ", dk", "key_channel": ", dk", "value": ", dv", "value_channel": ", dv"}.get(self.role, "")
        return f"[{nh}{last}]" if self.is_param else f"[B, T, {nh}{last}]"


@dataclass(frozen=True)
class Decay:
    kind: str  # none | scalar | vector | const
    log_gate: sp.Expr | None = None  # natural-log decay; for const, log(γ) in head_index


@dataclass(frozen=True)
class DiagPrecond:
    """A_t = exp(decay_t)·A_{t-1} + gain_t·stat_t;  scale_t = map(A_t)."""

    stat: sp.Expr
    decay: sp.Expr | None
    gain: sp.Expr | None
    map: sp.Expr
    heads: str  # 'key' when every input it reads is per key head (FLA's PGDN), else 'value'


@dataclass(frozen=True)
class Precond:
    kind: str  # none | diag | exact
    placement: str | None = None  # write_key | query
    diag: DiagPrecond | None = None
    lam: float | None = None  # exact: P_t = (lam·I + Σ k kᵀ)^-1


@dataclass(frozen=True)
class Solve:
    """The write. `spelled` is the spec's word; `kind` is the family after canonicalisation.

    additive:  S_t = S̄_t + v'_t w_tᵀ,                      v' = beta·target, w = write_key
    delta:     S_t = S̄_t + beta(target − S̄_t erase_key) write_keyᵀ
    dplr:      S_t = S̄_t + (X_t e) fᵀ + v' wᵀ with free e, f
    """

    kind: str
    spelled: str
    beta: sp.Expr
    target: sp.Expr
    write_key: sp.Expr
    erase_key: sp.Expr | None = None
    e: sp.Expr | None = None
    f: sp.Expr | None = None
    erase_reads: str = "decayed"  # or 'undecayed' (FLA's dplr / RWKV-7)

    def canonical(self) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
        """(e, f, v', w) of the README's canonical form."""
        vprime = sp.Mul(self.beta, self.target)
        if self.kind == "additive":
            return sp.Integer(0), sp.Integer(0), vprime, self.write_key
        if self.kind == "delta":
            assert self.erase_key is not None
            return -self.beta * self.erase_key, self.write_key, vprime, self.write_key
        assert self.e is not None and self.f is not None
        return self.e, self.f, vprime, self.write_key


@dataclass(frozen=True)
class ReadCorrection:
    kind: str = "none"  # none | curvature
    lam: sp.Expr | None = None
    centered: bool = True


@dataclass(frozen=True)
class Reduction:
    """A channel reduction, bound to the symbol `name` wherever the spec wrote it.

    sum:     name = Σ_c arg_c                     (a token-level scalar)
    l2norm:  name_c = arg_c / sqrt(Σ_c arg_c² + eps)   (a vector on `side`)

    `arg` is elementwise over `side` ('key': dk channels, 'value': dv) and reads inputs, params and the
    symbols of earlier reductions (the tuple is in dependence order). Normalised q and k are read
    normalised. The value is a per-token (derived) input of every later stage.
    """

    name: str
    op: str  # sum | l2norm
    arg: sp.Expr
    side: str  # key | value
    eps: float = 0.0  # l2norm only

    @property
    def role(self) -> str:
        """The role of the value as a per-token input: a token scalar or a channel vector of `side`."""
        return "token" if self.op == "sum" else f"{self.side}_channel"


@dataclass(frozen=True)
class Structure:
    """What later stages specialise on, found by analysis rather than by the system's name."""

    decay: str
    additive: bool  # e ≡ 0
    tied: bool  # f ≡ w
    erase_reads: str
    gain: str  # none | scalar | vector
    precond: str
    precond_placement: str | None
    read: str
    route: str
    normalize: tuple[str, ...]


@dataclass(frozen=True)
class IR:
    name: str
    inputs: tuple[TensorDecl, ...]
    normalize: tuple[str, ...]
    norm_eps: float
    scale: float | None  # None: dk ** -0.5
    decay: Decay
    precond: Precond
    solve: Solve
    read: ReadCorrection
    route: str  # none | value | residual
    lets: tuple[tuple[str, sp.Expr], ...] = field(default=(), compare=False)
    reductions: tuple[Reduction, ...] = ()
    structure: Structure = field(default=None, compare=False)  # type: ignore[assignment]

    def input(self, name: str) -> TensorDecl:
        for d in self.inputs:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def state_names(self) -> tuple[str, ...]:
        """The recurrent states, in order: S (always), then the statistics the spec carries."""
        names = ["S"]
        if self.precond.kind == "diag":
            names.append("A")
        if self.precond.kind == "exact":
            names.append("P")
        if self.read.kind == "curvature":
            names += ["C", "m", "n"]
        return tuple(names)


def kernel_ir(ir: IR) -> IR:
    """`ir` with every reduction turned into a per-token input of its role (per value head): the IR the
    recurrent kernels are generated from. Their modules keep the spec's IR to check the caller's inputs and
    compute the derived inputs before each launch (runtime/reductions.py)."""
    if not ir.reductions:
        return ir
    derived = tuple(TensorDecl(r.name, r.role, False, "value", "free") for r in ir.reductions)
    return replace(ir, inputs=ir.inputs + derived, reductions=())


def analyse(ir: IR) -> Structure:
    e, f, _vp, w = ir.solve.canonical()
    k, v = sp.Symbol("k", real=True), sp.Symbol("v", real=True)
    vector_gain = ir.solve.target != v or (ir.solve.erase_key is not None and ir.solve.erase_key != k)
    gain = "vector" if vector_gain else ("scalar" if ir.solve.beta != 1 else "none")
    return Structure(
        decay=ir.decay.kind,
        additive=e == 0,
        tied=e == 0 or f == w,
        erase_reads=ir.solve.erase_reads,
        gain=gain,
        precond=ir.precond.kind,
        precond_placement=ir.precond.placement,
        read=ir.read.kind,
        route=ir.route,
        normalize=ir.normalize,
    )


def format_ir(ir: IR) -> str:
    """The printable form of the IR stage (`dgps show --stage ir`)."""
    lines = [f"IR {ir.name}", "  inputs:"]
    for d in ir.inputs:
        kind = "param" if d.is_param else "input"
        dflt = f" = {d.default}" if d.default is not None else ""
        lines.append(f"    {kind} {d.name:<10} {d.role:<14} {d.domain:<9} {d.shape_text()}{dflt}")
    lines.append(f"  normalize: {', '.join(ir.normalize) or '-'} (eps={ir.norm_eps:g})")
    for r in ir.reductions:
        over = f"{r.side} channels"
        rhs = f"sum({r.arg})" if r.op == "sum" else f"l2norm({r.arg}, eps={r.eps:g})"
        lines.append(f"  reduction: {r.name} = {rhs}  over {over}")
    lines.append(f"  scale: {'dk ** -0.5' if ir.scale is None else ir.scale}")
    lines.append(f"  decay: {ir.decay.kind}" + (f"  log D = {ir.decay.log_gate}" if ir.decay.log_gate is not None else ""))
    p = ir.precond
    if p.kind == "diag" and p.diag is not None:
        lines.append(f"  precond: diag on {p.placement} (per {p.diag.heads} head)")
        lines.append(f"    A_t = exp({p.diag.decay or 0}) * A_(t-1) + ({p.diag.gain or 1}) * ({p.diag.stat})")
        lines.append(f"    scale = {p.diag.map}")
    elif p.kind == "exact":
        lines.append(f"  precond: exact(lambda={p.lam}) on {p.placement}")
    else:
        lines.append("  precond: none")
    e, f, vp, w = ir.solve.canonical()
    lines.append(f"  solve: {ir.solve.spelled} (family {ir.solve.kind}; erase reads {ir.solve.erase_reads} state)")
    lines.append(f"    e = {e}\n    f = {f}\n    v' = {vp}\n    w = {w}")
    if ir.read.kind == "curvature":
        lines.append(f"  read: curvature({ir.read.lam}, {'centered' if ir.read.centered else 'uncentered'})")
    else:
        lines.append("  read: plain")
    lines.append(f"  route: {ir.route}")
    s = ir.structure
    if s is not None:
        lines.append(
            f"  structure: decay={s.decay} additive={s.additive} tied={s.tied} gain={s.gain} "
            f"precond={s.precond}{'/' + s.precond_placement if s.precond_placement else ''} read={s.read} route={s.route}"
        )
    return "\n".join(lines)
