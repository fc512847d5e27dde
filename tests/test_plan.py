"""Chunk plans: built from the IR's Structure, typechecked, printable; the plan interpreter equals the
sequential reference (float64) for every spec, on ragged, T = 1, varlen, GVA, initial/final states and
strong-decay inputs, and on hypothesis-drawn inputs."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
import sympy as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgps.compiler.ir import kernel_ir
from dgps.compiler.plan import (
    Plan,
    PlanTypeError,
    Stage,
    build_backward_plan,
    build_plan,
    direct_gate_input,
    format_plan,
    plan_to_dot,
    typecheck,
)
from dgps.runtime.api import Recurrence, load
from dgps.runtime.interpret import decayed_scores, exact_precond_backward, run_plan, untied_chunk_backward
from dgps.runtime.reference import reference, state_shapes
from dgps.runtime.tensors import Dims

SPEC_DIR = Path(__file__).resolve().parent.parent / "specs"
SPECS = sorted(p.stem.removesuffix(".dgps") for p in SPEC_DIR.glob("*.dgps"))
TOL = 1e-10


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny CPU ops: threading only adds overhead (and noise on a shared 2-core box).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@cache
def rec(name: str) -> Recurrence:
    return load(SPEC_DIR / f"{name}.dgps")


@cache
def plan(name: str, chunk: int = 64, sub: int = 16) -> Plan:
    return build_plan(rec(name).ir, chunk, sub)


def test_spec_list_nonempty():
    assert len(SPECS) >= 20


# --- plan shape ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SPECS)
def test_plan_builds_typechecks_prints(name):
    p = plan(name)
    typecheck(p)
    assert p.graph.is_acyclic()
    assert all(isinstance(s, Stage) for s in p.graph.nodes)
    assert p.kinds()[-2:] == ["state_pass", "output"]
    text = format_plan(p)
    for s in p.stages():
        assert s.name in text
        for o in s.outputs:
            assert f"{o.name}: {o.shape} {o.dtype}" in text
    dot = plan_to_dot(p)
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    for s in p.stages():
        assert f'"{s.name}"' in dot
    # every consumed operand is produced upstream or is a plan input
    inputs = {o.name for o in p.inputs}
    seen: set[str] = set()
    for s in p.stages():
        assert set(s.inputs) <= inputs | seen, (s.name, set(s.inputs) - inputs - seen)
        seen |= set(s.output_names)
    assert {r for r, _ in p.outputs} >= {"o", "S"}


def _shape(p: Plan) -> tuple[list[tuple[str, str]], set[tuple[str, str]]]:
    """Stage kinds and edges, without attributes or operand shapes."""
    return [(s.name, s.kind) for s in p.stages()], {(a.name, b.name) for a, b in p.graph.edges}


def test_gla_and_simple_gla_differ_by_the_vector_decay_scores():
    gla, sgla = plan("gla"), plan("simple_gla")
    assert gla.family == sgla.family == "additive"
    # vector decay forms Q⋆A in an interaction stage (sub-chunk references) and the state passes' decayed keys
    # in decay_keys; scalar decay forms the scores inside the output
    assert [s.kind for s in gla.stages()] == ["chunk_cumsum", "interaction", "decay_keys", "state_pass", "output"]
    assert gla.stage("state_pass").role("K0") == "Kg" and gla.stage("output").role("Qg") == "Qg"
    assert [s.kind for s in sgla.stages()] == ["chunk_cumsum", "state_pass", "output"]
    assert gla.stage("output").role("M0") == "Sqa" and sgla.stage("output").attr("inline_scores")
    assert gla.stage("output").attr("decay") == "vector" and sgla.stage("output").attr("decay") == "scalar"
    assert gla.operand("b").shape == "[B,T,HV,dk]" and sgla.operand("b").shape == "[B,T,HV]"
    for name in ("la", "retnet", "mamba2", "exact_atq"):
        assert "interaction" not in plan(name).kinds() and "wy" not in plan(name).kinds()
    assert "wy" not in plan("ccq_gla").kinds()


def test_delta_family_plans_have_interaction_solve_wy():
    for name in ("deltanet", "gdn", "kda", "gdn2", "pgdn", "pkda", "exact_atk", "cler_h_kda"):
        p = plan(name)
        assert p.family == "tied"
        kinds = p.kinds()
        for k in ("interaction", "triangular_solve", "wy", "state_pass", "output"):
            assert k in kinds, (name, k)
        vector = p.stage("interaction").attr("decay") == "vector"
        # L' only, the output forms Q⋆A itself; vector decay: the interaction also forms Q⋆A
        assert len(p.stage("interaction").outputs) == (2 if vector else 1)
        assert p.stage("output").attr("inline_scores") == (not vector)
    # routes and fused gates change operands, not the stages
    assert _shape(plan("gdn")) == _shape(plan("clvr_gdn"))
    gdn_stages, gdn_edges = _shape(plan("gdn"))
    cler_stages, cler_edges = _shape(plan("cler_h_gdn"))
    # the residual route's R is the state pass's own (residual_solve): gdn's graph, no L' edge to the state pass
    assert cler_stages == gdn_stages and cler_edges == gdn_edges
    assert ("interaction", "state_pass") not in _shape(plan("cler_h_kda"))[1]
    assert Counter(plan("gdn_fused_gate").kinds()) - Counter(plan("gdn").kinds()) == Counter(gates=1)
    assert plan("kda").stage("interaction").attr("subchunk") and not plan("gdn").stage("interaction").attr("subchunk")


@pytest.mark.parametrize("name", SPECS)
def test_output_runs_in_the_state_pass_launch_for_scalar_and_no_decay(name):
    """Scalar or no decay, one write stream, 16-bit query and write key (CCQ's q̂ is read as the 16-bit half of its
    pair): the output is fused into the state pass's launch (H_n stays in registers), the residual route too (its R is
    the state pass's own, compiler/plan.py: residual_solve); per-channel decay, the untied DPLR family and a fp32 k̃ / q̂
    (PDN, exact preconditioner: NaN on sm_90 under Triton 3.6) keep two launches."""
    from dgps.compiler.plan import build_backward_plan, launch_of

    p = plan(name)
    fused = name in {"clvr_gdn", "deltanet", "gdn", "gdn_fused_gate", "la", "longhorn", "mamba2", "retnet", "simple_gla",
                     "ccq_gdn", "ccq_gdn_uncentered", "cler_h_gdn"}
    assert (p.stage("output").attr("fused") == "state_pass") == fused, name
    assert launch_of(p.stage("output")) == ("state_pass" if fused else "output")
    output_line = next(line for line in format_plan(p).splitlines() if line.split()[:2] == ["output", "output"])
    assert ("fused=state_pass" in output_line) == fused
    # the backward reruns the state pass alone (it stores H_n and U for the backward stages)
    bp = build_backward_plan(p)
    assert bp is None or ("state_pass" in bp.recomputed and "output" not in bp.recomputed)


@pytest.mark.parametrize("name", SPECS)
def test_inference_forms_wy_in_the_fused_state_pass(name):
    """Where the output runs in the state pass's launch, the tied family with inclusive erase rows and no residual
    route forms the wy stage there too in an inference call (compiler/plan.py: wy_in_inference_state_pass): that
    call launches no wy kernel and the fused kernel's WY variant. A training forward still launches wy and stores W
    and Ũ, which the backward plan keeps for its state passes."""
    from dgps.codegen.chunk import forward_launches, inference_forward_launches
    from dgps.compiler.plan import build_backward_plan, wy_in_inference_state_pass

    p = plan(name)
    wy = p.find("wy")
    want = bool(wy) and p.family == "tied" and p.stage("output").attr("fused") == "state_pass" and \
        p.structure.route != "residual" and wy[0].attr("row_decay") == "inclusive"
    assert wy_in_inference_state_pass(p) == want, name
    assert ("inference_fused=state_pass" in format_plan(p)) == want
    names = [la.name for la in inference_forward_launches(p)]
    assert names == ([la.name.replace("state_output", "state_output_wy") for la in forward_launches(p)
                      if la.name != "wy"] if want else [])
    bp = build_backward_plan(p)
    if want and bp is not None:
        assert "wy" in bp.kept and "wy" in [la.name for la in forward_launches(p)]


def test_gdn_kda_same_shape_different_decay():
    gdn, kda = build_plan(rec("gdn").ir, 64, 16), build_plan(rec("kda").ir, 64, 16)
    kinds = lambda p: [s.kind for s in p.stages() if s.kind != "l2norm"]  # noqa: E731
    # per-channel decay adds the decayed keys of the state passes
    assert [k for k in kinds(kda) if k != "decay_keys"] == kinds(gdn) and "decay_keys" in kinds(kda)
    assert gdn.stage("interaction").attr("decay") == "scalar" and kda.stage("interaction").attr("decay") == "vector"


def test_pgdn_adds_precond_diag_feeding_the_write_key():
    p, base = plan("pgdn"), plan("gdn")
    assert Counter(p.kinds()) - Counter(base.kinds()) == Counter(gates=1, chunk_cumsum=1, precond_diag=1)
    pre = p.stage("precond_diag")
    kw = pre.outputs[0].name
    assert p.stage("interaction").role("A") == kw  # write key: columns of L' = E ⋆⁻ A
    assert p.stage("interaction").role("E") == "kn"  # erase key stays k
    assert p.stage("state_pass").role("K0") == kw and p.stage("output").role("K0") == kw
    assert p.stage("output").role("Q") == "qn"  # the read key/query is untouched
    assert p.graph.has_edge(p.stage("cumsum_gP"), pre)
    assert pre.outputs[1].shape == "[N,H,dk]"  # statistics per key head (shared by grouped value heads)


def test_ccq_adds_curvature_query_feeding_the_output_query():
    for name, base, extra in (("ccq_gdn", "gdn", Counter(curvature_state=1, curvature_query=1)),
                              ("ccq_gla", "gla", Counter(curvature_state=1, curvature_query=1, l2norm=1))):
        p = plan(name)
        assert Counter(p.kinds()) - Counter(plan(base).kinds()) == extra
        cq = p.stage("curvature_query")
        assert p.stage("output").role("Q") == cq.outputs[0].name
        assert p.graph.has_edge(cq, p.stage("output"))
        # the sums' state pass feeds the chunk-parallel read; the backward forms its C_n again where it reads them
        cs = p.stage("curvature_state")
        assert p.graph.has_edge(cs, cq) and cs.outputs[0].shape == "[B,NT,H,dk,dk]"
        bp = build_backward_plan(p)
        assert bp is not None and "curvature_state" not in bp.recomputed
        again = next(m for m in bp.memory if m.kind == "curvature_state")
        assert not again.kept and again.reformed_by == "bwd_curvature_sums" and "curvature_state" not in bp.kept
        assert bp.kinds().index("bwd_curvature_sums") == bp.kinds().index("bwd_curvature_query") - 1
        # the write path is unchanged: nothing on it reads q̂ (vector decay: only the interaction's Q⋆A does)
        for s in p.stages():
            if s.kind in ("triangular_solve", "wy", "state_pass"):
                assert cq.outputs[0].name not in s.inputs
            if s.kind == "interaction":
                assert (cq.outputs[0].name in s.inputs) == (s.attr("decay") == "vector")


def test_exact_precond_placement():
    atk, atq = plan("exact_atk"), plan("exact_atq")
    assert atk.stage("interaction").role("A") == atk.stage("precond_exact").outputs[0].name
    assert atq.stage("output").role("Q") == atq.stage("precond_exact").outputs[0].name
    assert atq.family == "additive"


def test_rwkv7_dplr_untied_four_matrices():
    p = plan("rwkv7_dplr")
    assert p.family == "untied"
    inter = p.stage("interaction")
    assert len(inter.outputs) == 4 and len(inter.attr("matrices")) == 4
    assert inter.attr("row_decay") == "exclusive"  # the erase reads S_{t-1}: rows use b_{t-1}
    assert p.stage("cumsum_g").attr("exclusive")
    assert p.stage("triangular_solve").role("L") == "Aef"
    assert not p.stage("output").attr("inline_scores")


def test_routes():
    assert dict(plan("cler_h_gdn").outputs)["route"] == "r"
    assert "r" in plan("cler_h_gdn").stage("state_pass").output_names
    assert dict(plan("clvr_gdn").outputs)["route"] == "v"  # the write value is an input: no stage
    assert "route" not in dict(plan("gdn").outputs)


def test_plan_depends_on_structure_not_name():
    src = (SPEC_DIR / "gdn.dgps").read_text().replace("recurrence gdn", "recurrence something_else")
    other = build_plan(load(src).ir)
    assert format_plan(other).replace("something_else", "gdn") == format_plan(plan("gdn"))


def test_typecheck_rejects_broken_plans():
    p = plan("kda")
    g = p.graph.copy()
    g.remove_node(p.stage("triangular_solve"))
    with pytest.raises(PlanTypeError, match="Tm"):
        typecheck(replace(p, graph=g))
    g = p.graph.copy()
    wy = p.stage("wy")
    bad = replace(wy, outputs=(replace(wy.outputs[0], shape="[B,T,HV,dv]"), wy.outputs[1]))
    g = g.relabel({wy: bad})
    with pytest.raises(PlanTypeError):
        typecheck(replace(p, graph=g))


def test_bad_chunk_sizes():
    with pytest.raises(ValueError):
        build_plan(rec("gla").ir, 0)


# --- the interpreter against the reference -------------------------------------------------------------
def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


def initial(r: Recurrence, dims: Dims, N: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Valid random initial states: P SPD, C PSD, A > 0, n a count."""
    out = {}
    for n, shp in state_shapes(r.ir, dims, N).items():
        z = torch.randn(shp, generator=gen, dtype=torch.float64)
        if n == "P":
            z = torch.eye(shp[-1], dtype=torch.float64) + 0.1 * z @ z.mT
        elif n == "C":
            z = z @ z.mT
        elif n == "A":
            z = z.abs()
        elif n == "n":
            z = torch.randint(0, 20, shp, generator=gen).to(torch.float64)
        out[n] = z
    return out


