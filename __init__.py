"""dgps: a compiler for linear-attention recurrences written as DGPS specs."""

from .dsl.errors import SpecError
from .runtime.api import Recurrence, load, random_inputs
from .runtime.compile import compile  # noqa: A004 - dgps.compile is the public name
from .runtime.reference import RecurrenceOutput
from .runtime.tensors import TensorError

__all__ = ["Recurrence", "RecurrenceOutput", "SpecError", "TensorError", "compile", "load", "random_inputs"]
__version__ = "0.1.0"
