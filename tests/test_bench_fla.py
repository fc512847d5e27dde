"""benchmarks/bench_fla.py's --output-forms sides: the loaded chunk modules that fuse their output per call are forced
to one form while the wrapped call runs, and left as they were after it (even when it raises)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fla.py"


def _bench():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_fla_under_test", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_forced_output_form(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    chunk = types.ModuleType("fake_chunk")
    chunk.FUSE_OUTPUT = None
    chunk._unfused_kernels = lambda: []
    other = types.ModuleType("fake_other")  # fuses nothing per call: left alone
    other.FUSE_OUTPUT = "untouched"
    monkeypatch.setitem(sys.modules, "fake_chunk", chunk)
    monkeypatch.setitem(sys.modules, "fake_other", other)
    seen = []

    def call(x):  # noqa: ANN001, ANN202
        seen.append((chunk.FUSE_OUTPUT, other.FUSE_OUTPUT))
        if x == "raise":
            raise RuntimeError("boom")
        return x

    assert bench.forced_output(call, False)("ok") == "ok"
    assert bench.forced_output(call, True)("ok") == "ok"
    with pytest.raises(RuntimeError):
        bench.forced_output(call, False)("raise")
    assert seen == [(False, "untouched"), (True, "untouched"), (False, "untouched")]
    assert chunk.FUSE_OUTPUT is None and other.FUSE_OUTPUT == "untouched"


def test_source_hash_names_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JSON's source_hash follows the pipeline sources' paths and contents, nothing else (the device's copy of the
    checkout can carry a stale git HEAD, so the hash is what names the tree a run measured)."""
    bench = _bench()
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    for d in bench.SOURCE_DIRS:
        (tmp_path / d).mkdir()
    (tmp_path / "codegen" / "a.jinja").write_text("x")
    first = bench.source_hash()
    (tmp_path / "codegen" / "notes.md").write_text("not a source")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text("outside the pipeline")
    assert bench.source_hash() == first
    (tmp_path / "codegen" / "a.jinja").write_text("y")
    assert bench.source_hash() != first
    (tmp_path / "codegen" / "a.jinja").write_text("x")
    (tmp_path / "codegen" / "a.jinja").rename(tmp_path / "compiler" / "a.jinja")  # same content, another path
    assert bench.source_hash() != first