def strong_decay(r: Recurrence, x: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Log-gates uniform in [−100, 0]; decays computed from params (−exp(A_log)·Δ) made strong too."""
    x = dict(x)
    for d in r.ir.inputs:
        if d.domain == "log_gate":
            x[d.name] = -100.0 * torch.rand(x[d.name].shape, generator=gen, dtype=torch.float64)
        elif d.is_param and d.name == "A_log":
            x[d.name] = torch.full_like(x[d.name], 4.0)
    return x


def check(name: str | Recurrence, *, B=2, T=50, H=2, G=1, dk=8, dv=6, chunk=16, sub=16, seed=0, varlen=None,
          states=False, strong=False) -> float:
    r = rec(name) if isinstance(name, str) else name
    gen = torch.Generator().manual_seed(seed + 1)
    x = r.random_inputs(B, T, H, dk, dv, HV=H * G, seed=seed)
    if strong:
        x = strong_decay(r, x, gen)
    cu = torch.tensor(varlen) if varlen is not None else None
    N = len(varlen) - 1 if varlen is not None else B
    init = initial(r, Dims(B, T, H, H * G, dk, dv), N, gen) if states else None
    ref = reference(r.ir, x, initial_state=init, output_final_state=True, cu_seqlens=cu)
    got = run_plan(build_plan(r.ir, chunk, sub), r.ir, x, initial_state=init, output_final_state=True, cu_seqlens=cu)
    assert got.o.shape == ref.o.shape and got.o.dtype == torch.float64
    assert torch.isfinite(got.o).all()
    errs = {"o": rel_err(got.o, ref.o)}
    assert got.final_state is not None and ref.final_state is not None
    assert set(got.final_state) == set(ref.final_state) == set(r.ir.state_names)
    for n, v in ref.final_state.items():
        assert got.final_state[n].shape == v.shape, n
        assert torch.isfinite(got.final_state[n]).all()
        errs[n] = rel_err(got.final_state[n], v)
    assert (got.route is None) == (ref.route is None)
    if ref.route is not None:
        errs["route"] = rel_err(got.route, ref.route)
    worst = max(errs.values())
    assert worst <= TOL, errs
    return worst


CASES = {
    "T1": dict(T=1),
    "ragged": dict(T=50, chunk=16, sub=8),
    "varlen": dict(B=1, T=50, chunk=16, sub=4, varlen=[0, 7, 23, 24, 50], states=True),
    "gva_states": dict(T=37, G=2, chunk=8, sub=4, states=True),
    "strong_decay": dict(T=50, G=2, chunk=16, sub=4, strong=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", SPECS)
def test_interpreter_equals_reference(name, case):
    check(name, **CASES[case])


def test_strong_decay_really_is_strong():
    """Within a 16-token chunk the cumulative decay passes −709: e^{−b} factored from the chunk start would
    overflow even in float64, so a passing strong-decay test means the forms avoid it."""
    r = rec("kda")
    x = strong_decay(r, r.random_inputs(1, 16, 1, 4, 4), torch.Generator().manual_seed(0))
    assert float(x["g"].sum(1).min()) < -709


def test_decayed_scores_subchunk_equals_pairwise():
    gen = torch.Generator().manual_seed(0)
    c, d = 13, 5
    X, Y = (torch.randn(2, 3, c, d, generator=gen, dtype=torch.float64) for _ in range(2))
    g = -30 * torch.rand(2, 3, c, d, generator=gen, dtype=torch.float64)
    b = g.cumsum(-2)
    bx = b - g
    for strict in (False, True):
        for row in (b, bx):
            ref = decayed_scores(X, Y, row, b, strict=strict)
            for s in (1, 2, 4, 5):
                got = decayed_scores(X, Y, row, b, strict=strict, sub_chunk=s)
                assert rel_err(got, ref) < 1e-13


# --- structures beyond the library: the rules compose ----------------------------------------------------
EXTRA_SPECS = {
    # untied DPLR whose erase reads the decayed state (inclusive row decay)
    "dplr_decayed": """recurrence dplr_decayed
  input q, k  : key
  input v     : value
  input w     : key_channel log_gate
  input kappa : key_channel
  input iclr  : key_channel unit
  let   khat = kappa / sqrt(kappa * kappa + 1e-6)
  decay vector(w)
  solve dplr(e = -khat, f = khat * iclr)
end
""",
    # a dplr with f = w is tied: the cheap plan, with the exclusive row decay of an undecayed erase
    "dplr_tied_undecayed": """recurrence dplr_tied_undecayed
  input q, k  : key
  input v     : value
  input g     : token log_gate
  input a     : key_channel unit
  normalize q, k
  decay scalar(g)
  solve dplr(e = -a * k, f = k, reads = undecayed)
end
""",
    # a diagonal preconditioner on the query, without a statistic decay
    "atq_diag": """recurrence atq_diag
  input q, k   : key
  input v      : value
  input betaP  : token unit
  param mu     : head = -0.2
  normalize q, k
  precond diag(k * k, gain = betaP) -> exp(-log(1.5) * softsign(log(A + 1e-6) - mu)) on query
  solve   additive
end
""",
    # key/value gains on an additive write, and a value route that is computed (w ⊙ v)
    "gla_gains_route": """recurrence gla_gains_route
  input q, k : key
  input v    : value
  input g    : key_channel log_gate
  input b    : key_channel unit
  input w    : value_channel unit
  decay vector(g)
  gain  key = b, value = w
  solve additive
  route value
end
""",
    # exact ATK with a decay, a gain and the residual route
    "exact_atk_gdn": """recurrence exact_atk_gdn
  input q, k : key
  input v    : value
  input g    : token log_gate
  input beta : token unit
  decay scalar(g)
  gain beta
  precond exact(lambda = 0.5) on write_key
  solve   delta
  route residual
end
""",
    # PDN statistics on the write key and CCQ on the query, together
    "ccq_pkda": """recurrence ccq_pkda
  input q, k   : key
  input v      : value
  input g      : key_channel log_gate
  input beta   : token unit
  input gP     : token log_gate key_head
  input betaP  : token unit key_head
  input lam    : token unit
  param mu     : head key_head = -0.2
  normalize q, k
  decay   vector(g)
  gain    beta
  precond diag(k * k, decay = gP, gain = betaP) -> exp(-log(1.5) * softsign(log(A + 1e-6) - mu)) on write_key
  solve   delta
  read    curvature(lam, centered)
  route   value
end
""",
}

EXTRA_FAMILY = {"dplr_decayed": "untied", "dplr_tied_undecayed": "tied", "atq_diag": "additive",
                "gla_gains_route": "additive", "exact_atk_gdn": "tied", "ccq_pkda": "tied"}


@pytest.mark.parametrize("name", sorted(EXTRA_SPECS))
def test_composed_structures(name):
    r = load(EXTRA_SPECS[name])
    p = build_plan(r.ir, 16, 4)
    assert p.family == EXTRA_FAMILY[name]
    assert ("bx" in {o.name for s in p.stages() for o in s.outputs}) == (name == "dplr_tied_undecayed")
    for case in ("T1", "varlen", "gva_states", "strong_decay"):
        check(r, **CASES[case])


# --- hypothesis: inputs, T, chunk sizes ------------------------------------------------------------------
HYP_SPECS = ["gla", "kda", "gdn2", "pgdn", "ccq_gdn", "exact_atk", "rwkv7_dplr", "mamba2"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(HYP_SPECS), seed=st.integers(0, 2**16), T=st.integers(1, 40),
       chunk=st.sampled_from([4, 8, 16]), sub=st.sampled_from([2, 4, 16]), G=st.sampled_from([1, 2]),
       states=st.booleans(), strong=st.booleans(), varlen=st.booleans())
def test_interpreter_hypothesis(name, seed, T, chunk, sub, G, states, strong, varlen):
    cu = None
    if varlen and T >= 3:
        cut = sorted({1 + seed % (T - 1), 1 + (seed // 7) % (T - 1)})
        cu = [0, *cut, T]
    check(name, B=1 if cu else 2, T=T, H=1, G=G, dk=4, dv=3, chunk=chunk, sub=sub, seed=seed, varlen=cu,
          states=states, strong=strong)


# --- the backward plan ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SPECS)
def test_backward_plan(name):
    from dgps.compiler.plan import (
        KEEP_SCORES,
        QA_IN_REVERSE_PASS,
        SCORES_WITH_PRECONDITIONER,
        SCORES_WITH_READ_CORRECTION,
        build_backward_plan,
        scores_in_reverse_pass,
        scores_kept,
    )

    p = plan(name)
    bp = build_backward_plan(p)
    ir = rec(name).ir
    if not ir.structure.tied and ir.decay.kind != "vector":
        assert bp is None
        assert "backward: recurrent" in format_plan(p)
        return
    assert bp is not None
    kinds = bp.kinds()
    # per-channel decay: the score gradients go to memory once and the pair gradients are formed on sub-blocks; the
    # delta family's scalar or no decay: the c×c adjoints once per chunk (bwd_solve), then per key block
    vector = ir.decay.kind == "vector"
    intra = ["bwd_scores", "bwd_intra"] if vector else ["bwd_solve"] if p.family == "tied" else []
    # the additive family without a route: the reverse pass carries dH alone, split over key blocks, and dU follows it
    split = p.family == "additive" and ir.route == "none"
    # stored scores the reverse pass forms dU's local share from (compiler/plan.py: scores_in_reverse_pass): the
    # output's (scalar or no decay, no preconditioner: KEEP_SCORES) or the interaction's Q⋆A (per-channel decay:
    # QA_IN_REVERSE_PASS)
    local = scores_in_reverse_pass(p)
    assert (local is not None) == (p.family == "tied" and
                                   (QA_IN_REVERSE_PASS and ir.route == "none" and ir.read.kind == "none" if vector else
                                    KEEP_SCORES and (ir.precond.kind == "none" or SCORES_WITH_PRECONDITIONER) and
                                    (ir.read.kind == "none" or SCORES_WITH_READ_CORRECTION)))
    first = ["bwd_state_pass", "bwd_local_values"] if split else ["bwd_state_pass"] if local else \
        ["bwd_local_values", "bwd_state_pass"]
    assert kinds[:len(first) + 1 + len(intra)] == [*first, *intra, "bwd_grads"]
    assert (local == "output.Sc") == scores_kept(p) == ("output" in bp.kept)
    assert local is None or local in bp.reads()
    state = bp.stages[kinds.index("bwd_state_pass")]
    assert (state.attr("key_blocks") == "split") == split and ("dU" in state.output_names) != split
    assert (p.stage("state_pass").attr("key_blocks") is not None) == split
    # the decayed keys: read only by the state passes, freed before the peak either way: kept, not relaunched
    assert ("decay_keys" in p.kinds()) == vector and "decay_keys" not in bp.recomputed
    assert ("decay_keys" in bp.kept) == vector
    # bwd_inputs runs unless bwd_grads finished every gradient (elementwise chain rule: no L2 norm, gain or gate, but
    # a per-channel log gate that is one input: compiler/plan.py direct_gate_input)
    direct = direct_gate_input(p)
    assert (direct is not None) == (vector and p.family != "untied" and isinstance(p.role("g"), sp.Symbol))
    done = set(p.elementwise_grads) | ({direct} if direct else set())
    assert (kinds[-1] == "bwd_inputs") == (done != {d.name for d in ir.inputs})
    assert ("bwd_curvature_query" in kinds) == ("bwd_curvature_key" in kinds) == (ir.read.kind == "curvature")
    if ir.read.kind == "curvature":  # C_n formed again, dq and dλ per chunk; the keys' adjoint carry in reverse, then dk
        i = kinds.index("bwd_curvature_sums")
        assert kinds[i:i + 4] == ["bwd_curvature_sums", "bwd_curvature_query", "bwd_curvature_carry", "bwd_curvature_key"]
    assert ("bwd_precond_diag" in kinds) == (ir.precond.kind == "diag")
    # the exact preconditioner: the chunk-parallel stage, then the reverse pass of the Gram adjoint, before bwd_inputs
    exact = ["bwd_precond_exact", "bwd_precond_gram", "bwd_inputs"]
    assert (kinds[-3:] == exact) == (ir.precond.kind == "exact")
    # inputs and initial states are all it saves; every forward stage but the output is recomputed
    assert set(bp.saved) == {o.name for o in p.inputs}
    assert "output" not in bp.recomputed and "state_pass" in bp.recomputed
    grads = [o.name for st in bp.stages for o in st.outputs if o.name.startswith("grad_")]
    assert sorted(grads) == sorted(f"grad_{d.name}" for d in kernel_ir(ir).inputs)  # each gradient from exactly one stage
    # the elementwise chain rule where the adjoints are formed: bwd_grads, and bwd_solve for the value side
    fused = [o.name for st in bp.stages[len(first):len(first) + 1 + len(intra)] for o in st.outputs
             if o.name.startswith("grad_")]
    assert sorted(fused) == sorted(f"grad_{n}" for n in done)
    if "bwd_solve" in kinds:
        solve = bp.stages[kinds.index("bwd_solve")]
        assert all(o.dims[-1] == "dv" for o in solve.outputs if o.name.startswith("grad_") or o.name == "dz")
    assert all(ir.input(n).vector and n not in ir.normalize for n in p.elementwise_grads)
    assert "backward (chunked)" in format_plan(p)


@pytest.mark.parametrize("name", ["pgdn", "pkda"])
def test_memory_model_keeps_the_statistic_as_chunk_carries(name):
    """The preconditioned specs' memory model: k̃ and the statistic's chunk-start carries A_n are kept (8 B per token
    and head for the carries, not 512 for the per-token statistic), from which bwd_precond_diag re-forms it after the
    chunk gradients and forms each input's share of k̃'s and the increment's chain rule (bwd_inputs reads the shares,
    not the statistic); the statistic's increment is evaluated on loads; W and Ũ are kept, read only by the state
    passes (freed before the peak); H_n is rerun; the printed model names every decision."""
    from dgps.compiler.plan import PEAK_PHASE, build_backward_plan, bytes_per_token

    p = plan(name)
    bp = build_backward_plan(p)
    assert bp is not None
    m = {d.kind: d for d in bp.memory}
    assert [o.name for o in m["precond_diag"].kept] == ["kw", "An"] and m["precond_diag"].kept_bytes == 520
    assert m["gates"].recompute and m["gates"].cost == "loads" and not m["gates"].kept
    assert not m["wy"].recompute and m["wy"].last_read < PEAK_PHASE
    assert m["state_pass"].recompute and "state_pass" in bp.recomputed
    assert bp.kept_bytes == sum(bytes_per_token(o) for d in bp.memory for o in d.kept)
    pd = next(st for st in bp.stages if st.kind == "bwd_precond_diag")
    assert pd.attr("reads") == ("precond_diag.An",)
    # k (a key tile per token), betaP and mu (per-token sums over key channels); no per-token statistic or dinc
    shares = {o.name: o.shape for o in pd.outputs if o.name.startswith("dpre_")}
    assert shares == {"dpre_k": "[B,T,H,dk]", "dpre_betaP": "[B,T,H]", "dpre_mu": "[B,T,H]"}
    inputs = next(st for st in bp.stages if st.kind == "bwd_inputs").inputs
    assert set(shares) <= set(inputs) and not {"A_t", "dinc"} & set(inputs)
    text = format_plan(p)
    assert "memory model" in text and all(d.why in text for d in bp.memory)


def test_backward_plan_typecheck_catches_a_missing_adjoint():
    from dgps.compiler.plan import BackwardPlan, build_backward_plan, typecheck_backward

    p = plan("pgdn")
    bp = build_backward_plan(p)
    assert bp is not None
    without_grads = BackwardPlan(bp.name, bp.saved, bp.recomputed, tuple(s for s in bp.stages if s.kind != "bwd_grads"))
    with pytest.raises(PlanTypeError, match="consumes `dkw`"):
        typecheck_backward(p, without_grads)


# --- the untied DPLR chunk backward, derived in float64 (docs/chunk_forms.md §2b) ------------------------------------
def _dplr_sequential(q, e, f, w, v, g, S0, *, exclusive: bool, scale: float):  # noqa: ANN001, ANN202
    h, os_ = S0, []
    for t in range(q.shape[0]):
        hd = torch.exp(g[t])[:, None] * h
        u = (h if exclusive else hd).mT @ e[t]  # the erase reads S_{t-1} or S̄_t
        h = hd + torch.outer(f[t], u) + torch.outer(w[t], v[t])
        os_.append(scale * h.mT @ q[t])
    return torch.stack(os_), h


@pytest.mark.parametrize("exclusive", [True, False], ids=["undecayed", "decayed"])
@pytest.mark.parametrize("T", [1, 64, 150])
def test_untied_chunk_backward_equals_autograd(exclusive: bool, T: int) -> None:
    """Every stage of the untied DPLR chunk backward (the formulas the kernels implement) against autograd through
    the sequential recurrence: three chunks, the last ragged, and gates strong enough that e^B underflows."""
    gen = torch.Generator().manual_seed(T)
    dk, dv = 8, 6

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    kap = torch.nn.functional.normalize(r(T, dk), dim=-1)
    iclr = torch.rand(T, dk, generator=gen, dtype=torch.float64)
    g = -torch.rand(T, dk, generator=gen, dtype=torch.float64) * 3
    g[:, :2] = -60.0
    xs = dict(q=r(T, dk), e=-kap, f=kap * iclr, w=0.3 * r(T, dk), v=r(T, dv), g=g, S0=0.1 * r(dk, dv))
    xs = {k: x.requires_grad_() for k, x in xs.items()}
    o, h = _dplr_sequential(**xs, exclusive=exclusive, scale=0.7)
    do, dS = r(*o.shape), r(*h.shape)
    want = torch.autograd.grad((o * do).sum() + (h * dS).sum(), list(xs.values()))
    got = untied_chunk_backward(*(x.detach() for x in xs.values()), do, dS, scale=0.7, exclusive=exclusive)
    for n, w_ in zip(xs, want, strict=True):
        assert rel_err(got["dS0" if n == "S0" else f"d{n}"], w_) < 1e-12, n


def _sherman_morrison(k: torch.Tensor, a: torch.Tensor, P0: torch.Tensor, atk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequential reference's exact preconditioner, line for line (runtime/reference.py): x_t and P_final."""
    P, xs = P0, []
    for t in range(k.shape[0]):
        Pk = P @ k[t]
        d = 1 + k[t] @ Pk
        P = P - torch.outer(Pk, Pk) / d
        xs.append(Pk / d if atk else P @ a[t])
    return torch.stack(xs), P


