"""Context parallelism (runtime/cp.py): gloo groups of 2 and 4 processes against the unsharded call, the slice
layouts, the plan's refusals and the many-rank accuracy study."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
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


def test_cp_two_ranks_varlen_every_spec(tmp_path: Path) -> None:
    # global pack (0, 20, 70, 96) on slices of 48: sequence 1 crosses the boundary, sequence 2 starts inside rank 1
    cases = [f"{s}:packed:h0" for s in SPECS8] + ["layer_cler_h_gdn:rows:zero"]  # DGPSLayer(cp_group=...)
    _check(_spawn(2, cases, tmp_path), cases, 2)


def test_cp_four_ranks_every_spec(tmp_path: Path) -> None:
    # B = 2 rows of 64 cut in 4 (each middle rank passes its whole transition product M on), and the pack
    # (0, 10, 80, 96): sequence 1 passes through ranks 1 and 2 and ends inside rank 3
    cases = [f"{s}:rows:h0" for s in SPECS8] + [f"{s}:packed:h0" for s in ("gdn", "pgdn", "ccq_gdn", "gdn2")]
    cases += ["fla_gdn:packed:zero", "fla_kda:packed:zero"]  # fla_compat with FLA's cp_context
    _check(_spawn(4, cases, tmp_path), cases, 4)


def test_slice_layout() -> None:
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

    assert main(["show", "specs/pgdn.dgps", "--stage", "plan", "--cp"]) == 0
    out = capsys.readouterr().out
    assert "CP plan pgdn" in out and "A_out = exp(sum of gP) * A_in + A0" in out and "h_out = M h_in + h0" in out
    assert main(["show", "specs/exact_atk.dgps", "--stage", "plan", "--cp"]) == 0
    assert "refused: the exact preconditioner" in capsys.readouterr().out
