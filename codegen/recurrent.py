"""IR -> the recurrent Triton kernel: the canonical recurrence token by token, the state in registers.

One kernel per spec, rendered from templates/recurrent.jinja. It is the decode kernel (a few tokens,
the states updated in place) for every spec, and the forward pass for specs whose chunk form is not
emitted (untied DPLR without a per-channel decay); for the exact preconditioner it is also the named fallback.

One program per (sequence n, value head hv, BV-block of dv). It holds the state tile h = Sᵀ
[BK = next_pow2(dk), BV] in fp32 registers, plus whatever statistics the spec carries: the diagonal
preconditioner's A [BK], the exact preconditioner's P [BK, BK], the curvature read's C [BK, BK],
m [BK] and count n. Every program recomputes its key head's statistics redundantly (no cross-program
traffic); only one program per statistic stores the final value. Vector statistics are cheap next to
h; the dk x dk ones cost a full-width state tile each, so those kernels launch wide dv blocks.

Decode (inplace=True) writes the final states into the initial state tensors. S is never copied: each
program reads and writes only its own tile. A shared statistic is read by several programs and written
by one, so in that mode the statistics (A, P, C, m, n; small next to S unless dk x dk) are read from a
snapshot taken before the launch.

Under TRITON_INTERPRET=1 the loop bound must be a Python int (Triton's interpreter turns every scalar
argument into a tensor), so the wrapper passes it as the constexpr T_STATIC; compiled, T_STATIC = 0.

The generated module carries its own IR (rebuilt from `sympy.srepr` text), so it checks its inputs
with the same rules as the reference and needs no spec at import time.

    render_recurrent(ir) -> str      the module's source (deterministic: same IR, same bytes)
    (runtime.compile.load_recurrent(ir) writes the module to the cache directory and imports it)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy as sp

from ..compiler import ir as _irmod
from ..compiler.ir import HEAD_INDEX, IR, KTILDE, STAT, kernel_ir
from .ir_source import ir_source
from .jinja_env import OMIT, drop_omitted, template_env
from .triton_expr import triton_expr

# Square statistics (P, C) live in registers as [BK, BK] fp32 tiles: fine up to dk = 128.
MAX_DK_MATRIX_STATE = 128
# The state tile h [BK, BV] in registers: FLA's fused recurrent kernels stop at 256 too.
MAX_DK = 256


class RecurrentCodegenError(NotImplementedError):
    """The IR uses something the recurrent kernel generator does not handle."""


# The hook files through which structure enters recurrent.jinja: one per preconditioner kind, read kind and solve
# mode, each the same macros (state_init / step / store_state; erase_before_decay / write).
PRECOND_HOOKS = {kind: f"recurrent_precond_{kind}.jinja" for kind in ("none", "diag", "exact")}
READ_HOOKS = {"none": "recurrent_read_plain.jinja", "curvature": "recurrent_read_curvature.jinja"}
SOLVE_HOOKS = {mode: f"recurrent_solve_{mode}.jinja" for mode in ("additive", "delta", "general")}


# --- kernel context ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Load:
    """One input (per token) or param (per head) as the kernel loads it."""

    name: str  # spec name
    arg: str  # kernel argument
    reg: str  # register
    shape: str  # s (scalar) | k (key vector [BK]) | v (value vector [BV])
    heads: str  # i_h | i_hv
    nheads: str  # H | HV
    is_param: bool

    def address(self) -> str:
        if self.is_param:
            row = self.heads
        else:
            row = f"t * {self.nheads} + {self.heads}"
        if self.shape == "k":
            return f"{self.arg} + ({row}) * DK + o_k"
        if self.shape == "v":
            return f"{self.arg} + ({row}) * DV + o_v"
        return f"{self.arg} + {row}"

    def load(self) -> str:
        mask = {"k": ", mask=m_k, other=0.0", "v": ", mask=m_v, other=0.0", "s": ""}[self.shape]
        return f"{self.reg} = tl.load({self.address()}{mask}).to(tl.float32)"


def register_names(ir: IR) -> dict[str, str]:
    """The kernels' register of each symbol an IR expression may name: inputs, k̃, the PDN statistic, the head."""
    return {**{d.name: f"b_{d.name}" for d in ir.inputs}, KTILDE.name: "d_kt", STAT.name: "st_A",
            HEAD_INDEX.name: "f_hv"}


def register_shapes(ir: IR) -> dict[str, str]:
    """The shape of each of those registers: k (a key-channel vector), v (value-channel) or s (scalar)."""
    return {**{d.name: {"key": "k", "value": "v"}.get(d.vector or "", "s") for d in ir.inputs},
            KTILDE.name: "k", STAT.name: "k", HEAD_INDEX.name: "s"}


