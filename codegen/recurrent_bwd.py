"""IR -> the recurrent BACKWARD Triton kernel: reverse-mode through the canonical recurrence, token by token.

One program per (sequence n, value head hv, BV block of dv), as the forward recurrent kernel. It
1. runs the recurrence forward from the initial states and stores every CHECK-th state (h = Sᵀ and the
   statistics the spec carries) in a checkpoint buffer;
2. walks the segments in reverse: recomputes the segment's per-token states into a scratch buffer, then
   sweeps backward through it with the fp32 adjoints (dh [BK, BV], and dA / dP / dC, dm for the
   statistics), re-deriving each token's intermediates from the stored state before it.

Every elementwise gradient comes from sympy: each canonical part (e, f, v', w, the log decay, the diag
preconditioner's decay / increment / map, the curvature gate λ, the route's target and erase key) is
differentiated with respect to each input symbol (and the symbols `ktilde` and `A`), printed with the
Triton printer and multiplied by the part's adjoint. Channel reductions that a program can only form
over its own BV slice of dv (dq, dk, key-channel and per-token gradients, the statistics' adjoints, which
are linear in those) go to per-BV partial buffers; the host sums them (and sums key-head tensors over
their value-head group, params over batch and time). No atomics.

    render_recurrent_backward(ir) -> str     the module's source (deterministic)
    (runtime.compile.load_recurrent_backward(ir) writes it to the cache directory and imports it)
"""

from __future__ import annotations

import dataclasses

import sympy as sp

from ..compiler import ir as _irmod
from ..compiler.exprs import diff_by_name
from ..compiler.ir import HEAD_INDEX, IR, KTILDE, STAT, kernel_ir
from .ir_source import ir_source
from .jinja_env import OMIT, drop_omitted, template_env
from .recurrent import MAX_DK, MAX_DK_MATRIX_STATE, check_supported, register_names, register_shapes
from .triton_expr_bwd import triton_expr_bwd

DEFAULT_CHECK = 64


class RecurrentBackwardCodegenError(NotImplementedError):
    """The IR uses something the recurrent backward generator does not handle."""



# --- the IR as Python source (the module checks its inputs with the same rules as the reference) ---------
# --- expressions ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Part:
    """One elementwise canonical part: its forward register v_<name> and adjoint register a_<name>."""

    name: str
    expr: sp.Expr
    use: str  # s | k | v: the shape the kernel uses it in


class _Builder:
    def __init__(self, ir: IR) -> None:
        self.ir = ir
        self.names, self.shapes = register_names(ir), register_shapes(ir)
        self.used: set[str] = set()

    def shape(self, expr: sp.Expr) -> str:
        found = {self.shapes[s.name] for s in expr.free_symbols} - {"s"}
        if len(found) > 1:
            raise RecurrentBackwardCodegenError(
                f"{self.ir.name}: expression `{expr}` mixes key-channel and value-channel vectors")
        return found.pop() if found else "s"

    def code(self, expr: sp.Expr, want: str | None = None) -> str:
        self.used |= {s.name for s in expr.free_symbols}
        have = self.shape(expr)
        text = triton_expr_bwd(expr, self.names)
        if want is None or want == have:
            pass
        elif have == "s":
            text = f"(z_{want} + {text})"  # z_k / z_v: hoisted zero vectors (tl.zeros is a nested jit call)
        else:
            raise RecurrentBackwardCodegenError(
                f"{self.ir.name}: `{expr}` is a {'key' if have == 'k' else 'value'}-channel vector where a "
                f"{'key' if want == 'k' else 'value'}-channel one is needed")
        if want in ("k", "v") and not self.zero_padded(expr, want):
            text = f"tl.where(m_{want}, {text}, 0.0)"  # padded lanes stay exactly 0
        return text

    def zero_padded(self, expr: sp.Expr, side: str) -> bool:
        """Is `expr` exactly 0 on the padded lanes (channel >= dk or dv) of a `side` vector? Loaded vectors
        are (masked loads), and so are products with one of them and sums of such terms."""
        if expr.is_Symbol:
            return self.shapes.get(expr.name) == side and expr.name != HEAD_INDEX.name
        if expr.is_Mul:
            return any(self.zero_padded(a, side) for a in expr.args)
        if expr.is_Add:
            return all(self.zero_padded(a, side) for a in expr.args)
        if expr.is_Pow:
            return bool(expr.args[1].is_positive) and self.zero_padded(expr.args[0], side)
        return False


