"""Test-session setup: without a GPU, Triton kernels run under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, so this runs at conftest import time.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
