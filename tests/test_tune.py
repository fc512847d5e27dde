"""benchmarks/tune.py: a candidate that faults ends its child process, and the sweep goes on with the ones after it
(run 49's bwd_key_grads sweep stopped at its 7th of 16 candidates, the rest never timed)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "tune.py"


def _tune():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("tune_under_test", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_child(faulting: set[tuple[int, ...]], calls: list[list[tuple[int, ...]]]):  # noqa: ANN202
    """Times candidates in order, as the child does, and dies at the first faulting one."""

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        todo = [tuple(int(v) for v in c.split(",")) for c in cmd[cmd.index("--configs") + 1:]]
        calls.append(todo)
        out = []
        for c in todo:
            if c in faulting:
                return subprocess.CompletedProcess(cmd, 1, "\n".join(out), "RuntimeError: CUDA error: illegal address")
            out.append(json.dumps({"stage": "bwd_key_grads", "config": list(c), "ms": 0.1 * sum(c)}))
        return subprocess.CompletedProcess(cmd, 0, "\n".join(out), "")

    return run


def test_the_sweep_goes_on_past_a_faulting_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    tune = _tune()
    calls: list[list[tuple[int, ...]]] = []
    todo = [(32, 32, 4, 1), (32, 64, 8, 2), (64, 64, 4, 1), (64, 32, 8, 1)]
    monkeypatch.setattr(tune, "_run_child", _fake_child({(32, 64, 8, 2)}, calls))
    rows, faulted = tune.sweep_stage("gdn", "bwd_key_grads", [4, 4096, 16, 128], todo)
    assert [tuple(r["config"]) for r in rows] == [(32, 32, 4, 1), (64, 64, 4, 1), (64, 32, 8, 1)]
    assert [c for c, _ in faulted] == [(32, 64, 8, 2)] and "illegal address" in faulted[0][1]
    assert calls == [todo, todo[2:]]  # a new child takes the candidates after the faulting one


def test_a_stage_that_fails_whatever_the_candidate_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    tune = _tune()
    calls: list[list[tuple[int, ...]]] = []
    todo = [(32, 32, 4, 1), (32, 64, 8, 2), (64, 64, 4, 1)]
    monkeypatch.setattr(tune, "_run_child", _fake_child(set(todo), calls))
    rows, faulted = tune.sweep_stage("gdn", "bwd_key_grads", [4, 4096, 16, 128], todo)
    assert rows == [] and len(faulted) == 2 and len(calls) == 2  # two empty children in a row: not a candidate's fault
