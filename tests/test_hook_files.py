"""The chunk templates' hook files: the route's (codegen/templates/chunk_route_{none,value,residual}.jinja,
codegen/chunk.py route_hook) and the values' (chunk_values_{solved,plain}.jinja: U from the WY solve or as β Z). The
same macros in each file of a set, one per hook point, so that a template renders whichever the plan picks; the plan
picks the file; and a spec without a route renders what the value route leaves out. Also the curvature read's
(chunk_curvature_{centered,uncentered}.jinja: CCQ's mean term or none). And the recurrent kernels' hook sets
(recurrent[_bwd]_{precond,read,solve}_*.jinja)."""

from __future__ import annotations

from pathlib import Path

import jinja2
import jinja2.nodes
import pytest

import dgps
from dgps.codegen.chunk import BC, BT, ROUTE_HOOKS, render_chunk, route_hook
from dgps.codegen.jinja_env import TEMPLATES, template_env
from dgps.compiler.plan import build_plan

SPECS = Path(__file__).resolve().parents[1] / "specs"


def _exported(name: str) -> set[str]:
    """The names a hook file defines at its top level (macros, and the value file's names set from the plain one's)."""
    tree = template_env().parse((TEMPLATES / name).read_text())
    names = {m.name for m in tree.find_all(jinja2.nodes.Macro)}
    names |= {a.target.name for a in tree.find_all(jinja2.nodes.Assign) if isinstance(a.target, jinja2.nodes.Name)}
    return names


def test_every_hook_file_defines_the_same_hooks() -> None:
    files = {route: _exported(name) for route, name in ROUTE_HOOKS.items()}
    assert len(files["none"]) >= 20
    for route, names in files.items():
        assert names == files["none"], (route, sorted(names ^ files["none"]))


def test_both_values_files_define_the_same_hooks() -> None:
    solved, plain = _exported("chunk_values_solved.jinja"), _exported("chunk_values_plain.jinja")
    assert solved == plain and {"state_pass_u", "state_output_u", "stored_u"} <= solved, sorted(solved ^ plain)


def test_both_curvature_files_define_the_same_hooks() -> None:
    centered, uncentered = _exported("chunk_curvature_centered.jinja"), _exported("chunk_curvature_uncentered.jinja")
    assert centered == uncentered and len(centered) >= 9, sorted(centered ^ uncentered)


def test_no_kernel_template_branches_on_what_a_hook_carries() -> None:
    """No kernel template branches on the route, on the residual route's solve form or on the curvature read's
    centering: the hooks carry them."""
    for path in sorted(TEMPLATES.glob("chunk_*.jinja")):
        if path.name.startswith(("chunk_route_", "chunk_values_")) or path.name in ("chunk_host.jinja",
                                                                                    "chunk_module.jinja"):
            continue
        text = path.read_text()
        assert "route ==" not in text and "route !=" not in text and "gain_cols" not in text, path.name
        assert "read_centered" not in text, path.name  # the curvature hook carries the centering


@pytest.mark.parametrize("spec, route", [("gdn", "none"), ("clvr_gdn", "value"), ("clvr_kda", "value"),
                                         ("cler_h_gdn", "residual"), ("cler_h_kda", "residual")])
def test_the_plan_picks_the_hook(spec: str, route: str) -> None:
    ir = dgps.load(SPECS / f"{spec}.dgps").ir
    assert route_hook(build_plan(ir, BT, BC)) == f"chunk_route_{route}.jinja"


def test_the_value_route_adds_its_store_and_its_adjoint() -> None:
    """clvr_gdn is gdn plus the value route: its module stores r and reads dR where gdn's does neither."""
    plain, routed = (render_chunk(dgps.load(SPECS / f"{n}.dgps").ir) for n in ("gdn", "clvr_gdn"))
    assert "tl.store(r_buf" not in plain and "tl.store(r_buf" in routed
    assert "tl.load(dr_buf" not in plain and "tl.load(dr_buf" in routed



# --- the recurrent kernels' hook files (codegen/recurrent.py, codegen/recurrent_bwd.py) ----------------------------

def _hook_sets() -> list[tuple[str, dict[str, str]]]:
    from dgps.codegen import recurrent, recurrent_bwd

    return [(f"{mod.__name__.rsplit('.', 1)[1]}.{table}", getattr(mod, table))
            for mod in (recurrent, recurrent_bwd) for table in ("PRECOND_HOOKS", "READ_HOOKS", "SOLVE_HOOKS")]


@pytest.mark.parametrize("table, files", _hook_sets(), ids=[t for t, _ in _hook_sets()])
def test_every_recurrent_hook_file_of_a_set_defines_the_same_macros(table: str, files: dict[str, str]) -> None:
    exported = {kind: _exported(name) for kind, name in files.items()}
    first = next(iter(exported.values()))
    assert len(first) >= 2, table
    for kind, names in exported.items():
        assert names == first, (table, kind, sorted(names ^ first))


def test_the_recurrent_templates_leave_structure_to_their_hooks() -> None:
    """recurrent.jinja and recurrent_bwd.jinja name no preconditioner kind, read kind or solve mode: the hook files
    (picked in codegen/recurrent.py and recurrent_bwd.py) carry them."""
    for name in ("recurrent.jinja", "recurrent_bwd.jinja"):
        text = (TEMPLATES / name).read_text()
        for branch in ("precond.kind", "read.kind", "solve.mode", "precond.placement", "erase_reads", "tied"):
            assert f"if {branch}" not in text and f"{branch} ==" not in text and f"{branch} !=" not in text, \
                (name, branch)


@pytest.mark.parametrize("spec, precond, read", [("gdn", "none", "plain"), ("pgdn", "diag", "plain"),
                                                  ("exact_atq", "exact", "plain"), ("ccq_gdn", "none", "curvature")])
def test_the_ir_picks_the_recurrent_hooks(spec: str, precond: str, read: str) -> None:
    """The structure picks the files, and what a hook adds shows in the module: the diagonal statistic's update, the
    Sherman-Morrison step, the curvature statistic."""
    from dgps.codegen.recurrent import PRECOND_HOOKS, READ_HOOKS, render_recurrent
    from dgps.codegen.recurrent_bwd import render_recurrent_backward

    ir = dgps.load(SPECS / f"{spec}.dgps").ir
    assert PRECOND_HOOKS[ir.precond.kind] == f"recurrent_precond_{precond}.jinja"
    assert READ_HOOKS[ir.read.kind] == f"recurrent_read_{read}.jinja"
    fwd, bwd = render_recurrent(ir), render_recurrent_backward(ir)
    assert ("st_A = " in fwd and "dA = " in bwd) == (precond == "diag")
    assert ("st_P = st_P - d_Pk" in fwd and "dP = " in bwd) == (precond == "exact")
    assert ("st_C += b_k" in fwd and "dC = " in bwd) == (read == "curvature")
    assert "#<omit>" not in fwd + bwd
