"""Compile a launch list's kernels in parallel before its first launch (DGPS_PARALLEL_COMPILE; threads by default).

A cold first call JIT-compiles every kernel of the plan one after another (21.0 s for gdn's first training step in a
fresh process on the H200, run 48; 11 kernel compiles, 8 s, and 11 launcher builds, 3.3 s). Two ways to do it at once,
both leaving the compiled kernels in Triton's on-disk cache or the kernels' own caches, so the launches that follow
find them:

- threads (the default; ``DGPS_PARALLEL_COMPILE=threads``): Triton's AsyncCompileMode (a private module of Triton
  3.6–3.9; without it, the launches compile one by one) hands each `warmup` to a thread pool, then the pool builds
  each kernel's launcher. Triton's passes hold the GIL, so only ptxas and the launchers' C compiles overlap: 16.1 s
  against 21.0 serial in run 48, 19.1 against 24.6 in run 49 (another host).
- ``DGPS_PARALLEL_COMPILE=1`` (or ``processes``): compile workers, separate Python processes started when the first
  chunk module is imported (their interpreter, torch and Triton load while the host builds its first inputs),
  each compiling its share of a launch list, and its launchers, for the host's target without a CUDA context, into
  the shared on-disk cache (TRITON_CACHE_DIR). A worker sees a tensor argument only as its dtype and its 16-byte
  alignment, which is all Triton specialises a kernel on besides the constants; a kernel it could not compile, or
  compiled under another key, is simply compiled by the host at its launch, as without the option. Run 49: the
  host then only loads (0.45 s of its compiles, 0.01 s of launcher builds), but each list waited ~6 s for its
  workers (22.9 s in all). Since then a worker imports its chunk module and Triton's compiler at start and builds
  launchers without initialising Triton's CUDA driver; not yet timed on a GPU, so the mode stays opt-in.
- ``DGPS_PARALLEL_COMPILE=fork``: one forked child per kernel of the list, each compiling its kernel (and building
  its launcher) for the host's target into the on-disk cache, as a worker does, while the host waits. A fork inherits
  the host's interpreter with torch, Triton and the chunk module already imported, so nothing starts up (the
  processes mode's cost) and no two compiles share a GIL (the threads mode's). A child never touches CUDA (its
  tensors are CPU stand-ins); one that fails or outlives FORK_TIMEOUT_S is left to the launch, which then compiles
  that kernel itself. Linux only (os.fork, a GPU driver naming the target); elsewhere the threads path runs.
- ``DGPS_PARALLEL_COMPILE=0``: one by one, at each launch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
from collections.abc import Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

_WARMED: set[Hashable] = set()
_WORKERS: list[subprocess.Popen] = []
MAX_WORKERS = 8  # a launch list holds at most about that many kernels
WORKER_IDLE_S = 60.0  # a first training step's launch lists come within seconds of each other


def parallel_compile_mode() -> str:
    """"off", "threads", "fork" or "processes" (DGPS_PARALLEL_COMPILE: 0, unset / threads, fork, 1 / processes)."""
    value = os.environ.get("DGPS_PARALLEL_COMPILE", "threads").strip().lower()
    if value in ("0", "off"):
        return "off"
    if value == "fork":
        return "fork"
    return "threads" if value in ("", "threads") else "processes"


def parallel_compile_enabled() -> bool:
    return parallel_compile_mode() != "off"


def start_compile_workers(count: int | None = None, module: tuple[str, str] | None = None) -> None:
    """Start the compile workers of the processes mode, once per process, without waiting for them (a chunk module
    calls this at import, naming itself in `module` (name, file): by the first launch the workers have loaded torch,
    Triton's compiler and that module)."""
    _WORKERS[:] = [w for w in _WORKERS if w.poll() is None]  # those gone idle have exited
    if _WORKERS or parallel_compile_mode() != "processes":
        return
    # a worker imports chunk modules too: no workers of its own; real JIT functions even where no GPU is visible to it
    env = dict(os.environ, DGPS_PARALLEL_COMPILE="0", DGPS_NO_AUTO_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for _ in range(count or min(MAX_WORKERS, os.cpu_count() or 1)):
        _WORKERS.append(subprocess.Popen([sys.executable, "-m", "dgps.runtime.warmup", *(module or ())],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env=env, text=True))


def compile_in_parallel(launches: Sequence[tuple[Any, tuple[int, ...], dict[str, Any]]], key: Hashable,
                        workers: int | None = None) -> bool:
    """Compile every (kernel, grid, launch kwargs) of `launches` in parallel, once per `key` (the launch list's
    kernels and constexprs); True when it compiled, False when `key` was already warmed or the mode cannot run
    here (then the launches compile one by one, as without the option)."""
    if key in _WARMED:
        return False
    mode = parallel_compile_mode()
    if mode in ("processes", "fork"):
        jobs = [_job(kernel, grid, kwargs) for kernel, grid, kwargs in launches]
        if mode == "processes" and all(j is not None for j in jobs):
            start_compile_workers(workers)
            _WARMED.add(key)
            return _compile_in_workers(jobs)
        # a child must compile for a named target (without one it would take warmup's path, which touches CUDA)
        if mode == "fork" and hasattr(os, "fork") and all(j is not None and j["target"] for j in jobs):
            _WARMED.add(key)
            return _compile_in_forks(jobs, workers)
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return False
    _WARMED.add(key)
    workers = workers or min(len(launches), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        with AsyncCompileMode(pool):
            compiled = [kernel.warmup(grid=grid, **kwargs) for kernel, grid, kwargs in launches]
        # Triton builds each kernel's launcher (a C extension, one per argument signature, compiled by the system's C
        # compiler) at the kernel's first launch, one after another; build them here at once, into the on-disk cache
        # those launches then read (the compiler runs outside the GIL)
        list(pool.map(_build_launcher, compiled))
    return True


def _launcher_cls(target: list | None = None) -> Any:
    """The launcher class: a worker's CUDA target's directly (touching `driver.active` would initialise CUDA and build
    Triton's cuda_utils extension, one more C compile per worker), else the active driver's."""
    if target is not None and target[0] == "cuda":
        from triton.backends.nvidia.driver import CudaLauncher

        return CudaLauncher
    from triton.runtime.driver import driver

    return driver.active.launcher_cls


def _build_launcher(compiled: Any, target: list | None = None) -> None:
    try:
        kernel = compiled.result() if hasattr(compiled, "result") else compiled
        _launcher_cls(target)(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 -- the kernel's first launch builds its launcher itself, as without this
        pass


def _job(kernel: Any, grid: tuple[int, ...], kwargs: dict[str, Any]) -> dict | None:
    """One warmup as JSON a worker can replay: the kernel by module file and name, each tensor as its dtype, device
    and alignment; None where an argument has no such form (the threads path then takes the list)."""
    fn = getattr(kernel, "fn", None)
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    path = getattr(module, "__file__", None)
    if fn is None or path is None:
        return None
    args: dict[str, Any] = {}
    for name, value in kwargs.items():
        if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
            args[name] = {"tensor": str(value.dtype).removeprefix("torch."), "device": str(value.device),
                          "aligned": value.data_ptr() % 16 == 0}
        elif value is None or isinstance(value, bool | int | float | str):
            args[name] = value
        else:
            return None
    return {"module": module.__name__, "file": path, "kernel": fn.__name__, "grid": list(grid), "kwargs": args,
            "target": _target()}


def _target() -> list | None:
    """The host's compile target (backend, arch, warp size), which a worker compiles for without touching the GPU."""
    try:
        from triton.runtime.driver import driver

        t = driver.active.get_current_target()
        return [t.backend, t.arch, t.warp_size]
    except Exception:  # noqa: BLE001 -- no GPU driver: the worker takes warmup's path
        return None


def _compile_in_workers(jobs: list[dict]) -> bool:
    """Deal the jobs to the workers round-robin and wait for every answer; False if a worker has gone (the launches
    then compile what is missing themselves)."""
    live = [w for w in _WORKERS if w.poll() is None]
    if not live:
        return False
    shares = [jobs[i::len(live)] for i in range(len(live))]
    ok = True
    try:
        for worker, share in zip(live, shares, strict=True):
            assert worker.stdin is not None
            worker.stdin.write("".join(json.dumps(job) + "\n" for job in share))
            worker.stdin.flush()
        for worker, share in zip(live, shares, strict=True):
            for _ in share:
                assert worker.stdout is not None
                ok = worker.stdout.readline().strip() == "ok" and ok
    except OSError:  # a worker went away (idle exit racing this list): what it did not compile, the launch will
        return False
    return ok


FORK_TIMEOUT_S = 300.0  # a child still compiling then is killed; the launch compiles its kernel itself


def _compile_in_forks(jobs: list[dict], workers: int | None = None) -> bool:
    """Fork one child per share of `jobs` (one job each unless `workers` caps them), each running its jobs as a
    worker does and exiting; wait for all. False if any child failed or timed out (the launches then compile what
    is missing)."""
    import time
    import warnings

    count = max(1, min(len(jobs), workers or len(jobs), os.cpu_count() or 1))
    shares = [jobs[i::count] for i in range(count)]
    _prime_keys(jobs)
    children: list[int] = []
    for share in shares:
        with warnings.catch_warnings():  # Python 3.12 warns on fork in a threaded process; the child runs no
            warnings.simplefilter("ignore", DeprecationWarning)  # thread's locks: only Triton's compiler
            pid = os.fork()
        if pid == 0:  # the child: compile, then leave without the host's exit handlers (torch's, CUDA's)
            code = 0
            try:
                for job in share:
                    code |= _run_job(job) != "ok"
            except BaseException:  # noqa: BLE001 -- reported by the exit status
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    ok = True
    deadline = time.monotonic() + FORK_TIMEOUT_S
    for pid in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                ok = ok and os.waitstatus_to_exitcode(status) == 0
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                ok = False
                break
            time.sleep(0.005)
    return ok


def _prime_keys(jobs: list[dict]) -> None:
    """Compute here, once, what every child would otherwise compute first: Triton's own key (a hash over its
    installed files: 0.28 s on this CPU, cached per process), the backend's, and each kernel's source key."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.cache import triton_key

        triton_key()
        make_backend(GPUTarget(*jobs[0]["target"])).hash()
        for job in jobs:
            _ = getattr(_import_file(job["module"], job["file"]), job["kernel"]).cache_key
    except Exception:  # noqa: BLE001 -- a child computes what is missing itself
        pass


def _run_job(job: dict) -> str:
    """Compile one job's kernel and build its launcher, both into the on-disk cache: "ok", or "error ..." with
    what failed (the host compiles that kernel itself at its launch)."""
    import torch

    try:
        kernel = getattr(_import_file(job["module"], job["file"]), job["kernel"])
        if job.get("target") and hasattr(kernel, "_pack_args"):
            # host tensors stand in as CPU tensors of the same dtype and alignment: the worker never creates a
            # CUDA context (run 47: with eight of them, on one GPU, the first call was slower than serial)
            kwargs = {n: _argument(v, "cpu") for n, v in job["kwargs"].items()}
            compiled = _compile_for(kernel, kwargs, job["target"])
            _build_launcher(compiled, job["target"])
        else:
            kwargs = {n: _argument(v) for n, v in job["kwargs"].items()}
            device = next((t.device for t in kwargs.values() if isinstance(t, torch.Tensor)), None)
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)
            compiled = kernel.warmup(grid=tuple(job["grid"]), **kwargs)
            _build_launcher(compiled)  # the kernel and its launcher, both into the shared on-disk cache
        return "ok"
    except Exception as exc:  # noqa: BLE001 -- the host compiles this kernel itself at its launch
        return f"error {type(exc).__name__}: {exc}".replace("\n", " ")


def _import_file(name: str, path: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:  # an empty namespace parent, as runtime/compile.py gives packages
        ns = ModuleType(parent)
        ns.__path__ = []
        sys.modules[parent] = ns
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _argument(value: Any, device: str | None = None) -> Any:
    """A job's argument: a tensor of its dtype and alignment (on `device`, else where the host's was), else as is."""
    if not isinstance(value, dict):
        return value
    import torch

    dtype = getattr(torch, value["tensor"])
    base = torch.empty(64, dtype=dtype, device=device or value["device"])  # allocations are 64-byte aligned or more
    return base if value["aligned"] else base[1:]


def _compile_for(kernel: Any, kwargs: dict[str, Any], target: Sequence, args: tuple = ()) -> Any:
    """What `kernel.warmup(*args, **kwargs)` compiles, for `target` and without a GPU: the arguments bound,
    specialised and packed as JITFunction.run does (Triton 3.6-3.9), so the on-disk cache key is the one the host's
    launch computes and that launch loads the result instead of compiling (runtime/report.py compiles its sm_90
    report the same way)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    target_ = GPUTarget(*target)
    backend = make_backend(target_)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return compile(ASTSource(kernel, signature, constexprs, attrs), target=target_, options=options.__dict__)


def _lines(fd: int, idle_s: float) -> Iterator[str]:
    """The lines arriving on `fd` (unbuffered, so that select sees every pending byte) until it closes or stays
    silent for `idle_s` seconds."""
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line.decode()
        if not select.select([fd], [], [], idle_s)[0]:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        pending += chunk


def _worker() -> int:
    """A compile worker: one JSON job per line on stdin, "ok" or "error ..." per job on stdout. It exits when the host
    does, or after WORKER_IDLE_S without a job (a later launch list of the host starts workers again)."""
    import torch  # noqa: F401 -- loaded before the first job arrives

    if len(sys.argv) == 3:  # the chunk module that started the workers, and Triton's compiler, before the first job
        try:
            _import_file(sys.argv[1], sys.argv[2])
            import triton.compiler  # noqa: F401
        except Exception:  # noqa: BLE001 -- the job imports what it needs and reports what fails
            pass
    for line in _lines(sys.stdin.fileno(), WORKER_IDLE_S):
        try:
            answer = _run_job(json.loads(line))
        except Exception as exc:  # noqa: BLE001 -- a line that is not a job
            answer = f"error {type(exc).__name__}: {exc}".replace("\n", " ")
        print(answer, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_worker())
