"""Launch a plan's kernels without Triton's per-call argument binding.

`kernel[grid](**kwargs)` binds, type-checks and specialises every argument on every call, then looks the
compiled kernel up: about 15–20 µs per launch on the H200's host (2026-12-01, benchmarks/host_overhead.py
--breakdown), while a gdn forward at a few thousand tokens runs 5 kernels of 20–100 µs. At the reference shape
both dgps and FLA were host-bound (wall clock above the kernel sum). A chunk plan launches the same kernels
with the same constexprs and integers on every call of one geometry; only the tensors change. So the first call
of a geometry goes through Triton's own path and records the compiled kernel Triton chose for each launch;
later calls hand the arguments, in the kernel's parameter order, straight to that kernel's launcher.

What Triton specialises a compiled kernel on, besides constexprs and integers (fixed by the geometry key): each
tensor's dtype and whether its address is 16-byte aligned. Both are part of the per-call key, so a tensor of
another dtype or alignment takes the bound path (and Triton compiles or finds the matching kernel).
The interpreter (TRITON_INTERPRET=1) and any Triton whose compiled kernels lack the launcher attributes used
here keep the bound path.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

# (kernel, grid, constant keyword arguments (num_warps / num_stages included), names of the tensor arguments)
Launch = tuple[Any, tuple[int, ...], dict[str, Any], tuple[str, ...]]

_COMPILED: dict[Hashable, list[tuple[Any, tuple[int, ...], tuple[tuple[bool, Any], ...]]]] = {}
_LIST_NAMES: dict[Hashable, tuple[str, ...]] = {}  # launch-list key -> its distinct tensor arguments
_MAX_ENTRIES = 256


# DGPS_BOUND_LAUNCH=1: every launch through Triton's bound path (to compare, or to rule this module out)
BOUND_ONLY = os.environ.get("DGPS_BOUND_LAUNCH", "0") not in ("", "0")


def current_stream() -> Any:
    """The current CUDA stream's handle, as Triton's launcher takes it."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(driver.active.get_current_device())


def _tensor_key(tensors: Mapping[str, torch.Tensor], names: Sequence[str]) -> tuple:
    return tuple([(t.dtype, t.data_ptr() & 15 == 0) for t in map(tensors.__getitem__, names)])


def launch_all(launches: Sequence[Launch], tensors: Mapping[str, torch.Tensor], key: Hashable,
               interpret: bool = False) -> None:
    """Launch every (kernel, grid, constants, tensor names) of `launches` in order. `key` must identify the launch
    list among all callers (the calling module, its kernels, constexprs, integers, the device); `tensors` maps
    argument names to this call's tensors."""
    if interpret or BOUND_ONLY:
        for kernel, grid, const, names in launches:
            kernel[grid](**const, **{n: tensors[n] for n in names})
        return
    names = _LIST_NAMES.get(key)
    if names is None:
        names = _LIST_NAMES[key] = tuple(dict.fromkeys(n for launch in launches for n in launch[3]))
    call_key = (key, _tensor_key(tensors, names))
    compiled = _COMPILED.get(call_key)
    if compiled is None:
        _record(launches, tensors, call_key)
        return
    from triton import knobs

    stream = current_stream()
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    for ck, grid, spec in compiled:
        args = [tensors[v] if is_tensor else v for is_tensor, v in spec]
        meta = ck.launch_metadata(grid, stream, *args) if enter is not None else None
        ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, meta, enter, leave, *args)


def _record(launches: Sequence[Launch], tensors: Mapping[str, torch.Tensor], call_key: Hashable) -> None:
    """Launch through Triton's bound path, keeping each launch's compiled kernel and argument order."""
    compiled: list | None = []
    for kernel, grid, const, names in launches:
        ck = kernel[grid](**const, **{n: tensors[n] for n in names})
        params = getattr(kernel, "arg_names", None)
        # replayable: a compiled kernel with a launcher, and every parameter given (none left to its default)
        replayable = params is not None and set(params) <= set(names) | set(const) and \
            all(hasattr(ck, a) for a in ("run", "function", "packed_metadata", "launch_metadata"))
        if compiled is not None and replayable:
            grid3 = (tuple(grid) + (1, 1))[:3]
            compiled.append((ck, grid3, tuple((p in names, p if p in names else const[p]) for p in params)))
        else:
            compiled = None
    if compiled is not None:
        if len(_COMPILED) >= _MAX_ENTRIES:
            _COMPILED.clear()
        _COMPILED[call_key] = compiled
