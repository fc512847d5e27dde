"""The README's Python blocks run as written, in a fresh process without TRITON_INTERPRET (dgps selects the
interpreter by itself on a machine without a GPU and says so on one line)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "the README has Python blocks"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DGPS_NO_AUTO_INTERPRET")}
    for code in blocks:
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        if not _has_gpu():
            assert "run under the interpreter" in r.stderr


def test_float64_to_the_kernels_is_a_clear_error() -> None:
    import pytest
    import torch

    import dgps

    rec = dgps.load(ROOT / "specs" / "gdn.dgps")
    pkg = dgps.compile(rec)
    x = rec.random_inputs(B=1, T=8, H=1, dk=16, dv=16, dtype=torch.float64, seed=0)
    with pytest.raises(dgps.TensorError, match=r"take bf16, fp16 or fp32 inputs; q is torch.float64"):
        pkg.forward(**x)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def test_untested_triton_releases_are_named() -> None:
    from dgps.runtime import triton_warning

    assert triton_warning("3.6.0") is None and triton_warning("3.9.0") is None
    msg = triton_warning("3.7.1")
    assert msg is not None and "Triton 3.7.1 is not a tested release (3.6.x, 3.9.x)" in msg and "\n" not in msg


def test_block_pointers_where_the_release_has_them() -> None:
    # Triton 3.9's tl.make_block_ptr raises (tensor descriptors replace it): there the stored scores take an offset
    # tile (the 3.9 subset of scripts/test.sh runs the kernels that store them)
    from dgps.runtime import block_pointers

    assert block_pointers("3.6.0") and block_pointers("3.8.1") and not block_pointers("3.9.0")
    assert not block_pointers("3.10.0") and not block_pointers("4.0.0")


def test_gain_forms_lower_as_the_readme_says() -> None:
    """`gain value = w` alone: β = 1, the erase unscaled; `gain beta, value = w`: β on the write and the erase."""
    import dgps

    def solve(gain: str, extra: str = "") -> tuple[str, str]:
        text = ("recurrence g\n  input q, k : key\n  input v : value\n  input w : value_channel unit\n" + extra +
                f"  decay none\n  gain {gain}\n  solve delta\nend\n")
        e, _, vp, _ = dgps.load(text).ir.solve.canonical()
        return str(e), str(vp)

    assert solve("value = w") == ("-k", "v*w")
    assert solve("beta, value = w", "  input beta : token unit\n") == ("-beta*k", "beta*v*w")


def test_cpu_inputs_without_the_interpreter_are_a_clear_error() -> None:
    """Kernels compiled for a GPU (the interpreter turned off) and CPU inputs: one line that says what to do."""
    code = ("import torch, dgps\nfrom dgps.generated import gdn\n"
            "x = dgps.load('specs/gdn.dgps').random_inputs(1, 8, 1, 16, 16, dtype=torch.float32)\n"
            "try:\n    gdn.forward(**x)\nexcept dgps.TensorError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["DGPS_NO_AUTO_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "inputs are on the CPU and Triton's interpreter is off" in r.stdout, r.stdout + r.stderr
