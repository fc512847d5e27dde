"""`dgps tune` (runtime/autotune.py): per-stage sweeps in child processes that survive a faulting candidate, every
candidate's results checked against the table setting's before it is timed, the fastest recorded per device, module
and shape class, and generated modules launching what was recorded (DGPS_TUNED=0: the table)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import dgps
from dgps.cli import main as cli_main
from dgps.codegen.launch import check_launch, table_launch, tuning_candidates
from dgps.runtime import autotune

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (1, 64, 1, 1, 32, 32)  # B T H HV dk dv: one chunk, under the interpreter


def _fake_child(faulting: set[tuple[int, ...]], calls: list[list[tuple[int, ...]]],  # noqa: ANN202
                ready: bool = True):
    """Times candidates in order, as the child does, and dies at the first faulting one; `ready`: its reference step
    runs (else it dies before)."""

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        todo = [tuple(int(v) for v in c.split(",")) for c in cmd[cmd.index("--configs") + 1:]]
        calls.append(todo)
        if not ready:
            return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: CUDA error: illegal address")
        out = [json.dumps({"stage": "bwd_key_grads", "ready": True})]
        for c in todo:
            if c in faulting:
                return subprocess.CompletedProcess(cmd, 1, "\n".join(out), "RuntimeError: CUDA error: illegal address")
            out.append(json.dumps({"stage": "bwd_key_grads", "config": list(c), "ms": 0.1 * sum(c)}))
        return subprocess.CompletedProcess(cmd, 0, "\n".join(out), "")

    return run


def test_the_sweep_goes_on_past_a_faulting_candidate() -> None:
    # run 49's bwd_key_grads sweep stopped at its 7th of 16 candidates, the rest never timed
    calls: list[list[tuple[int, ...]]] = []
    todo = [(32, 32, 4, 1), (32, 64, 8, 2), (64, 64, 4, 1), (64, 32, 8, 1)]
    rows, faults = autotune._run_children("pkg", "bwd_key_grads", SHAPE, "bfloat16", "cuda", todo,
                                          _fake_child({(32, 64, 8, 2)}, calls))
    assert [tuple(r["config"]) for r in rows] == [(32, 32, 4, 1), (64, 64, 4, 1), (64, 32, 8, 1)]
    assert len(faults) == 1 and "[32, 64, 8, 2]" in faults[0] and "illegal address" in faults[0]
    assert calls == [todo, todo[2:]]  # a new child takes the candidates after the faulting one


def test_candidates_faulting_one_after_another_are_each_skipped() -> None:
    # H100 run 111: curvature_query at BV 32 faulted at every warp and stage count, one child after another; the
    # sweep had stopped there as if the stage itself failed, and the candidates after them went untimed
    calls: list[list[tuple[int, ...]]] = []
    todo = [(64, 64, 4, 1), (64, 32, 4, 1), (64, 32, 4, 2), (64, 32, 8, 1), (64, 64, 8, 1)]
    rows, faults = autotune._run_children("pkg", "bwd_key_grads", SHAPE, "bfloat16", "cuda", todo,
                                          _fake_child(set(todo[1:4]), calls))
    assert [tuple(r["config"]) for r in rows] == [(64, 64, 4, 1), (64, 64, 8, 1)] and len(faults) == 3


def test_a_stage_that_fails_whatever_the_candidate_stops() -> None:
    calls: list[list[tuple[int, ...]]] = []
    todo = [(32, 32, 4, 1), (32, 64, 8, 2), (64, 64, 4, 1)]
    rows, faults = autotune._run_children("pkg", "bwd_key_grads", SHAPE, "bfloat16", "cuda", todo,
                                          _fake_child(set(), calls, ready=False))
    assert rows == [] and len(faults) == 2 and len(calls) == 2  # two children in a row died before their reference


@pytest.mark.parametrize("spec", ["gdn", "pgdn", "ccq_gdn", "kda", "gla", "cler_h_gdn", "rwkv7_dplr"])
def test_every_launched_stage_has_candidates_its_kernel_takes(spec: str) -> None:
    mod = dgps.compile(str(ROOT / "specs" / f"{spec}.dgps")).chunk
    for n_state in (1, 64):
        dev = torch.device("cuda")
        for stage in {**autotune.stage_kernels(mod, n_state, 128, dev),
                      **autotune.inference_stage_kernels(mod, n_state, 128, dev)}:
            cands = tuning_candidates(stage, 128, 128)
            assert len(cands) >= 2, (spec, stage)
            for c in cands:
                check_launch(spec, stage, c, 128, 128)  # raises where the kernel cannot run it


def test_the_sweep_takes_the_tables_own_blocks() -> None:
    """kda's per-channel interaction runs the levels' key block BK 16, which the interaction's grid (the scalar one's
    32 and 64) lacks: swept around the table's setting, as `dgps tune` sweeps, every warp count is tried at it."""
    table = table_launch("interaction", 128, 128, "vector", "tied", "none")
    assert table[0] not in {c[0] for c in tuning_candidates("interaction", 128, 128)}
    around = tuning_candidates("interaction", 128, 128, around=table)
    assert {c[2] for c in around if c[:2] == table[:2]} == {1, 2, 4, 8}
    assert set(tuning_candidates("interaction", 128, 128)) < set(around)


def _tune_gdn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw):  # noqa: ANN202
    monkeypatch.setenv("DGPS_CACHE_DIR", str(tmp_path))
    autotune.forget()
    pkg = dgps.compile(str(ROOT / "specs" / "gdn.dgps"))
    path, results = autotune.tune(pkg, (1, 64, 1, 32, 32), dtype="float32", device="cpu", log=lambda s: None, **kw)
    return pkg, path, results


