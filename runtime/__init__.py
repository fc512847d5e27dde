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
_ANNOUNCED = False


def _interpret_without_gpu() -> None:
    global _AUTO_INTERPRET
    if "TRITON_INTERPRET" in os.environ or os.environ.get("DGPS_NO_AUTO_INTERPRET"):
        return
    import torch

    if torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    _AUTO_INTERPRET = True


# Triton releases the kernels are tested with: 3.6 (the H200; CI's pinned version: interpreter and sm_90) and
# 3.9 (CI runs a representative subset of the interpreter tests on it). pyproject.toml admits 3.6 to 3.9.
TESTED_TRITON = ("3.6", "3.9")


def triton_warning(version: str) -> str | None:
    """One line for a Triton release outside TESTED_TRITON, else None."""
    if any(version == t or version.startswith(t + ".") for t in TESTED_TRITON):
        return None
    tested = ", ".join(f"{t}.x" for t in TESTED_TRITON)
    return (f"dgps: Triton {version} is not a tested release ({tested}); kernels may fail to build or run — "
            f"`pip install triton=={TESTED_TRITON[0]}.0` installs the one the H200 runs")


def block_pointers(version: str) -> bool:
    """Whether this Triton release has block pointers (tl.make_block_ptr): 3.9 removed them in favour of tensor
    descriptors (its make_block_ptr raises). Kernels that store through one take an offset tile there instead."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) < (3, 9)


def announce_interpreter() -> None:
    """Called by every generated kernel module at import; once per process: a line for an untested Triton
    release, and one when the runtime chose the interpreter."""
    global _AUTO_INTERPRET, _ANNOUNCED
    if _ANNOUNCED:
        return
    _ANNOUNCED = True
    import triton

    warning = triton_warning(triton.__version__)
    if warning:
        print(warning, file=sys.stderr)
    if _AUTO_INTERPRET:
        print("dgps: no CUDA device: Triton kernels run under the interpreter (TRITON_INTERPRET=1; correct, slow)",
              file=sys.stderr)


_interpret_without_gpu()