@pytest.mark.parametrize("placement", ["write_key", "query"])
@pytest.mark.parametrize("T", [50, 150])
def test_exact_precond_backward_equals_autograd(placement: str, T: int) -> None:
    """The chunked exact-preconditioner backward (docs/chunk_forms.md §6b: z = P_t dx_t, the Gram adjoint's reverse
    carry, the reference's antisymmetric P_0 adjoint) equals autograd through the Sherman–Morrison recursion, float64;
    a final-state gradient that is not symmetric, chunks of 16 (T = 50: a short last chunk)."""
    gen = torch.Generator().manual_seed(T)
    dk = 8
    k = torch.randn(T, dk, generator=gen, dtype=torch.float64, requires_grad=True)
    q = torch.randn(T, dk, generator=gen, dtype=torch.float64, requires_grad=True)
    keys = torch.randn(3, dk, generator=gen, dtype=torch.float64)
    P0 = torch.linalg.inv(0.7 * torch.eye(dk, dtype=torch.float64) + keys.T @ keys).requires_grad_()
    dx = torch.randn(T, dk, generator=gen, dtype=torch.float64)
    dP = torch.randn(dk, dk, generator=gen, dtype=torch.float64)
    atk = placement == "write_key"
    x, PT = _sherman_morrison(k, q, P0, atk)
    want = torch.autograd.grad((x * dx).sum() + (PT * dP).sum(), (k, q, P0), allow_unused=True)
    got = exact_precond_backward(k.detach(), (k if atk else q).detach(), P0.detach(), dx, dP, placement=placement, C=16)
    for name, w in (("dk", want[0]), ("dP0", want[2])) + (() if atk else (("da", want[1]),)):
        err = ((got[name] - w).norm() / w.norm()).item()
        assert err < 1e-12, f"{placement} {name}: {err:.2e}"


