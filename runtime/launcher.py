"""Launch a plan's kernels without Triton's per-call argument binding.

`kernel[grid](**kwargs)` binds, type-checks and specialises every argument on every call, then looks the
compiled kernel up: about 15–20 µs per launch on the H200's host (2026-12-01, benchmarks/host_overhead.py
--breakdown), while a gdn forward at a few thousand tokens runs 5 kernels of 20–100 µs. At the reference shape
both dgps and FLA were host-bound (wall clock above the kernel sum). A chunk plan launches the same kernels
with the same constexprs and integers on every call of one geometry; only the tensors change. So the first call
of a geometry goes through Triton's own path and records the compiled kernel Triton chose for each launch;
later calls hand the arguments, in the kernel's parameter order, straight to that kernel's launcher (on Triton 3.6,
to the C launch under its Python frame where the kernel uses no scratch: `_direct`), with no launch hooks or
metadata where Triton has no hook registered (`launch_hooks`).

What Triton specialises a compiled kernel on, besides constexprs and integers (fixed by the geometry key): each
tensor's dtype and whether its address is 16-byte aligned. Both are part of the per-call key, so a tensor of
another dtype or alignment takes the bound path (and Triton compiles or finds the matching kernel).
The interpreter (TRITON_INTERPRET=1) and any Triton whose compiled kernels lack the launcher attributes used
here keep the bound path.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

# (kernel, grid, constant keyword arguments (num_warps / num_stages included), names of the tensor arguments)
Launch = tuple[Any, tuple[int, ...], dict[str, Any], tuple[str, ...]]

# launch-list key and tensor key -> per launch: (compiled kernel, grid, (is a tensor, name or value) per parameter,
# _direct's C launch or None)
_COMPILED: dict[Hashable, list[tuple[Any, tuple[int, ...], tuple[tuple[bool, Any], ...], Any]]] = {}
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
    stream = current_stream()
    enter, leave = launch_hooks()
    hooked = enter is not None or leave is not None
    for ck, grid, spec, direct in compiled:
        args = [tensors[v] if is_tensor else v for is_tensor, v in spec]
        meta = ck.launch_metadata(grid, stream, *args) if hooked else None
        if direct is not None:
            launch, cooperative, pdl = direct
            launch(grid[0], grid[1], grid[2], stream, ck.function, cooperative, pdl, None, None, ck.packed_metadata,
                   meta, enter, leave, *args)
        else:
            ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, meta, enter, leave, *args)


def launch_hooks() -> tuple[Any, Any]:
    """Triton's launch enter and exit hooks, None where there is none. Triton 3.6 keeps each as a HookChain, never
    None; its C launcher calls a hook that is not None, and a hook is what reads the launch metadata, which takes a
    few µs a launch to form. An empty chain is no hook: None for it skips both (a profiler's hook, once added, is
    called as before)."""
    from triton import knobs

    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return (None if getattr(enter, "calls", None) == [] else enter), (None if getattr(leave, "calls", None) == [] else leave)


# Triton versions whose CUDA launcher's __call__ is known to only allocate scratch (none where both sizes are 0) and
# forward to its C `launch` as (grid, stream, function, cooperative, pdl, global scratch, profile scratch, *rest)
_DIRECT_TRITON = ("3.6.",)


def _direct(ck: Any) -> tuple[Any, bool, bool] | None:
    """(C launch, cooperative grid, PDL) of a compiled kernel whose launcher can be skipped: Triton 3.6's
    CudaLauncher.__call__ is a Python frame (two scratch allocations, both None at size 0) around the C launch, ~3 µs
    of host time a launch. Anything else (another Triton, scratch in use, another launcher): None, ck.run as is."""
    import triton

    run = getattr(ck, "run", None)
    call = type(run).__dict__.get("__call__")  # the launcher class's own __call__, not an inherited one
    code = getattr(call, "__code__", None)
    if (code is None or not triton.__version__.startswith(_DIRECT_TRITON)
            or code.co_varnames[:code.co_argcount] != ("self", "gridX", "gridY", "gridZ", "stream", "function")
            or not code.co_flags & inspect.CO_VARARGS):
        return None
    if getattr(run, "global_scratch_size", 1) != 0 or getattr(run, "profile_scratch_size", 1) != 0:
        return None
    if not all(hasattr(run, a) for a in ("launch", "launch_cooperative_grid", "launch_pdl")):
        return None
    return run.launch, run.launch_cooperative_grid, run.launch_pdl


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
            compiled.append((ck, grid3, tuple((p in names, p if p in names else const[p]) for p in params),
                             _direct(ck)))
        else:
            compiled = None
    if compiled is not None:
        if len(_COMPILED) >= _MAX_ENTRIES:
            _COMPILED.clear()
        _COMPILED[call_key] = compiled
