"""scripts/render_snapshot.py, the check a codegen refactor runs: a snapshot (every spec's chunk module and recurrent
forward and backward modules) compares identical with the tree that rendered it, a comment-only change passes, a
changed line of code fails and is shown."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("render_snapshot", ROOT / "scripts" / "render_snapshot.py")
assert _spec is not None and _spec.loader is not None
snapshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snapshot)


def test_a_snapshot_holds_a_refactor_to_the_kernels_it_rendered(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "before.json"
    assert snapshot.main(["save", str(path), "--fuzz", "3"]) == 0
    assert snapshot.main(["compare", str(path)]) == 0
    rendered = json.loads(path.read_text())
    # each spec's chunk module and its recurrent forward and backward modules
    assert sum(name.startswith("fuzz") and "[" not in name for name in rendered) == 3
    assert {"specs/gdn.dgps", "specs/gdn.dgps [recurrent]", "specs/gdn.dgps [recurrent_bwd]"} <= set(rendered)
    assert len(rendered) == 3 * sum("[" not in name for name in rendered)
    # a comment is not a change of code; a changed statement is
    gdn = rendered["specs/gdn.dgps"]
    rendered["specs/gdn.dgps"] = gdn.replace("@triton.jit", "# a note\n@triton.jit", 1)
    path.write_text(json.dumps(rendered))
    assert snapshot.main(["compare", str(path)]) == 0
    rendered["specs/gdn.dgps"] = gdn.replace("o_t = tl.arange(0, BT)", "o_t = tl.arange(0, BT) + 0", 1)
    path.write_text(json.dumps(rendered))
    capsys.readouterr()
    assert snapshot.main(["compare", str(path)]) == 1
    out = capsys.readouterr().out
    assert "specs/gdn.dgps" in out and "code changed: 1" in out
    # the recurrent modules are held to it too
    rendered["specs/gdn.dgps"] = gdn
    bwd = rendered["specs/gdn.dgps [recurrent_bwd]"]
    assert "h_prev = st_h" in bwd
    rendered["specs/gdn.dgps [recurrent_bwd]"] = bwd.replace("h_prev = st_h", "h_prev = st_h * 1.0", 1)
    path.write_text(json.dumps(rendered))
    capsys.readouterr()
    assert snapshot.main(["compare", str(path)]) == 1
    out = capsys.readouterr().out
    assert "specs/gdn.dgps [recurrent_bwd]" in out and "code changed: 1" in out
