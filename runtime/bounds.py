"""Out-of-bounds accesses of Triton kernels run under the interpreter, caught where they happen.

Triton's interpreter dereferences every unmasked address a kernel forms: one past a buffer's end reads whatever lies
there (or writes it), and nothing says so. On a GPU the same access may fault ("illegal memory access") or corrupt a
neighbouring buffer silently. Inside `checked_bounds()` every pointer a kernel derives from a tensor argument carries
that argument's extent; each load and store checks its unmasked addresses against it and raises `OutOfBounds` naming
the kernel, the argument, the program and how far outside the access fell.

    with checked_bounds() as stats:
        mod.chunk_forward(...)          # any launches under TRITON_INTERPRET=1
    stats.accesses, stats.unattributed  # checked loads/stores; those whose pointer lost its argument (checked
                                        # against the union of all arguments' extents instead)

From the command line (a spec's chunk forward and backward, launch settings overridden as DGPS_LAUNCH writes them):

    TRITON_INTERPRET=1 python -m dgps.runtime.bounds specs/ccq_gdn.dgps --dk 64 --dv 64 \\
        --launch "curvature_query=64,32,4,1;bwd_curvature_query=64,32,4,1"
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


class OutOfBounds(AssertionError):
    """An unmasked access outside the tensor argument its pointer was derived from."""


@dataclass
class Stats:
    accesses: int = 0  # loads and stores checked
    unattributed: int = 0  # of them, through a pointer that lost its argument (checked against every argument)


@dataclass(frozen=True)
class _Extent:
    lo: int  # first byte of the argument's view
    hi: int  # one past its last byte
    name: str  # the kernel parameter


def _extent(t, name: str) -> _Extent:  # noqa: ANN001
    """Bytes a tensor view spans: from its first element to one past its last (strides as given)."""
    if t.numel() == 0:
        return _Extent(t.data_ptr(), t.data_ptr(), name)
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return _Extent(t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size(), name)


@contextlib.contextmanager
def checked_bounds() -> Iterator[Stats]:
    """Check every load and store of interpreted Triton launches inside the block (see the module docstring)."""
    import triton.language as tl
    import triton.runtime.interpreter as ti

    stats = Stats()
    state: dict = {"kernel": "?", "program": (0, 0, 0), "args": []}
    builder = ti.InterpreterBuilder
    saved = {n: v for n, v in vars(builder).items() if callable(v) and not n.startswith("__")}
    saved_call, saved_cvt = ti.GridExecutor.__call__, ti._implicit_cvt

    def is_ptr(h) -> bool:  # noqa: ANN001
        return isinstance(h, ti.TensorHandle) and isinstance(h.dtype, tl.pointer_type)

    def carry(method):  # noqa: ANN001, ANN202
        """A builder method whose pointer result inherits the extent of the first pointer operand that has one."""
        @functools.wraps(method)
        def wrapped(self, *args, **kwargs):  # noqa: ANN001, ANN202
            out = method(self, *args, **kwargs)
            if is_ptr(out) and "dgps_extent" not in out.attr:
                for a in (*args, *kwargs.values()):
                    if isinstance(a, ti.TensorHandle) and "dgps_extent" in a.attr:
                        out.attr = {**out.attr, "dgps_extent": a.attr["dgps_extent"]}
                        break
            return out
        return wrapped

    def check(ptrs, mask, what: str) -> None:  # noqa: ANN001
        stats.accesses += 1
        m = mask.data if isinstance(mask, ti.TensorHandle) else np.asarray(mask)  # a block pointer's: an array
        # as booleans: a mask combined with a scalar condition (`m & (i < H)`) reaches the builder as int32 0/1, which
        # would index the addresses by position instead of selecting them
        m = m.astype(bool)
        addr = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, m.shape))
        live = addr[np.broadcast_to(m, addr.shape)]  # the builder's unmasked loads pass an all-true mask
        if live.size == 0:
            return
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        lo, hi = int(live.min()), int(live.max()) + size
        ext = ptrs.attr.get("dgps_extent")
        if ext is None:
            stats.unattributed += 1
            if any(e.lo <= lo and hi <= e.hi for e in state["args"]):
                return
            raise OutOfBounds(f"{state['kernel']} program {state['program']}: {what} of bytes [{lo:#x}, {hi:#x}) "
                              "lies in no tensor argument")
        if ext.lo <= lo and hi <= ext.hi:
            return
        below, above = max(0, ext.lo - lo), max(0, hi - ext.hi)
        raise OutOfBounds(f"{state['kernel']} program {state['program']}: {what} through {ext.name} reaches "
                          + (f"{below} B before its first element" if below else f"{above} B past its last element")
                          + f" (its view spans {ext.hi - ext.lo} B)")

    def masked_load(self, ptrs, mask, other, *rest):  # noqa: ANN001, ANN202
        check(ptrs, mask, "load")
        return saved["create_masked_load"](self, ptrs, mask, other, *rest)

    def masked_store(self, ptrs, value, mask, *rest):  # noqa: ANN001, ANN202
        check(ptrs, mask, "store")
        return saved["create_masked_store"](self, ptrs, value, mask, *rest)

    def block_pointer(method):  # noqa: ANN001, ANN202
        """A load or store through a block pointer (tl.make_block_ptr): the addresses the interpreter materialises
        from the pointer's base carry the base's extent, so that masked_load / masked_store check them against it."""
        @functools.wraps(method)
        def wrapped(self, ptr, *args, **kwargs):  # noqa: ANN001, ANN202
            materialize = ptr.materialize_pointers

            def with_extent(boundary_check):  # noqa: ANN001, ANN202
                ptrs, masks = materialize(boundary_check)
                if "dgps_extent" in ptr.base.attr:
                    ptrs.attr = {**ptrs.attr, "dgps_extent": ptr.base.attr["dgps_extent"]}
                return ptrs, masks

            ptr.materialize_pointers = with_extent
            try:
                return method(self, ptr, *args, **kwargs)
            finally:
                del ptr.materialize_pointers
        return wrapped

    def set_grid_idx(self, x, y, z):  # noqa: ANN001, ANN202
        state["program"] = (x, y, z)
        return saved["set_grid_idx"](self, x, y, z)

    def grid_call(self, *args, **kwargs):  # noqa: ANN001, ANN202
        params = list(inspect.signature(self.fn).parameters)
        given = dict(zip(params, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
        tensors = [(k, given[k]) for k in params if k in given and hasattr(given[k], "data_ptr")]
        state["kernel"] = getattr(self.fn, "__name__", "?")
        state["args"] = [_extent(ti._unwrap_tensor(v), k) for k, v in tensors]
        state["pending"] = list(state["args"])  # the interpreter converts them in this order (_implicit_cvt)
        return saved_call(self, *args, **kwargs)

    def implicit_cvt(arg):  # noqa: ANN001, ANN202
        out = saved_cvt(arg)
        if hasattr(arg, "data_ptr") and isinstance(out, tl.tensor):
            pending = state.get("pending", [])
            i = next((i for i, e in enumerate(pending) if e.lo == arg.data_ptr()), None)
            if i is not None:
                out.handle.attr = {**out.handle.attr, "dgps_extent": pending.pop(i)}
        return out

    try:
        for name, method in saved.items():
            if name not in ("create_masked_load", "create_masked_store", "set_grid_idx"):
                setattr(builder, name, carry(method))
        builder.create_masked_load = masked_load
        builder.create_masked_store = masked_store
        for name in ("create_tensor_pointer_load", "create_tensor_pointer_store"):
            setattr(builder, name, block_pointer(saved[name]))
        builder.set_grid_idx = set_grid_idx
        ti.GridExecutor.__call__ = grid_call
        ti._implicit_cvt = implicit_cvt
        yield stats
    finally:
        for name, method in saved.items():
            setattr(builder, name, method)
        ti.GridExecutor.__call__ = saved_call
        ti._implicit_cvt = saved_cvt


def run_spec(path: str, *, B: int = 1, T: int = 130, H: int = 2, HV: int = 2, dk: int = 32, dv: int = 32,
             lens: tuple[int, ...] = (), launch: str = "", seed: int = 0) -> Stats:
    """A spec's chunk forward and backward (training path) under `checked_bounds`; `lens`: B = 1 packed sequences of
    these lengths (cu_seqlens; T their sum); `launch` as DGPS_LAUNCH's "stage=BK,BV,warps,stages;..." replacing the
    launch table's settings. Returns the access counts."""
    import torch

    import dgps
    from dgps.codegen.launch import parse_launch_overrides
    from dgps.runtime.compile import load_chunk
    from dgps.runtime.reference import random_states
    from dgps.runtime.tensors import Dims

    rec = dgps.load(path)
    mod = load_chunk(rec.ir)
    saved = dict(mod.LAUNCH_OVERRIDES)
    mod.LAUNCH_OVERRIDES.update(parse_launch_overrides(launch))
    try:
        if lens:
            B, T = 1, sum(lens)
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32) if lens else None
        x = rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=seed)
        x = {k: v.to(torch.bfloat16) for k, v in x.items()}
        states = random_states(rec.ir, Dims(B, T, H, HV, dk, dv), len(lens) or B, seed)
        do = torch.randn(B, T, HV, dv, generator=torch.Generator().manual_seed(seed + 1)).to(torch.bfloat16)
        with checked_bounds() as stats:
            _, kept = mod.chunk_forward_train(x, initial_state=states, cu_seqlens=cu)
            mod.chunk_backward(x, initial_state=states, do=do, kept=kept, cu_seqlens=cu)
        return stats
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    for dim, default in (("B", 1), ("T", 130), ("H", 2), ("HV", 2), ("dk", 32), ("dv", 32)):
        p.add_argument(f"--{dim}", type=int, default=default)
    p.add_argument("--lens", type=int, nargs="*", default=(), help="packed sequences of these lengths (B = 1)")
    p.add_argument("--launch", default="", help='"stage=BK,BV,warps,stages;..." (as DGPS_LAUNCH)')
    a = p.parse_args()
    stats = run_spec(a.spec, B=a.B, T=a.T, H=a.H, HV=a.HV, dk=a.dk, dv=a.dv, lens=tuple(a.lens),
                     launch=a.launch)
    print(f"{a.spec}: no access out of bounds ({stats.accesses} loads and stores checked, {stats.unattributed} "
          "against the union of the arguments)")


if __name__ == "__main__":
    main()