class _Builder:
    """Turns IR expressions into register assignments, tracking shapes and loop invariance."""

    def __init__(self, ir: IR) -> None:
        self.ir = ir
        self.names, self.shapes = register_names(ir), register_shapes(ir)
        self.per_token = {d.name for d in ir.inputs if not d.is_param} | {KTILDE.name, STAT.name}
        # registers whose padded key lanes (dk < BK) are exactly 0: masked loads, k̃ and A
        self.zero_padded = {d.name for d in ir.inputs} | {KTILDE.name, STAT.name}
        self.used: set[str] = set()

    def shape(self, expr: sp.Expr) -> str:
        found = {self.shapes[s.name] for s in expr.free_symbols} - {"s"}
        if len(found) > 1:
            raise RecurrentCodegenError(
                f"{self.ir.name}: expression `{expr}` mixes key-channel and value-channel vectors")
        return found.pop() if found else "s"

    def invariant(self, expr: sp.Expr) -> bool:
        return not ({s.name for s in expr.free_symbols} & self.per_token)

    def code(self, expr: sp.Expr, want: str | None = None) -> str:
        """Triton source for `expr`; want='k'/'v' broadcasts a scalar to a vector (key vectors are masked)."""
        self.used |= {s.name for s in expr.free_symbols}
        have = self.shape(expr)
        text = triton_expr(expr, self.names)
        if want is None or want == have:
            pass
        elif have == "s":
            blk = "BK" if want == "k" else "BV"
            text = f"tl.full([{blk}], {text}, tl.float32)" if expr.is_Number else \
                f"(tl.zeros([{blk}], dtype=tl.float32) + {text})"
        else:
            raise RecurrentCodegenError(
                f"{self.ir.name}: `{expr}` is a {'key' if have == 'k' else 'value'}-channel vector where a "
                f"{'key' if want == 'k' else 'value'}-channel one is needed")
        if want == "k" and not expr.is_Number and not (expr.is_Symbol and expr.name in self.zero_padded):
            # padded key lanes (dk < BK) must stay exactly 0: they are summed over
            text = f"tl.where(m_k, {text}, 0.0)"
        return text


# What the recurrent generators (forward and backward) handle: (what, the IR's value, the values handled), a rule
# applying only where its value is not None. A fuzzed or hand-lowered IR outside them gets the generator's error class.
SUPPORTED: tuple[tuple[str, Callable[[IR], object], tuple[object, ...]], ...] = (
    ("decay kind", lambda ir: ir.decay.kind, ("none", "scalar", "vector", "const")),
    ("preconditioner kind", lambda ir: ir.precond.kind, ("none", "diag", "exact")),
    ("preconditioner placement", lambda ir: ir.precond.placement if ir.precond.kind != "none" else None,
     ("write_key", "query")),
    ("solve family", lambda ir: ir.solve.kind, ("additive", "delta", "dplr")),
    ("erase reads", lambda ir: ir.solve.erase_reads, ("decayed", "undecayed")),
    ("read correction", lambda ir: ir.read.kind, ("none", "curvature")),
    ("route", lambda ir: ir.route, ("none", "value", "residual")),
)


def check_supported(ir: IR, error: type[Exception]) -> None:
    """Raise `error` (one line, naming the spec) where `ir` is outside SUPPORTED or its structure cannot be emitted."""
    for what, value_of, handled in SUPPORTED:
        value = value_of(ir)
        if value is not None and value not in handled:
            raise error(f"{ir.name}: {what} {value!r}")
    if ir.route == "residual" and ir.solve.erase_key is None:
        raise error(f"{ir.name}: a residual route needs an erase key (delta family)")
    if not ir.name.isidentifier():
        raise error(f"{ir.name!r} is not a Python identifier")


