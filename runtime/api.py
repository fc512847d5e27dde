"""The Python API: `dgps.load(spec)` -> Recurrence, with the reference and valid random inputs."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..compiler.ir import IR, format_ir
from ..compiler.lower import lower
from ..dsl import ast
from ..dsl.parser import parse
from .reference import RecurrenceOutput, reference


@dataclass(frozen=True)
class Recurrence:
    """A checked spec: its AST, canonical IR, and the derived sequential reference."""

    spec: ast.Spec
    ir: IR

    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def source(self) -> str:
        return self.spec.source

    @property
    def spec_hash(self) -> str:
        return hashlib.sha256(self.spec.source.encode()).hexdigest()[:16]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.ir.inputs)

    def show(self, stage: str = "ir") -> str:
        if stage == "ast":
            return ast.format_ast(self.spec)
        if stage == "ir":
            return format_ir(self.ir)
        raise ValueError(f"unknown stage {stage!r}; stages: ast, ir")

    def reference(self, *, initial_state: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
                  output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                  scale: float | None = None, dtype: torch.dtype | None = None,
                  **inputs: torch.Tensor) -> RecurrenceOutput:
        """The sequential reference on inputs named as in the spec ([B, T, heads, channel], FLA's layout)."""
        return reference(self.ir, inputs, initial_state=initial_state, output_final_state=output_final_state,
                         cu_seqlens=cu_seqlens, scale=scale, dtype=dtype)

    def random_inputs(self, B: int, T: int, H: int, dk: int, dv: int, HV: int | None = None, *,
                      dtype: torch.dtype = torch.float64, seed: int = 0,
                      device: str | torch.device = "cpu", on_device: bool = False) -> dict[str, torch.Tensor]:
        """Valid random inputs for every declared input and param, drawn by role and domain (`random_inputs`)."""
        return random_inputs(self.ir, B, T, H, dk, dv, HV, dtype=dtype, seed=seed, device=device,
                             on_device=on_device)


_DRAW = {
    "log_gate": lambda z: F.logsigmoid(z),
    "unit": torch.sigmoid,
    "positive": lambda z: F.softplus(z),
    "free": lambda z: z,
}


def random_inputs(ir: IR, B: int, T: int, H: int, dk: int, dv: int, HV: int | None = None, *,
                  dtype: torch.dtype = torch.float64, seed: int = 0,
                  device: str | torch.device = "cpu", on_device: bool = False) -> dict[str, torch.Tensor]:
    """Valid random inputs for every declared input and param, drawn by role and domain.

    By default every tensor is drawn on the CPU in float64 and then moved and cast, so a seed gives the same values
    on every device and in every dtype. `on_device=True` draws with `device`'s own generator in fp32 instead: seconds
    faster at training shapes on a GPU (where the float64 CPU draw dominates a first call), other values."""
    HV = HV or H
    draw_device = torch.device(device) if on_device else torch.device("cpu")
    draw_dtype = torch.float32 if on_device else torch.float64
    gen = torch.Generator(device=draw_device).manual_seed(seed)
    # Without in-kernel normalisation, erase-type solves are only stable for keys of norm <= 1, so
    # the draw normalises them (FLA's tests do the same).
    bounded_keys = ir.solve.kind != "additive" or ir.precond.kind != "none" or ir.read.kind != "none"
    out = {}
    for d in ir.inputs:
        shape = d.shape(B, T, H, HV, dk, dv)
        if d.is_param and d.default is not None:
            x = torch.full(shape, d.default, dtype=draw_dtype, device=draw_device)
        else:
            z = torch.randn(shape, generator=gen, dtype=draw_dtype, device=draw_device)
            if d.role == "key":
                x = z if d.name in ir.normalize or not bounded_keys else F.normalize(z, dim=-1)
            else:
                x = _DRAW[d.domain](z)
        out[d.name] = x.to(dtype=dtype, device=device)
    return out


def load(spec: str | Path, filename: str | None = None) -> Recurrence:
    """Load a spec from a path or from spec text; raises dgps.SpecError (located) on a bad spec."""
    one_word = isinstance(spec, str) and spec.strip() == spec and spec not in ("", ".", "..") and not any(
        c.isspace() for c in spec)
    if (isinstance(spec, Path) or one_word) and Path(spec).is_dir():
        raise IsADirectoryError(f"dgps.load: {spec} is a directory; pass a spec file or spec text")
    if isinstance(spec, Path) or ("\n" not in spec and spec.endswith(".dgps")):
        path = Path(spec)
        text = path.read_bytes().decode("utf-8")  # no newline translation: columns match the file
        filename = filename or str(spec)
    else:
        text = str(spec)
        filename = filename or "<spec>"
    tree = parse(text, filename)
    return Recurrence(tree, lower(tree))
