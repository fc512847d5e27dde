"""The runtime: the sequential reference, compiled packages, layers, verification.

Without a CUDA device, Triton's kernels can only run under its interpreter, which Triton selects from
TRITON_INTERPRET when a kernel is defined. So the first import of the runtime (which every package, layer and
FLA entry point goes through before any kernel module loads) sets it on a machine without a GPU, and the
first kernel module to load says so, once. DGPS_NO_AUTO_INTERPRET=1 opts out (the sm_90 compile report needs
real JIT functions on a CPU machine).
"""

from __future__ import annotations

import os
import sys

_AUTO_INTERPRET = False  # set when this module chose the interpreter; kernel modules announce it once


def _interpret_without_gpu() -> None:
    global _AUTO_INTERPRET
    if "TRITON_INTERPRET" in os.environ or os.environ.get("DGPS_NO_AUTO_INTERPRET"):
        return
    import torch

    if torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    _AUTO_INTERPRET = True


def announce_interpreter() -> None:
    """Called by every generated kernel module at import: one line, once, when the runtime chose the interpreter."""
    global _AUTO_INTERPRET
    if _AUTO_INTERPRET:
        _AUTO_INTERPRET = False
        print("dgps: no CUDA device: Triton kernels run under the interpreter (TRITON_INTERPRET=1; correct, slow)",
              file=sys.stderr)


_interpret_without_gpu()