def test_tune_records_the_fastest_checked_setting_and_the_module_launches_it(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pkg, path, results = _tune_gdn(tmp_path, monkeypatch, stages=["wy"], configs=[(16, 16, 2, 1)])
    r = results["wy"]
    assert r["table"] == [32, 32, 4, 1] and len([row for row in r["rows"] if "ms" in row]) == 2
    assert path.parent == tmp_path / "tuned" / "cpu" and path.name.startswith("gdn-")
    recorded = json.loads(path.read_text())["dk32-dv32-few"]["wy"]
    assert recorded["config"] == r["config"] and recorded["table"] == [32, 32, 4, 1]
    mod, cpu = pkg.chunk, torch.device("cpu")
    assert mod.launch_config("wy", 32, 32, 1, cpu) == tuple(r["config"])
    assert mod.launch_config("wy", 32, 32, 1, None) == (32, 32, 4, 1)  # no device: the table
    assert mod.launch_config("wy", 64, 64, 1, cpu) == mod.launch_config("wy", 64, 64, 1, None)  # another class
    monkeypatch.setenv("DGPS_TUNED", "0")
    assert mod.launch_config("wy", 32, 32, 1, cpu) == (32, 32, 4, 1)


def test_a_candidate_whose_results_differ_is_refused_not_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # at tolerance 0 only a setting with bitwise the table setting's results passes: the table's own (the kernels are
    # deterministic) does, BK 16 (another summation order over the key channels) does not
    monkeypatch.setenv("DGPS_TUNE_TOLERANCE", "0")
    _, _, results = _tune_gdn(tmp_path, monkeypatch, stages=["interaction"], configs=[(16, 32, 1, 1)], record=False)
    rows = results["interaction"]["rows"]
    assert [row["config"] for row in rows if "ms" in row] == [[32, 32, 1, 1]]
    refused = [row for row in rows if "refused" in row]
    assert [row["config"] for row in refused] == [[16, 32, 1, 1]] and "differ" in refused[0]["refused"]


def test_an_inference_kernel_is_tuned_on_an_inference_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           launch_list: Callable) -> None:
    # the fused state pass + output with the wy stage inside runs in inference calls only (the plan's
    # inference_fused): its candidates are checked against the table setting's o and final state, then timed
    pkg0 = dgps.compile(str(ROOT / "specs" / "gdn.dgps"))
    mod = pkg0.chunk
    assert autotune.inference_stage_kernels(mod, 1, 32, torch.device("cpu")) == \
        {"state_output_wy": "chunk_state_output_wy_kernel"}
    # the child's step for it: the sweep's inputs require gradients, the forward runs under no_grad
    x = {k: v.requires_grad_(True) if v.is_floating_point() else v
         for k, v in dgps.load(ROOT / "specs" / "gdn.dgps").random_inputs(1, 64, 1, 32, 32, dtype=torch.float32).items()}
    with torch.no_grad():
        assert "chunk_state_output_wy_kernel" in launch_list(mod, lambda: pkg0.forward(**x, output_final_state=True))
    pkg, path, results = _tune_gdn(tmp_path, monkeypatch, stages=["state_output_wy"], configs=[(32, 32, 4, 2)])
    r = results["state_output_wy"]
    assert [row["config"] for row in r["rows"] if "ms" in row] == [[32, 16, 4, 2], [32, 32, 4, 2]]
    assert all(row["difference"] < 1e-5 for row in r["rows"] if "ms" in row)
    assert pkg.chunk.launch_config("state_output_wy", 32, 32, 1, torch.device("cpu")) == tuple(r["config"])


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["tune", str(ROOT / "specs" / "gdn.dgps"), "--configs", "64,64,4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "expected BK,BV,warps,stages" in err[-1]
    assert cli_main(["tune", str(ROOT / "specs" / "gdn.dgps"), "--stages", "bwd_intra", "--T", "64", "--H", "1",
                     "--B", "1", "--dk", "32", "--dv", "32"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dgps tune: error:") and "bwd_intra" in err[-1] and "wy" in err[-1]


def test_autotune_tunes_a_class_once_at_its_first_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DGPS_CACHE_DIR", str(tmp_path))
    autotune.forget()
    mod = dgps.compile(str(ROOT / "specs" / "gdn.dgps")).chunk
    calls = []

    def fake_tune(pkg, shape, **kw):  # noqa: ANN001, ANN003, ANN202 - records what `tune` would have recorded
        calls.append((pkg.chunk is mod, tuple(shape), kw["HV"], kw["dtype"]))
        path = autotune.tuned_path(mod.__file__, mod.NAME, "cpu")
        autotune._record(path, autotune.shape_class(32, 32, shape[0] * kw["HV"]), {}, {})
        return path, {}

    monkeypatch.setattr(autotune, "tune", fake_tune)
    cpu = torch.device("cpu")
    autotune.ensure_tuned(mod, 1, 64, 1, 1, 32, 32, cpu, torch.bfloat16, log=lambda s: None)  # off by default
    assert calls == []
    monkeypatch.setenv("DGPS_AUTOTUNE", "1")
    for _ in range(2):
        autotune.ensure_tuned(mod, 1, 64, 1, 1, 32, 32, cpu, torch.bfloat16, log=lambda s: None)
    assert calls == [(True, (1, 64, 1, 32, 32), 1, "bfloat16")]  # the second call finds the class tuned
    autotune.ensure_tuned(mod, 32, 64, 4, 4, 32, 32, cpu, torch.float32, log=lambda s: None)  # another class: many
    assert len(calls) == 2 and calls[1][1:] == ((32, 64, 4, 32, 32), 4, "float32")