# The hook files through which structure enters recurrent_bwd.jinja: one per preconditioner kind, read kind and solve
# family, each the same macros (codegen/templates/recurrent_bwd.jinja's header names them).
PRECOND_HOOKS = {kind: f"recurrent_bwd_precond_{kind}.jinja" for kind in ("none", "diag", "exact")}
READ_HOOKS = {"none": "recurrent_bwd_read_plain.jinja", "curvature": "recurrent_bwd_read_curvature.jinja"}
SOLVE_HOOKS = {"additive": "recurrent_bwd_solve_additive.jinja", "dplr": "recurrent_bwd_solve_dplr.jinja"}


def _reduce(term: str, have: str, want: str) -> str:
    if have == want or have == "s" and want != "s":
        return term
    if want == "s":
        mask = "m_k" if have == "k" else "m_v"
        return f"tl.reduce(tl.where({mask}, {term}, 0.0), 0, _add)"
    raise RecurrentBackwardCodegenError(f"cannot reduce a {have}-vector gradient to a {want}-vector")


def _check(ir: IR) -> None:
    check_supported(ir, RecurrentBackwardCodegenError)
    if ir.read.kind == "curvature" and ir.precond.kind != "none" and ir.precond.placement == "query":
        raise RecurrentBackwardCodegenError(f"{ir.name}: a curvature read together with a query preconditioner")


