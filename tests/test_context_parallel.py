"""Context parallelism (runtime/cp.py): gloo groups of 2 and 4 processes against the unsharded call, the slice
layouts, the plan's refusals and the many-rank accuracy study."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from dgps.runtime import cp

WORKER = Path(__file__).resolve().parent / "cp_worker.py"
SPECS8 = ("gdn", "kda", "gla", "deltanet", "pgdn", "ccq_gdn", "gdn2", "cler_h_gdn")
TOL = 1e-5  # fp32, relative to the largest entry of each tensor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, cases: list[str], tmp: Path) -> dict[str, dict[str, float]]:
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port), str(tmp), *cases],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=900)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a CP rank hung (a collective mismatch?); logs so far: {logs}")
    results = {}
    for r, p in enumerate(procs):
        path = tmp / f"rank{r}.json"
        if p.returncode != 0 or not path.exists():
            pytest.fail(f"rank {r} failed (rc {p.returncode}):\n{logs[r][-4000:]}")
        for case, errs in json.loads(path.read_text()).items():
            results[f"{case}@rank{r}"] = errs
    return results


def _check(results: dict[str, dict[str, float]], cases: list[str], world: int) -> None:
    assert len(results) == len(cases) * world
    bad = {k: {n: e for n, e in errs.items() if not e <= TOL} for k, errs in results.items()}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"CP differs from the unsharded call (max relative error > {TOL}): {bad}"
    for case in cases:  # every gradient was compared: the inputs', and those of the given initial states
        errs = results[f"{case}@rank0"]
        assert ("o" in errs or "y" in errs) and any(n.startswith("d") for n in errs)
        assert case.startswith(("fla_", "layer_")) or any(n.startswith("final_") for n in errs)
        if case.endswith(":h0"):
            assert any(n.startswith("dh0_") for n in errs)


def _expected_counts(spec: str, continued: bool, later: bool) -> tuple[Counter, Counter]:
    """The launches per stage of one CP slice's forward and backward, from the chunk module's CP schedule: every
    stage once but the passes (compiler/plan.py: cp_stages); a pass whose adjoint is zero by the layout is skipped."""
    import importlib

    chunk = importlib.import_module(f"dgps.generated.{spec}").chunk
    ks = chunk._cp_kernels()
    aux = {k[0] for k in ks["aux"]}
    # the auxiliary offsets and the transition only where a later rank reads what they form
    fwd = Counter(k[0] for k in ks["once"] + ks["final"] + (ks["aux"] if later or not continued else []))
    fwd += Counter(k[0] for k in ks["after_aux"] if continued or k[0] not in aux)
    fwd += Counter(k[0] for k in ks["transition"] if continued and later)
    runs = {None: True, "first": continued, "aux_first": continued, "again": not continued or later,
            "aux_again": not continued or later}
    # a slice passes its route to the rerun where the state pass reads R from it (no wy then: Ũ is not kept)
    bwd = Counter(k[0] for k in chunk._rerun_kernels(True, route=chunk.ROUTE_FEEDS_RERUN))
    bwd += Counter(k[0] for k in chunk._cp_bwd_kernels() if k[2] != "hook" and runs[k[3]])
    return fwd, bwd


# a stage of the intra-chunk work (forward) or of the chunk gradients and the chain rule (backward): never repeated
INTRA = ("l2norm", "chunk_cumsum", "interaction", "wy", "decay_keys", "bwd_local_values", "bwd_scores", "bwd_intra",
         "bwd_grads", "bwd_curvature_query", "bwd_inputs")


def _check_counts(tmp: Path, cases: list[str], world: int) -> None:
    """Every CP call launched each stage as often as the plan's CP schedule says: the intra-chunk stages once per
    slice, forward and backward (the non-CP backward's count), the state passes once per pass."""
    import importlib

    for r in range(world):
        counts = json.loads((tmp / f"counts_rank{r}.json").read_text())
        for case in cases:
            if case.startswith(("fla_", "layer_")):
                continue
            c, spec = counts[case], case.split(":")[0]
            fwd, bwd = _expected_counts(spec, c["continued"], c["later"])
            assert (Counter(c["forward"]), Counter(c["backward"])) == (fwd, bwd), (case, r, c)
            chunk = importlib.import_module(f"dgps.generated.{spec}").chunk
            plain = Counter(k[0] for k in chunk._bwd_kernels())
            for stage in INTRA:
                assert c["forward"].get(stage, 0) <= 1, (case, r, stage)
                assert c["backward"].get(stage, 0) == plain.get(stage, 0), (case, r, stage)
            # the state pass: the transition (only where the slice continues a sequence) and the true pass, fused
            # with the output where the plan fuses them; the backward's reverse state pass once per nonzero adjoint
            passes = c["forward"].get("state_pass", 0) + c["forward"].get("state_output", 0)
            assert passes == 1 + (c["continued"] and c["later"]), (case, r, c)
            assert c["backward"]["bwd_state"] == c["continued"] + (not c["continued"] or c["later"]), (case, r, c)


def test_cp_stage_counts_gdn_kda() -> None:
    # the schedule itself, for the two specs of the issue: before this, a CP slice ran two whole package calls
    # (every forward stage twice, every backward stage twice)
    fwd, bwd = _expected_counts("gdn", continued=True, later=True)
    assert fwd == Counter(l2norm=1, chunk_cumsum=1, interaction=1, wy=1, state_pass=1, state_output=1)
    # the reverse pass forms dU's local share from the output's kept scores (compiler/plan.py: _scores_kept), so
    # there is no bwd_local_values; the state pass rerun has no output fused in, so the rerun is the output's own
    assert bwd == Counter(state_pass=1, bwd_state=2, bwd_solve=1, bwd_key_grads=1, bwd_inputs=1)
    fwd, bwd = _expected_counts("kda", continued=True, later=True)
    # decay_keys and wy run inside the interaction's launch (compiler/plan.py: rule_decay_keys, _wy_in_interaction)
    assert fwd == Counter(chunk_cumsum=1, interaction=1, state_pass=2, output=1)
    assert bwd == Counter(state_pass=1, bwd_local_values=1, bwd_state=2, bwd_scores=1, bwd_intra=1, bwd_grads=1,
                          bwd_inputs=1)
    fwd, bwd = _expected_counts("kda", continued=False, later=True)  # rank 0: no transition, no d0
    assert fwd["state_pass"] == 1 and bwd["bwd_state"] == 1
    fwd, bwd = _expected_counts("kda", continued=True, later=False)  # the last rank: no transition, no g
    assert fwd["state_pass"] == 1 and bwd["bwd_state"] == 1
    fwd, bwd = _expected_counts("pgdn", continued=True, later=True)  # the statistic's scan: offsets, then true
    assert fwd["precond_diag"] == 2 and fwd["interaction"] == 1 and bwd["bwd_precond_diag"] == 2
    fwd, bwd = _expected_counts("pgdn", continued=True, later=False)
    assert fwd["precond_diag"] == 1 and bwd["bwd_precond_diag"] == 1


def test_cp_two_ranks_varlen_every_spec(tmp_path: Path) -> None:
    # global pack (0, 20, 70, 96) on slices of 48: sequence 1 crosses the boundary, sequence 2 starts inside rank 1
    cases = [f"{s}:packed:h0" for s in SPECS8] + ["layer_cler_h_gdn:rows:zero"]  # DGPSLayer(cp_group=...)
    # DGPSLayer with its short convolutions: the halo across the boundary, from zero caches and from given ones (a
    # sequence starting one token before the boundary: its halo holds the previous sequence's tokens, masked)
    cases += ["layer_gdn:rows:conv0", "layer_gdn:packed:conv"]
    _check(_spawn(2, cases, tmp_path), cases, 2)
    _check_counts(tmp_path, cases, 2)


def test_cp_four_ranks_every_spec(tmp_path: Path) -> None:
    # B = 2 rows of 64 cut in 4 (each middle rank passes its whole transition product M on), and the pack
    # (0, 10, 80, 96): sequence 1 passes through ranks 1 and 2 and ends inside rank 3
    cases = [f"{s}:rows:h0" for s in SPECS8] + [f"{s}:packed:h0" for s in ("gdn", "pgdn", "ccq_gdn", "gdn2")]
    # every combination of continuing a sequence / starting one inside / passing one on (cp_worker.OFFSETS)
    cases += ["gdn:packed_b:h0", "pgdn:packed_b:h0", "kda:packed_c:h0", "ccq_gdn:packed_c:h0"]
    cases += ["fla_gdn:packed:zero", "fla_kda:packed:zero"]  # fla_compat with FLA's cp_context
    # DGPSLayer's convolution halo over slices of 30, 2, 1 and 31 tokens (ranks 2 and 3 read two earlier ranks' tokens),
    # and a pack whose sequences start one token before the boundaries 24 and 48 (cp_worker.LAYER_PACKED)
    cases += ["layer_gdn:uneven:conv0", "layer_kda:packed:conv"]
    _check(_spawn(4, cases, tmp_path), cases, 4)
    _check_counts(tmp_path, cases, 4)  # the middle ranks run both passes of the backward


def test_cp_zigzag(tmp_path: Path) -> None:
    # FLA's zigzag slices (rank r: parts r and 2W - 1 - r of 2W equal parts; cp_layout="zigzag"): the inputs move to
    # contiguous slices and o, the route and their gradients come back (runtime/cp.py: relayout). Two ranks: a pack
    # whose sequence 1 crosses both part boundaries, rows; the layer with its convolutions and the route
    cases = ["gdn:packed_zz:h0", "cler_h_gdn:packed_zz:h0", "kda:rows_zz:h0", "pgdn:packed_zz:zero",
             "layer_gdn:packed_zz:conv", "layer_cler_h_gdn:rows_zz:zero"]
    # fla_compat with the zigzag cp_context FLA's own get_cp_cu_seqlens builds (the global offsets gathered from it)
    cases += ["fla_gdn:packed_zz:zero", "fla_kda:packed_zz:zero"]
    _check(_spawn(2, cases, tmp_path), cases, 2)
    _check_counts(tmp_path, cases, 2)


def test_cp_zigzag_four_ranks(tmp_path: Path) -> None:
    # four ranks of two parts of 12 tokens: rank 0 holds the first and the last part (sequence 2's end), the middle
    # ranks' parts lie inside sequence 1 (0, 10, 80, 96)
    cases = ["gdn:packed_zz:h0", "ccq_gdn:rows_zz:h0", "fla_gdn:packed_zz:zero"]
    _check(_spawn(4, cases, tmp_path), cases, 4)
    _check_counts(tmp_path, cases, 4)


def test_cp_layout_is_checked() -> None:
    # before any collective: an unknown layout is one line, on the package and on the layer
    import importlib

    import dgps
    from dgps.runtime.layers import DGPSLayer

    pkg = importlib.import_module("dgps.generated.gdn")
    x = pkg.RECURRENCE.random_inputs(1, 8, 2, 16, 16, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="cp_layout must be one of"):
        pkg.forward(**x, cp_group=object(), cp_layout="ring")
    with pytest.raises(ValueError, match="cp_layout must be one of"):
        DGPSLayer(dgps.load(WORKER.parents[1] / "specs" / "gdn.dgps"), hidden_size=32, num_heads=2, head_k_dim=16,
                  head_v_dim=16, cp_layout="ring")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_zigzag_offsets_from_fla_contexts(world: int) -> None:
    # the global offsets dgps gathers from FLA's zigzag contexts (fla-core, a test dependency: its own
    # get_cp_cu_seqlens) are the pack's, for packs with boundaries inside parts, at part starts (a sequence starting
    # exactly where a part does), one sequence over everything, and many short ones
    from fla.ops.cp.context import get_cp_cu_seqlens

    P = 12
    total = 2 * world * P
    packs = [(0, total), (0, P, total), (0, 5, 2 * P, 2 * P + 1, total), tuple(range(0, total, 5)) + (total,),
             (0, P - 1, 3 * P, total)]
    for pack in packs:
        cu = torch.tensor(pack, dtype=torch.long)
        ranks = []
        for r in range(world):
            c = get_cp_cu_seqlens(cu, world_size=world, rank=r, layout="zigzag")
            assert c.part_len == P
            ranks.append((c.cu_seqlens.tolist(), c.front_num_seqs, tuple(c.is_first_by_part)))
        assert cp.zigzag_offsets(ranks, P) == list(pack), pack


def test_zigzag_parts_and_homes() -> None:
    from dgps.runtime.cp import _part_homes, zigzag_parts

    assert [zigzag_parts(3, r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    zz, cont = _part_homes(3, "zigzag"), _part_homes(3, "contiguous")
    assert zz == {0: (0, 0), 1: (1, 0), 2: (2, 0), 3: (2, 1), 4: (1, 1), 5: (0, 1)}
    assert cont == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (2, 0), 5: (2, 1)}


def test_slice_layout() -> None:
    # the worker's 4-rank packs b and c (cp_worker.OFFSETS): (continued, passes through, passes on) per rank
    b = [cp.slice_layout((0, 30, 60, 96), 1, 24 * r, 24 * (r + 1), 96) for r in range(4)]
    c = [cp.slice_layout((0, 48, 96), 1, 24 * r, 24 * (r + 1), 96) for r in range(4)]
    flags = [[(lay.carry_in, lay.passes_through, not lay.ends[-1]) for lay in lays] for lays in (b, c)]
    assert flags[0] == [(False, False, True), (True, False, True), (True, False, True), (True, True, False)]
    assert flags[1] == [(False, False, True), (True, True, False), (False, False, True), (True, True, False)]
    cu = (0, 10, 80, 96)
    lays = [cp.slice_layout(cu, 1, 24 * r, 24 * (r + 1), 96) for r in range(4)]
    assert [lay.local_cu for lay in lays] == [(0, 10, 24), (0, 24), (0, 24), (0, 8, 24)]
    assert [lay.rows for lay in lays] == [(0, 1), (1,), (1,), (1, 2)]
    assert [lay.carry_in for lay in lays] == [False, True, True, True]
    assert [lay.passes_through for lay in lays] == [False, True, True, False]
    assert [lay.ends for lay in lays] == [(True, False), (False,), (False,), (True, True)]
    starts_here = cp.slice_layout((0, 48, 96), 1, 48, 96, 96)  # a slice that begins exactly at a sequence start
    assert not starts_here.carry_in and starts_here.rows == (1,)
    rows = cp.slice_layout(None, 3, 32, 64, 64)
    assert rows.rows == (0, 1, 2) and rows.carry_in and rows.passes_through and rows.ends == (True,) * 3


def test_cp_plan_refuses_the_exact_preconditioner() -> None:
    import dgps.generated.exact_atk as pkg

    plan = cp.cp_plan(pkg.IR)
    assert plan.refused and "not affine in P" in plan.refused
    with pytest.raises(cp.CPUnsupported, match="not affine in P"):
        pkg.forward(*(torch.zeros(1, 4, 1, 16) for _ in range(3)), cp_group=object())


def test_cp_plan_refuses_a_transition_that_reads_v() -> None:
    # no shipped spec's transition reads v (the language has no value-side decay); check the rule on a doctored IR
    import dataclasses

    import sympy as sp

    import dgps.generated.gdn as pkg

    doctored = dataclasses.replace(pkg.IR, decay=dataclasses.replace(pkg.IR.decay, log_gate=sp.Symbol("v", real=True)))
    assert "value-side" in (cp.cp_plan(doctored).refused or "")
    assert cp.cp_plan(pkg.IR).refused is None


@pytest.mark.parametrize("spec", ["gdn", "pgdn"])
def test_simulated_many_ranks(spec: str) -> None:
    # the affine chain over 8 slices on one process, weak and strong decay: the composed final state and the
    # outputs against the unsharded call stay at fp32 rounding
    for decay in ("weak", "strong"):
        r = cp.simulate(spec, ranks=8, T=256, decay=decay)
        assert r["final_state"] <= TOL and r["o"] <= TOL, (decay, r)


def test_show_plan_cp(capsys: pytest.CaptureFixture[str]) -> None:
    from dgps.cli import main

    assert main(["show", str(WORKER.parent.parent / "specs" / "pgdn.dgps"), "--stage", "plan", "--cp"]) == 0
    out = capsys.readouterr().out
    assert "CP plan pgdn" in out and "A_out = exp(sum of gP) * A_in + A0" in out and "h_out = M h_in + h0" in out
    # the stages per slice: the intra-chunk work once, the state passes per pass, forward and backward
    rows = {line.split()[0]: line for line in out.split("stages per slice")[1].splitlines()[1:] if line.startswith("    ")}
    assert "once" in rows["interaction"] and "once" in rows["wy"] and "per pass" in rows["state_pass"]
    assert "per pass" in rows["cumsum_gP"] and "after the auxiliary exchange" in rows["interaction"]
    assert "per pass" in rows["bwd_state_pass"] and "per pass" in rows["bwd_precond_diag"]
    assert rows["bwd_grads"].split()[1] == "once" and rows["bwd_inputs"].split()[1] == "once"
    assert main(["show", str(WORKER.parent.parent / "specs" / "gdn.dgps"), "--stage", "plan", "--cp"]) == 0
    out = capsys.readouterr().out.split("stages per slice")[1]
    assert "state_pass + output" in out and "one launch with output" in out
    for stage in ("l2norm", "cumsum_g", "interaction + triangular_solve", "wy"):
        assert f"    {stage:<34} once: reads no incoming state" in out
    assert main(["show", str(WORKER.parent.parent / "specs" / "exact_atk.dgps"), "--stage", "plan", "--cp"]) == 0
    assert "refused: the exact preconditioner" in capsys.readouterr().out
