"""The wy stage with one program per block of columns (codegen/launch.py WY_COLUMN_PROGRAMS; grid kind chunk_columns,
the template's split_columns hook): with it on, under the interpreter, every family's W and Ũ (tied with a gate and
without, the residual route's (T − I) Z, per-channel decay, the untied DPLR form) give o and every gradient of the
float64 reference, at head sizes where some programs hold partial blocks; and the launch lists say so."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
import dgps.codegen.launch as launch_mod  # noqa: E402
from dgps.codegen.chunk import forward_launches, rerun_launches  # noqa: E402
from dgps.compiler.plan import build_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from grad_errors import grad_errors  # noqa: E402

SPEC_DIR = ROOT / "specs"


@pytest.fixture
def columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "WY_COLUMN_PROGRAMS", True)


def test_off_in_the_shipped_table() -> None:
    # off until timed on a GPU (benchmarks/runs/2026-12-06_run132.sh wy: kernel_sections with --patch ...=True)
    assert not launch_mod.WY_COLUMN_PROGRAMS
    wy = [la for la in forward_launches(build_plan(dgps.load(SPEC_DIR / "gdn.dgps").ir, 64, 16)) if la.name == "wy"]
    assert [(la.grid, la.hooks) for la in wy] == [("chunk", frozenset())]


# (kda's wy runs at the end of its interaction's launch: compiler/plan.py _wy_in_interaction; gdn2's has its own)
@pytest.mark.parametrize("name", ["gdn", "gdn2", "rwkv7_dplr"])
def test_launches(name: str, columns: None) -> None:
    p = build_plan(dgps.load(SPEC_DIR / f"{name}.dgps").ir, 64, 16)
    for launches in (forward_launches(p), rerun_launches(p, False), forward_launches(p, unfused=True)):
        assert [(la.grid, la.hooks) for la in launches if la.name == "wy"] == \
            [("chunk_columns", frozenset({"split_columns"}))]
    # one block of key columns per program (64 at dk = 128), as the state passes' tiles
    assert launch_mod.table_launch("wy", 128, 128, "scalar", "tied", "none")[:2] == (64, 64)


@pytest.mark.parametrize("name", ["gdn", "deltanet", "cler_h_gdn", "kda", "rwkv7_dplr"])
def test_gradients_against_the_reference(name: str, columns: None) -> None:
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    # dk = 48, dv = 80: one block of 64 key columns (partial) and two of 64 value columns (the second partial)
    errs = grad_errors(rec, 2, 90, 2, 2, 48, 80, torch.float32, 3, train=True)
    assert max(errs.values()) < 1e-4, errs