def _context(spec_ir: IR) -> dict[str, object]:
    ir = kernel_ir(spec_ir)  # reductions become derived per-token inputs of the kernel
    check_supported(ir, RecurrentCodegenError)
    b = _Builder(ir)
    e, f, vp, w = ir.solve.canonical()
    s = ir.structure if ir.structure is not None else _irmod.analyse(ir)
    ctx: dict[str, object] = {
        "name": ir.name,
        "kernel": f"{ir.name}_recurrent_fwd_kernel",
        "ir_source": ir_source(spec_ir),
        "ir_text": _irmod.format_ir(dataclasses.replace(spec_ir, structure=s)),
        "has_reductions": bool(spec_ir.reductions),
        "kir": "KERNEL_IR" if spec_ir.reductions else "IR",
        "state_names": list(ir.state_names),
        "normalize": list(ir.normalize),
        "norm_eps": repr(float(ir.norm_eps)),
        "route": ir.route,
        "MAX_DK": MAX_DK,
        "MAX_DK_MATRIX_STATE": MAX_DK_MATRIX_STATE,
        "matrix_state": ir.precond.kind == "exact" or ir.read.kind == "curvature",  # a dk x dk statistic
        "omit": OMIT,
        "precond_hook": PRECOND_HOOKS[ir.precond.kind],
        "read_hook": READ_HOOKS[ir.read.kind],
    }

    hoisted: list[tuple[str, str]] = []  # (register, code), computed once per program, before the loop
    temps: set[str] = set()  # common-subexpression temporaries (their padded key lanes are not masked)

    def assign(reg: str, expr: sp.Expr, want: str | None, where: list[tuple[str, str]]) -> str:
        """`reg = expr` in `where` (a per-token block), or hoisted when no per-token value is read.

        Returns the register that holds the value: a bare input symbol is used where it lives."""
        if expr.is_Symbol and expr.name != STAT.name and want in (None, b.shapes[expr.name]) \
                and (expr.name in b.zero_padded or (expr.name in temps and want != "k")):
            b.used.add(expr.name)
            return b.names[expr.name]
        (hoisted if b.invariant(expr) else where).append((reg, b.code(expr, want)))
        return reg

    # decay: h ← α h, α = exp(log D) (sympy folds exp(log(γ)) back to γ for const decays)
    decay: dict[str, object] = {"kind": ir.decay.kind}
    if ir.decay.kind != "none":
        assert ir.decay.log_gate is not None
        alpha = sp.exp(ir.decay.log_gate)
        vector = b.shape(alpha) == "k"
        lines: list[tuple[str, str]] = []
        reg = assign("d_alpha", alpha, "k" if vector else "s", lines)
        decay.update(vector=vector, lines=lines, alpha=reg)
    ctx["decay"] = decay

    # preconditioner
    pre: dict[str, object] = {"kind": ir.precond.kind, "placement": ir.precond.placement}
    # where the preconditioner acts: the write key k̃ (d_kt) or the query q' (d_qp)
    pre["placed"], pre["placed_input"] = ("d_kt", "b_k") if ir.precond.placement == "write_key" else ("d_qp", "b_q")
    if ir.precond.kind == "diag":
        d = ir.precond.diag
        assert d is not None
        lines = []
        pdecay = None
        if d.decay is not None:
            pdecay = assign("d_pdecay", sp.exp(d.decay), "k" if b.shape(d.decay) == "k" else "s", lines)
        inc = d.stat * d.gain if d.gain is not None else d.stat
        pinc = assign("d_pinc", inc, "k", lines)
        pre.update(
            a_update=f"{pdecay} * st_A + {pinc}" if pdecay else f"st_A + {pinc}",
            inc_lines=lines,
            map_line=("d_pscale", b.code(d.map, "k")),
            heads="i_h" if d.heads == "key" else "i_hv",
            nheads="H" if d.heads == "key" else "HV",
            per_key_head=d.heads == "key",
            writer="(i_v == 0) & (i_hv % (HV // H) == 0):  # one writer per key head" if d.heads == "key"
            else "i_v == 0:",
        )
    elif ir.precond.kind == "exact":
        assert ir.precond.lam is not None
        pre.update(inv_lam=repr(1.0 / float(ir.precond.lam)),
                   placed_value="d_Pk / d_den" if ir.precond.placement == "write_key"
                   else "tl.reduce(st_P * b_q[None, :], 1, _add)")
        b.used |= {"k"}
    ctx["precond"] = pre

    # solve: S_t = S̄ + (X e) fᵀ + v' wᵀ; in h = Sᵀ layout  h += f ⊗ (eᵀ X) + w ⊗ v'
    solve: dict[str, object] = {"spelled": ir.solve.spelled, "family": ir.solve.kind,
                                "erase_reads": ir.solve.erase_reads}
    beta = ir.solve.beta
    if s.additive:
        mode = "additive"
    elif ir.solve.kind == "delta" and b.shape(beta) != "k":
        # e = −β·ê: one reduction S̄ê serves the erase (and the residual route): u = v' − β S̄ê
        mode = "delta"
    else:
        mode = "general"
    solve["mode"] = mode
    ctx["solve_hook"] = SOLVE_HOOKS[mode]
    solve["tied"] = bool(s.tied)
    solve["tied_note"] = ", tied f = w" if s.tied and mode != "additive" else ""
    wanted: list[tuple[str, sp.Expr, str | None]] = []  # (role, expression, shape)
    if mode == "delta":
        assert ir.solve.erase_key is not None
        wanted.append(("ek", ir.solve.erase_key, "k"))
        if beta != 1:
            wanted.append(("beta", beta, None))
    elif mode == "general":
        wanted.append(("e", e, "k"))
        if not s.tied:
            wanted.append(("f", f, "k"))
    wanted += [("vp", vp, "v"), ("w", w, "k")]
    if ir.route != "none":
        wanted.append(("z", ir.solve.target, "v"))
    if ir.route == "residual" and mode != "delta":
        assert ir.solve.erase_key is not None
        wanted.append(("ek", ir.solve.erase_key, "k"))
    gates: list[tuple[str, str]] = []
    # common subexpressions of the per-token gate values become temporaries t_0, t_1, ...
    token_idx = [i for i, (_, ex, _) in enumerate(wanted) if not b.invariant(ex) and not ex.is_Symbol]
    if len(token_idx) > 1:
        replacements, reduced = sp.cse([wanted[i][1] for i in token_idx],
                                       symbols=sp.numbered_symbols("__cse", real=True), order="canonical")
        for sym, sub in replacements:
            b.names[sym.name] = f"t_{sym.name[5:]}"
            b.shapes[sym.name] = b.shape(sub)
            temps.add(sym.name)
            if not b.invariant(sub):
                b.per_token.add(sym.name)
            (hoisted if b.invariant(sub) else gates).append((b.names[sym.name], b.code(sub)))
        for i, ex in zip(token_idx, reduced, strict=True):
            wanted[i] = (wanted[i][0], ex, wanted[i][2])
    regs = {role: assign(f"d_{role}", ex, want, gates) for role, ex, want in wanted}
    solve["gates"] = gates
    solve["r"] = regs
    solve["beta"] = regs.get("beta")
    ctx["solve"] = solve

    # read correction
    read: dict[str, object] = {"kind": ir.read.kind, "centered": ir.read.centered}
    query_corrected = ir.read.kind == "curvature" or (ir.precond.kind != "none" and ir.precond.placement == "query")
    read["qp"] = "d_qp" if query_corrected else "b_q"
    if ir.read.kind == "curvature":
        assert ir.read.lam is not None
        if b.shape(ir.read.lam) == "v":
            raise RecurrentCodegenError(f"{ir.name}: the curvature gate must be per token or per key channel")
        lines = []
        read["lam"] = assign("d_lam", ir.read.lam, None, lines)
        read["lam_lines"] = lines
        b.used |= {"k"}
    ctx["read"] = read
    ctx["route_store"] = {"none": None, "value": (regs.get("z"), "the write value"),
                          "residual": (f"({regs.get('z')} - d_Sk)", "r = v − S̄ ê")}[ir.route]

    b.used |= {"q"}
    if ir.route == "residual":
        b.used |= {s.name for s in ir.solve.erase_key.free_symbols}  # type: ignore[union-attr]
    loads = []
    for dcl in ir.inputs:
        if dcl.name not in b.used:
            continue
        loads.append(_Load(
            name=dcl.name, arg=f"in_{dcl.name}", reg=f"b_{dcl.name}", shape=b.shapes[dcl.name],
            heads="i_h" if dcl.heads == "key" else "i_hv", nheads="H" if dcl.heads == "key" else "HV",
            is_param=dcl.is_param,
        ))
    ctx["args"] = [f"in_{d.name}" for d in ir.inputs]
    ctx["input_names_repr"] = repr(tuple(d.name for d in ir.inputs))
    ctx["state_names_repr"] = repr(tuple(ir.state_names))
    ctx["route_repr"] = repr(ir.route)
    ctx["param_loads"] = [ld.load() for ld in loads if ld.is_param]
    ctx["token_loads"] = [ld.load() for ld in loads if not ld.is_param]
    ctx["uses_head_index"] = HEAD_INDEX.name in b.used
    ctx["hoisted"] = hoisted
    if ir.precond.kind == "exact" or ir.read.kind == "curvature":  # dk x dk statistics: few, wide programs
        ctx["block_v"], ctx["num_warps"] = 32, 8
    elif ir.decay.kind == "vector" or ir.precond.kind == "diag" or any(ld.shape == "k" for ld in loads
                                                                        if ld.name not in ("q", "k")):
        ctx["block_v"], ctx["num_warps"] = 32, 4  # FLA's KDA
    else:
        ctx["block_v"], ctx["num_warps"] = 8, 1  # FLA's gated delta rule
    return ctx


def render_recurrent(ir: IR) -> str:
    """The full source of the recurrent module for `ir` (deterministic)."""
    return drop_omitted(template_env().get_template("recurrent.jinja").render(**_context(ir)), ir.name)
