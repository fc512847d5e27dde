"""Spec -> the files of an importable Python package: a pure function of the spec (and versions).

    spec.dgps       the spec text
    recurrent.py    the recurrent kernel (decode, and the forward where no chunk form is emitted)
    backward.py     the recurrent backward kernel (every gradient; checkpointed recompute)
    chunk.py        the chunked forward and backward kernels (when the chunk plan is supported)
    metadata.json   spec hash, dgps/triton versions, which forward path and why
    __init__.py     forward / decode / reference entry points taking the spec's inputs by name
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Protocol

import triton

from .._version import __version__ as DGPS_VERSION
from ..compiler.ir import IR
from ..compiler.plan import build_plan, kept_states_bytes, rerun_reads_route
from .chunk import BC, BT, render_chunk, supports_chunk, supports_chunk_backward
from .jinja_env import template_env
from .recurrent import render_recurrent
from .recurrent_bwd import render_recurrent_backward


def spec_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


@cache
def _compiler_fingerprint() -> str:
    """A hash of dgps's own source (dsl, compiler, codegen and templates): an edited compiler never
    reuses packages rendered by the old one."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for folder in ("dsl", "compiler", "codegen", "runtime"):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".jinja", ".lark") and "__pycache__" not in path.parts:
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cache_key(source: str) -> str:
    """What a compiled package depends on: the spec text, the compiler's source and triton's version."""
    key = f"{source}\0{DGPS_VERSION}\0{_compiler_fingerprint()}\0{triton.__version__}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Spec(Protocol):
    """What a package is rendered from (a dgps.Recurrence is one): the lowered IR and the spec's text."""

    @property
    def ir(self) -> IR: ...

    @property
    def source(self) -> str: ...


def render_package(rec: Spec, module_name: str | None = None) -> dict[str, str]:
    """File name -> text. Deterministic: the same spec and versions give byte-identical files."""
    ir = rec.ir
    chunk_ok, chunk_why = supports_chunk(ir)
    bwd_ok, bwd_why = supports_chunk_backward(ir)
    plan = build_plan(ir, BT, BC) if bwd_ok else None
    files = {"spec.dgps": rec.source if rec.source.endswith("\n") else rec.source + "\n"}
    files["recurrent.py"] = render_recurrent(ir)
    files["backward.py"] = render_recurrent_backward(ir)
    if chunk_ok:
        files["chunk.py"] = render_chunk(ir)
    names = [d.name for d in ir.inputs]
    required = [d.name for d in ir.inputs if not (d.is_param and d.default is not None)]
    optional = [n for n in names if n not in required]
    signature = ", ".join(
        [f"{n}: torch.Tensor" for n in required] + [f"{n}: torch.Tensor | None = None" for n in optional]
    )
    states = list(ir.state_names)
    state_args = [f"state_{s}" for s in states]
    meta = {
        "name": ir.name,
        "spec_sha256": spec_hash(rec.source),
        "dgps_version": DGPS_VERSION,
        "triton_version": triton.__version__,
        "forward": "chunk" if chunk_ok else "recurrent",
        "forward_reason": "" if chunk_ok else chunk_why,
        "backward": "chunk" if bwd_ok else "recurrent",
        "backward_reason": "" if bwd_ok else bwd_why,
        "inputs": {d.name: {"role": d.role, "domain": d.domain, "shape": d.shape_text(), "default": d.default}
                   for d in ir.inputs},
        "states": states,
        "route": ir.route,
    }
    files["metadata.json"] = json.dumps(meta, indent=2, sort_keys=True) + "\n"
    files["__init__.py"] = template_env(trim=False).get_template("package_init.jinja").render(
        name=ir.name,
        module_name=module_name or ir.name,
        dgps_version=DGPS_VERSION,
        forward_path="chunked" if chunk_ok else "recurrent",
        forward_reason=f"No chunk form emitted: {chunk_why}",
        has_chunk=chunk_ok,
        has_chunk_backward=bwd_ok,
        kept_states_bytes=kept_states_bytes(plan) if plan is not None else 0,
        # a training step saves the route output for the backward's rerun of the state pass (rerun_reads_route)
        route_feeds_rerun=plan is not None and rerun_reads_route(plan),
        backward_path="chunked" if bwd_ok else "recurrent",
        backward_reason=f"No chunked backward emitted: {bwd_why}",
        input_names=repr(tuple(names)),
        state_names=repr(tuple(states)),
        input_list=required + optional,
        signature=signature,
        call_args=", ".join(required + optional),
        route=ir.route,
        op_signature=", ".join(f"{a}: torch.Tensor" for a in names + state_args),
        op_inputs=", ".join(f'"{n}": {n}' for n in names),
        op_states=", ".join(f'"{s}": {a}' for s, a in zip(states, state_args, strict=True)),
        op_tensor_args=", ".join(names + state_args) + ("," if len(names + state_args) == 1 else ""),
        op_state_args=", ".join(state_args) + ("," if len(state_args) == 1 else ""),
        q_index=names.index("q"),
        v_index=names.index("v"),
    )
    return files
