"""The IR as Python source: the generated modules that need the whole IR (the recurrent kernels, and a chunk module
whose spec has channel reductions) rebuild it from this text, so a package does not depend on the compiler having
been run in the same process.
"""

from __future__ import annotations

import dataclasses
import re

import sympy as sp

from ..compiler import exprs as _exprs
from ..compiler import ir as _irmod


class IRSourceError(NotImplementedError):
    """The IR holds a value this serialiser does not spell out."""


_IR_CLASSES = {c.__name__ for c in (_irmod.IR, _irmod.TensorDecl, _irmod.Decay, _irmod.DiagPrecond, _irmod.Precond,
                                    _irmod.Solve, _irmod.ReadCorrection, _irmod.Reduction)}


def _serialised(value: object, field_name: str) -> bool:
    """The fields a module's IR source spells out: not the derived structure, nor an empty reduction list (so
    specs without reductions render as before)."""
    return field_name != "structure" and not (field_name == "reductions" and not getattr(value, field_name))


_CALL = re.compile(r"\b([A-Za-z_]\w*)\(")


def _qualify_srepr(text: str) -> str:
    """Prefix the constructors in a srepr string with their module: dgps' functions or sympy."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if isinstance(getattr(_exprs, name, None), type) and issubclass(getattr(_exprs, name), sp.Function):
            return f"_fx.{name}("
        if not hasattr(sp, name):
            raise IRSourceError(f"cannot serialise sympy node {name!r}")
        return f"_sp.{name}("
    return _CALL.sub(sub, text)


def ir_source(value: object, indent: int = 0) -> str:
    """Python source that rebuilds `value` (an IR dataclass, tuple, sympy expression or literal)."""
    flat = _py_flat(value)
    if indent + len(flat) <= 120 or not (isinstance(value, tuple) or dataclasses.is_dataclass(value)):
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, tuple):
        items = [f"{pad}{ir_source(v, indent + 4)}," for v in value]
        return "(\n" + "\n".join(items) + "\n" + " " * indent + ")"
    parts = [f"{pad}{f.name}={ir_source(getattr(value, f.name), indent + 4)},"
             for f in dataclasses.fields(value) if _serialised(value, f.name)]  # type: ignore[arg-type]
    return f"_ir.{type(value).__name__}(\n" + "\n".join(parts) + "\n" + " " * indent + ")"


def _py_flat(value: object) -> str:
    if dataclasses.is_dataclass(value) and type(value).__name__ in _IR_CLASSES:
        args = ", ".join(f"{f.name}={_py_flat(getattr(value, f.name))}"
                         for f in dataclasses.fields(value) if _serialised(value, f.name))  # type: ignore[arg-type]
        return f"_ir.{type(value).__name__}({args})"
    if isinstance(value, tuple):
        inner = ", ".join(_py_flat(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, sp.Basic):
        return _qualify_srepr(sp.srepr(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise IRSourceError(f"cannot serialise {type(value).__name__} in the IR")
