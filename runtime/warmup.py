"""Compile a launch list's kernels in parallel before the first launch (opt-in, DGPS_PARALLEL_COMPILE=1).

A cold first call JIT-compiles every kernel of the plan one after another (about 21 s for gdn's training step
on the H200, 2026-12-01, run 11). Triton's AsyncCompileMode (a private module of Triton 3.6–3.9) lets
`warmup` hand each compile to an executor; the compiled kernels land in the kernels' own caches, so the
launches that follow find them. Opt-in until an H200 run has timed it: the compiles run in threads, and how
much of Triton's pipeline overlaps (ptxas runs as a subprocess; the MLIR passes may hold the GIL) is measured
there, not here.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_WARMED: set[Hashable] = set()


def parallel_compile_enabled() -> bool:
    return os.environ.get("DGPS_PARALLEL_COMPILE", "0") not in ("", "0")


def compile_in_parallel(launches: Sequence[tuple[Any, tuple[int, ...], dict[str, Any]]], key: Hashable,
                        workers: int | None = None) -> bool:
    """Compile every (kernel, grid, launch kwargs) of `launches` in parallel, once per `key` (the launch list's
    kernels and constexprs); True when it compiled, False when `key` was already warmed or Triton has no
    AsyncCompileMode (then the launches compile one by one, as without the option)."""
    if key in _WARMED:
        return False
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return False
    _WARMED.add(key)
    workers = workers or min(len(launches), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, AsyncCompileMode(pool):
        for kernel, grid, kwargs in launches:
            kernel.warmup(grid=grid, **kwargs)
    return True