# Launch settings Triton 3.6 built wrong for sm_90, found on the H200 by benchmarks/check_gpu_grads.py (the interpreter
# gives the right values for them): the shipped table must not return them at the head sizes they were seen at.
MISBUILT_ON_SM90 = [
    # (stage, dk, dv, decay, family, route, (BK, BV, warps, stages)): ccq_gdn's dλ 1.39 relative error (run 43;
    # codegen/launch.py)
    ("bwd_curvature_query", 128, 128, "scalar", "tied", "none", (64, 32, 4, 1)),
]


@pytest.mark.parametrize(("stage", "dk", "dv", "decay", "family", "route", "cfg"), MISBUILT_ON_SM90)
def test_launch_table_avoids_settings_misbuilt_for_sm90(stage: str, dk: int, dv: int, decay: str, family: str, route: str,
                                                         cfg: tuple) -> None:
    from dgps.codegen.launch import table_launch

    for n_state in (None, 1, 16, 64, 1024):  # the settings picked by the call's sequences × value heads too
        assert table_launch(stage, dk, dv, decay, family, route, n_state) != cfg


def test_launch_table_by_sequences_and_heads() -> None:
    """The sequential passes' settings follow the call's sequences × value heads (n_state): the state pass at BV 64 /
    4 stages where that still fills the H200 (B = 4, H = 16), BV 32 / 3 stages and BV 16 reverse and fused passes for
    few (B = 1, H = 16: 64 programs at BV 32), the reference settings where the call is not known (the printed table)."""
    from dgps.codegen.launch import few_state_programs, table_launch

    assert few_state_programs(16, 128) and not few_state_programs(64, 128) and not few_state_programs(None, 128)
    assert few_state_programs(64, 16)  # dv = 16: one value block per sequence and head
    tied = ("scalar", "tied", "none")
    assert table_launch("state_pass", 128, 128, *tied, 64) == table_launch("state_pass", 128, 128, *tied) == (64, 64, 4, 4)
    assert table_launch("state_pass", 128, 128, *tied, 16) == (64, 32, 4, 3)
    assert table_launch("bwd_state", 128, 128, *tied, 16)[1] == table_launch("state_output", 128, 128, *tied, 16)[1] == 16
    assert table_launch("bwd_state", 128, 128, *tied, 64)[1] == 32
    # the untied family keeps its own settings whatever the batch; the residual route's state pass takes BV 64 / 4
    # stages only where the call fills the GPU (runs 83, 85), as the tied family's
    untied = ("vector", "untied", "none")
    assert table_launch("state_pass", 128, 128, *untied, 16) == table_launch("state_pass", 128, 128, *untied)
    for decay in ("scalar", "vector"):
        residual = (decay, "tied", "residual")
        assert table_launch("state_pass", 128, 128, *residual, 64) == (64, 64, 4, 4)
        assert table_launch("state_pass", 128, 128, *residual, 16)[1] == 32
    # the additive family's split passes (one key block per program): BV 64 / 3 stages, BV 32 for few (run 82)
    additive = ("scalar", "additive", "none")
    for stage in ("state_pass", "bwd_state"):
        assert table_launch(stage, 128, 128, *additive, 64) == (64, 64, 4, 3)
        assert table_launch(stage, 128, 128, *additive, 16) == (64, 32, 4, 3)
    # the diagonal preconditioner's fp32 k̃ stream: its reverse pass at BV 64 / 3 stages (run 83), gdn's at BV 32
    assert table_launch("bwd_state", 128, 128, *tied, 64, "diag") == (64, 64, 4, 3)


