"""Test-session setup: without a GPU, Triton kernels run under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is first imported, so this runs at conftest import time.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _speed_up_interpreter() -> None:
    """Skip Triton's re-patching of triton.language on every nested @jit call (tl.sum, helpers).

    GridExecutor patches the language once per launch and restores it afterwards; InterpretedFunction
    patches it again on each device-function call and never restores that, so skipping the nested
    patch while a launch's patch is active changes nothing but the time (~9 ms per call).
    """
    try:
        import inspect

        import triton.language as tl
        import triton.runtime.interpreter as ti
    except ImportError:
        return
    if getattr(ti, "_dgps_fast_patch", False) or not hasattr(ti, "_patch_lang"):
        return
    orig_patch, orig_grid_call = ti._patch_lang, ti.GridExecutor.__call__
    state: dict = {"done": set()}

    class _NoScope:
        def restore(self):
            pass

    def patch(fn):
        key = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        if key in state["done"]:
            return _NoScope()
        scope = orig_patch(fn)
        state["done"].add(key)
        return scope

    def grid_call(self, *args, **kwargs):
        state["done"] = set()
        try:
            return orig_grid_call(self, *args, **kwargs)
        finally:
            state["done"] = set()

    ti._patch_lang = patch
    ti.GridExecutor.__call__ = grid_call
    ti._dgps_fast_patch = True




if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    _speed_up_interpreter()


def record_launches(mod, fn: Callable[[], object], bufs: dict | None = None, *, run: bool = True) -> list[str]:  # noqa: ANN001
    """The kernel names `fn` launches through `mod`, in order; `bufs` (if given) gathers the buffers each launch
    allocated; `run=False` records without running the kernels (the launch list alone, no outputs)."""
    names: list[str] = []
    launch = mod._Run.launch

    def record(self, kernels):  # noqa: ANN001, ANN202
        names.extend(k[1].__name__ for k in kernels)
        if bufs is not None:
            bufs.update(self.bufs)
        return launch(self, kernels) if run else None

    mod._Run.launch = record
    try:
        fn()
    finally:
        mod._Run.launch = launch
    return names


@pytest.fixture
def launched() -> Callable:
    """record_launches: the kernels a call launches through a generated chunk module."""
    return record_launches


@pytest.fixture
def launch_list() -> Callable:
    """record_launches without running the kernels: the launch list (and buffers) alone, no outputs."""
    return functools.partial(record_launches, run=False)
