"""dgps: a compiler for linear-attention recurrences written as DGPS specs.

The public names that need torch (everything past the checker) are imported on first use, so that
`import dgps.dsl` and `dgps check` stay light: the pipeline's packages import only earlier ones.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__
from .dsl.errors import SpecError

_LAZY = {"Recurrence": "runtime.api", "load": "runtime.api", "random_inputs": "runtime.api",
         "compile": "runtime.compile", "RecurrenceOutput": "runtime.reference", "TensorError": "runtime.tensors"}

__all__ = ["Recurrence", "RecurrenceOutput", "SpecError", "TensorError", "__version__", "compile", "load",
           "random_inputs"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dgps' has no attribute {name!r}")
