"""benchmarks/triton_repro.py: a generated kernel's launch written out as a file that needs torch and triton only,
at the launch setting asked for, and that runs (here under the Triton interpreter, on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_reproducer_is_standalone_and_runs(tmp_path: Path) -> None:
    out = tmp_path / "repro_gdn.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["DGPS_CACHE_DIR"] = str(tmp_path / "cache")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "triton_repro.py"), "gdn", "chunk_bwd_grad_kernel",
                    "--launch", "bwd_key_grads=32,64,4,1", "--shape", "1", "70", "1", "64", "-o", str(out)],
                   env=env, check=True, capture_output=True, text=True, cwd=tmp_path)
    text = out.read_text()
    assert "dgps" not in "".join(line for line in text.splitlines() if line.startswith(("import", "from")))
    # the launch setting asked for, and the host's index tensors (two chunks: 64 + 6 tokens)
    assert "BK=32," in text and "num_warps=4," in text
    assert "cu_seqlens = torch.tensor([0, 70]" in text
    assert "sm_90 (triton.compile without a GPU):" in text
    run = subprocess.run([sys.executable, str(out), "--device", "cpu"], env=dict(env, TRITON_INTERPRET="1"),
                         check=True, capture_output=True, text=True, cwd=tmp_path)
    assert run.stdout.strip().endswith("chunk_bwd_grad_kernel: launch completed")