def _context(spec_ir: IR) -> dict[str, object]:
    ir = kernel_ir(spec_ir)  # reductions become derived per-token inputs of the kernel
    _check(ir)
    b = _Builder(ir)
    s = ir.structure if ir.structure is not None else _irmod.analyse(ir)
    e, f, vp, w = ir.solve.canonical()
    erase = not s.additive
    tied = bool(s.tied)

    parts: list[_Part] = []
    decay: dict[str, object] = {"kind": ir.decay.kind}
    if ir.decay.kind != "none":
        assert ir.decay.log_gate is not None
        lg = _Part("lg", ir.decay.log_gate, b.shape(ir.decay.log_gate))
        parts.append(lg)
        decay.update(vector=lg.use == "k", line=b.code(lg.expr, lg.use))
    pre: dict[str, object] = {"kind": ir.precond.kind, "placement": ir.precond.placement,
                              "forms_query": ir.precond.kind != "none" and ir.precond.placement == "query"}
    if ir.precond.kind == "diag":
        d = ir.precond.diag
        assert d is not None
        pre_parts = []
        if d.decay is not None:
            pre_parts.append(_Part("pdec", d.decay, b.shape(d.decay)))
        pre_parts.append(_Part("pinc", d.stat * d.gain if d.gain is not None else d.stat, "k"))
        parts += pre_parts
        pmap = _Part("pmap", d.map, "k")
        parts.append(pmap)
        pre.update(
            lines=[(f"v_{p.name}", b.code(p.expr, p.use)) for p in pre_parts],
            has_decay=d.decay is not None,
            decay_vector=d.decay is not None and b.shape(d.decay) == "k",
            map_code=b.code(d.map, "k"),
            heads="i_h" if d.heads == "key" else "i_hv",
            nheads="H" if d.heads == "key" else "HV",
            injects="inject" if d.heads == "key" else "i_v == 0",  # the one program that takes dA's final gradient
        )
    elif ir.precond.kind == "exact":
        assert ir.precond.lam is not None
        pre.update(inv_lam=repr(1.0 / float(ir.precond.lam)))

    gate_parts: list[_Part] = []
    if erase:
        gate_parts.append(_Part("e", e, "k"))
        if not tied:
            gate_parts.append(_Part("f", f, "k"))
    gate_parts += [_Part("vp", vp, "v"), _Part("w", w, "k")]
    if ir.route == "residual":
        assert ir.solve.erase_key is not None
        gate_parts.append(_Part("ek", ir.solve.erase_key, "k"))
    parts += gate_parts
    gates = [(f"v_{p.name}", b.code(p.expr, p.use)) for p in gate_parts]
    # what a forward step needs to advance the states (the sweeps skip the read and the route's values)
    state_parts = [p for p in parts if p.name not in ("ek", "z", "lam")]
    state_syms = {sym.name for p in state_parts for sym in p.expr.free_symbols}
    if ir.route != "none":
        parts.append(_Part("z", ir.solve.target, "v"))  # the route's adjoint: its value is not needed

    read: dict[str, object] = {"kind": ir.read.kind, "centered": ir.read.centered}
    if ir.read.kind == "curvature":
        assert ir.read.lam is not None
        lam_shape = b.shape(ir.read.lam)
        if lam_shape == "v":
            raise RecurrentBackwardCodegenError(f"{ir.name}: the curvature gate must be per token or per key channel")
        parts.append(_Part("lam", ir.read.lam, lam_shape))
        read.update(lam_line=b.code(ir.read.lam, lam_shape), lam_vector=lam_shape == "k")

    # gradients: d x = Σ_parts (∂part/∂x) · a_part, reduced to x's shape. The derivatives are gathered
    # first so that one common-subexpression pass (sympy.cse) serves all of them; subexpressions equal to a
    # part's forward value reuse its register.
    reuse = {}
    for p in parts:
        if p.name != "z" and not (p.expr.is_Symbol or p.expr.is_Number) and b.shape(p.expr) == p.use:
            reuse[p.expr] = sp.Symbol(f"v_{p.name}", real=True)
            b.names[f"v_{p.name}"] = f"v_{p.name}"
            b.shapes[f"v_{p.name}"] = p.use
    wrt = [KTILDE.name] + [d.name for d in ir.inputs]
    derivs: dict[tuple[str, str], sp.Expr] = {}
    for name in wrt:
        for p in parts:
            dx = diff_by_name(p.expr, name)
            if dx != 0:
                # one fraction: d/dx x (x² + ε)^(-1/2) is ε (x² + ε)^(-3/2), not a difference of two near-equal terms
                derivs[(name, p.name)] = sp.together(dx).xreplace(reuse)
    dmap = sp.together(diff_by_name(ir.precond.diag.map, STAT.name)).xreplace(reuse) if ir.precond.kind == "diag" \
        else sp.Integer(0)
    keys = list(derivs)
    temps, reduced = sp.cse([derivs[k] for k in keys] + [dmap], symbols=sp.numbered_symbols("cse_", real=True))
    cse_lines = []
    for sym, ex in temps:
        b.names[sym.name] = sym.name
        b.shapes[sym.name] = b.shape(ex)
        cse_lines.append((sym.name, b.code(ex)))
    derivs = dict(zip(keys, reduced[:-1], strict=True))
    dmap = reduced[-1]
    pre["dmap_code"] = None if dmap == 0 else b.code(dmap)
    uses = {p.name: p.use for p in parts}

    def grad_terms(name: str, want: str) -> list[str]:
        terms = []
        for (x, pname), dx in derivs.items():
            if x != name:
                continue
            term = f"a_{pname}" if dx == 1 else f"{b.code(dx)} * a_{pname}"
            terms.append(_reduce(term, uses[pname], want))
        return terms

    kt_terms = grad_terms(KTILDE.name, "k")
    inputs = []
    for dcl in ir.inputs:
        shape = b.shapes[dcl.name]
        terms = grad_terms(dcl.name, shape)
        if dcl.name == "q":
            terms.append("dq_acc")
        if dcl.name == "k":
            terms.append("dk_acc")
        if not terms:
            terms = [f"z_{shape}"]
        nh, hd = ("H", "i_h") if dcl.heads == "key" else ("HV", "i_hv")
        dim = {"k": "DK", "v": "DV", "s": ""}[shape]
        lane, mask = {"k": (" + o_k", ", mask=m_k"), "v": (" + o_v", ", mask=m_v"), "s": ("", "")}[shape]
        lmask = mask + (", other=0.0" if mask else "")
        # per-program base pointers; a token adds t * stride (the ot_* registers, one per stride)
        okey = f"{nh}{dim}"
        if dcl.is_param:
            base = f"in_{dcl.name} + {hd}" + (f" * {dim}" if dim else "") + lane
            load = f"tl.load({base}{lmask}).to(tl.float32)"
        else:
            base = f"in_{dcl.name} + {hd}" + (f" * {dim}" if dim else "") + lane
            load = f"tl.load(pb_{dcl.name} + ot_{okey}{lmask}).to(tl.float32)"
        # gradient buffers: value-channel ones are owned by one BV block, the rest are per-BV partials
        if dcl.is_param:
            row = "i_n * HV + i_hv" if shape == "v" else "(i_v * N + i_n) * HV + i_hv"
            store_ptr = f"dx_{dcl.name} + " + (f"({row}) * {dim}" if dim else row) + lane
            gbase, skey = None, None
        else:
            skey = f"HV{dim}"
            row = "i_hv" if shape == "v" else "i_v.to(tl.int64) * TT * HV + i_hv"
            gbase = f"dx_{dcl.name} + " + (f"({row}) * {dim}" if dim else row) + lane
            store_ptr = f"pg_{dcl.name} + ot_{skey}"
        inputs.append({
            "name": dcl.name, "shape": shape, "is_param": dcl.is_param, "load": load,
            "grad": " + ".join(terms), "store_ptr": store_ptr, "store_mask": mask, "dim": dim,
            "base": base, "gbase": gbase, "okey": None if dcl.is_param else okey, "skey": skey,
            "zeros": {"k": "[BK]", "v": "[BV]", "s": "[]"}[shape],
            "normalize": dcl.name in ir.normalize,
        })

    lean_loads = [x["name"] for x in inputs if not x["is_param"] and (x["name"] in state_syms or x["name"] == "k")]
    strides = {"H": "H", "HV": "HV", "HDK": "H * DK", "HVDK": "HV * DK", "HDV": "H * DV", "HVDV": "HV * DV"}

    def offsets(keys: list[str]) -> list[tuple[str, str]]:
        return [(f"ot_{k}", f"t * ({strides[k]})") for k in dict.fromkeys(keys)]

    tok = [x for x in inputs if not x["is_param"]]
    offsets_full = offsets([x["okey"] for x in tok] + [x["skey"] for x in tok] + ["HVDV"])
    offsets_lean = offsets([x["okey"] for x in tok if x["name"] in lean_loads])
    return {
        "name": ir.name,
        "lean_loads": lean_loads,
        "offsets_full": offsets_full,
        "offsets_lean": offsets_lean,
        "lean_gates": [g for g in gates if g[0] != "v_ek"],
        "kernel": f"{ir.name}_recurrent_bwd_kernel",
        "ir_source": ir_source(spec_ir),
        "ir_text": _irmod.format_ir(dataclasses.replace(spec_ir, structure=s)),
        "has_reductions": bool(spec_ir.reductions),
        "kir": "KERNEL_IR" if spec_ir.reductions else "IR",
        "inputs": inputs,
        "state_names": list(ir.state_names),
        "slot_size": {"S": "BK * BV", "A": "BK", "P": "BK * BK", "C": "BK * BK", "m": "BK", "n": "1"},
        "slot_off": {"S": " + off_hv", "A": " + o_kb", "P": " + off_kk", "C": " + off_kk", "m": " + o_kb", "n": ""},
        "state_reg": {"S": "st_h", "A": "st_A", "P": "st_P", "C": "st_C", "m": "st_m", "n": "st_n"},
        "grad_states": [n for n in ir.state_names if n != "n"],
        "normalize": list(ir.normalize),
        "norm_eps": repr(float(ir.norm_eps)),
        "decay": decay,
        "omit": OMIT,
        "precond_hook": PRECOND_HOOKS[ir.precond.kind],
        "read_hook": READ_HOOKS[ir.read.kind],
        "solve_hook": SOLVE_HOOKS["dplr" if erase else "additive"],
        "precond": pre,
        "gates": gates,
        "erase": erase,
        "tied": tied,
        "erase_reads": ir.solve.erase_reads,
        "read": read,
        "route": ir.route,
        "kt_grad": " + ".join(kt_terms) if kt_terms else None,
        "cse_lines": cse_lines,
        "uses_head_index": HEAD_INDEX.name in b.used,
        "matrix_state": ir.precond.kind == "exact" or ir.read.kind == "curvature",
        "MAX_DK": MAX_DK,
        "MAX_DK_MATRIX_STATE": MAX_DK_MATRIX_STATE,
        "DEFAULT_CHECK": DEFAULT_CHECK,
    }


def render_recurrent_backward(ir: IR) -> str:
    """The full source of the recurrent backward module for `ir` (deterministic)."""
    return drop_omitted(template_env().get_template("recurrent_bwd.jinja").render(**_context(ir)), ir.name)