def test_stage_graph_order_and_cycles():
    from dgps.compiler.graph import StageGraph

    g = StageGraph()
    for n in ("a", "b", "c", "d"):
        g.add_node(n)
    g.add_edge("c", "a", operands=["x"])
    g.add_edge("d", "b", operands=["y"])
    # ready nodes leave in the order they were added: c before d, a (ready after c) before d
    assert g.topological_order() == ["c", "a", "d", "b"]
    assert g.topological_order(key=lambda n: -ord(n)) == ["d", "c", "b", "a"]
    assert g.edges["c", "a"] == {"operands": ["x"]} and g.number_of_edges() == 2
    assert list(g.predecessors("b")) == ["d"] and g.is_acyclic()
    h = g.relabel({"a": "z"})
    assert h.nodes == ["z", "b", "c", "d"] and h.has_edge("c", "z") and not h.has_edge("c", "a")
    g.add_edge("a", "c")
    assert not g.is_acyclic()
    with pytest.raises(ValueError, match="cycle"):
        g.topological_order()


def test_typecheck_rejects_a_cycle():
    p = plan("gdn")
    g = p.graph.copy()
    g.add_edge(p.stage("output"), p.stage("interaction"), operands=["o"])
    with pytest.raises(PlanTypeError, match="cycle"):
        typecheck(replace(p, graph=g))
