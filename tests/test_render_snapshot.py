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
    saved = json.loads(path.read_text())
    # each spec's chunk module and its recurrent forward and backward modules
    assert sum(name.startswith("fuzz") and "[" not in name for name in saved) == 3
    assert {"specs/gdn.dgps", "specs/gdn.dgps [recurrent]", "specs/gdn.dgps [recurrent_bwd]"} <= set(saved)
    assert len(saved) == 3 * sum("[" not in name for name in saved)

    def compare_with(module: str, old: str, new: str) -> tuple[int, str]:
        """The tree compared with a snapshot in which `module` had `new` where the tree renders `old`."""
        assert old in saved[module]
        path.write_text(json.dumps({**saved, module: saved[module].replace(old, new, 1)}))
        capsys.readouterr()
        return snapshot.main(["compare", str(path)]), capsys.readouterr().out

    # a comment is not a change of code; a changed statement is, in a chunk module and in a recurrent one
    assert compare_with("specs/gdn.dgps", "@triton.jit", "# a note\n@triton.jit")[0] == 0
    for module, old in (("specs/gdn.dgps", "o_t = tl.arange(0, BT)"), ("specs/gdn.dgps [recurrent_bwd]", "h_prev = st_h")):
        status, out = compare_with(module, old, old + " * 1")
        assert status == 1 and module in out and "code changed: 1" in out, out
