"""runtime/warmup.py: the opt-in parallel first compile hands every kernel of a launch list to `warmup` once."""

from __future__ import annotations

import pytest

from dgps.runtime import warmup


class _Kernel:
    """Stands in for a JITFunction: records its warmup calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], dict]] = []

    def warmup(self, *, grid: tuple[int, ...], **kwargs: object) -> None:
        self.calls.append((grid, kwargs))


def test_every_kernel_is_warmed_once_per_key() -> None:
    a, b = _Kernel(), _Kernel()
    launches = [(a, (4, 2), {"x": 1, "num_warps": 4}), (b, (8,), {"y": 2, "num_warps": 8})]
    key = ("test_every_kernel_is_warmed_once_per_key", 1)
    assert warmup.compile_in_parallel(launches, key, workers=2)
    assert a.calls == [((4, 2), {"x": 1, "num_warps": 4})]
    assert b.calls == [((8,), {"y": 2, "num_warps": 8})]
    # the same launch list again (a second call of the same shape): nothing is compiled twice
    assert not warmup.compile_in_parallel(launches, key, workers=2)
    assert len(a.calls) == len(b.calls) == 1
    # another shape is another key
    assert warmup.compile_in_parallel(launches, key + (2,), workers=2)
    assert len(a.calls) == 2


def test_threads_mode_builds_every_kernels_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton would build each launcher (a C extension) at the kernel's first launch, one after another: the threads
    mode builds them in its pool, from each compiled kernel's source and metadata; one that fails is left to that
    launch."""

    class Compiled:
        def __init__(self, name: str) -> None:
            self.src, self.metadata = f"src {name}", f"meta {name}"

    class Kernel(_Kernel):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def warmup(self, *, grid: tuple[int, ...], **kwargs: object) -> Compiled:
            super().warmup(grid=grid, **kwargs)
            return Compiled(self.name)

    built: list[tuple[str, str]] = []

    def launcher(src: str, metadata: str) -> None:
        if src == "src bad":
            raise RuntimeError("no C compiler")
        built.append((src, metadata))

    monkeypatch.setattr(warmup, "_launcher_cls", lambda target=None: launcher)
    launches = [(Kernel(n), (1,), {"x": 1}) for n in ("a", "bad", "b")]
    assert warmup.compile_in_parallel(launches, ("test_threads_mode_builds_every_kernels_launcher",), workers=2)
    assert sorted(built) == [("src a", "meta a"), ("src b", "meta b")]


@pytest.mark.parametrize(("value", "mode"), [(None, "threads"), ("0", "off"), ("off", "off"), ("", "threads"),
                                             ("1", "processes"), ("threads", "threads"), ("fork", "fork"),
                                             ("processes", "processes")])
def test_threads_by_default(monkeypatch: pytest.MonkeyPatch, value: str | None, mode: str) -> None:
    if value is None:
        monkeypatch.delenv("DGPS_PARALLEL_COMPILE", raising=False)
    else:
        monkeypatch.setenv("DGPS_PARALLEL_COMPILE", value)
    assert warmup.parallel_compile_mode() == mode
    assert warmup.parallel_compile_enabled() is (mode != "off")


_FAKE_KERNEL_MODULE = '''
import json, os


class _Recorder:
    """Stands in for a JITFunction in a worker: appends each warmup's arguments to a file."""

    def __init__(self, name):
        self.fn = self
        self.__name__ = name

    def warmup(self, *, grid, **kwargs):
        seen = {k: ([str(v.dtype), v.data_ptr() % 16 == 0] if hasattr(v, "dtype") else v) for k, v in kwargs.items()}
        with open(os.environ["DGPS_TEST_WARMUP_LOG"], "a") as fh:
            fh.write(json.dumps([self.__name__, list(grid), seen]) + "\\n")


kernel_a = _Recorder("kernel_a")
kernel_b = _Recorder("kernel_b")
'''


def test_processes_mode_replays_each_warmup_in_a_worker(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile workers (DGPS_PARALLEL_COMPILE=1) get each launch as its kernel's module file and name, the
    constants as they are and each tensor as its dtype and 16-byte alignment, and call that kernel's warmup."""
    import importlib.util
    import json
    import sys

    import torch

    path = tmp_path / "fake_kernels_for_warmup.py"
    path.write_text(_FAKE_KERNEL_MODULE)
    spec = importlib.util.spec_from_file_location("fake_kernels_for_warmup", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("DGPS_TEST_WARMUP_LOG", str(log))
    monkeypatch.setenv("DGPS_PARALLEL_COMPILE", "1")
    monkeypatch.setattr(warmup, "_WORKERS", [])
    x = torch.zeros(64, dtype=torch.bfloat16)
    launches = [(mod.kernel_a, (4, 2), {"p_x": x, "DK": 128, "scale": 0.25, "num_warps": 4}),
                (mod.kernel_b, (8,), {"p_y": x[1:], "s": None, "INTERPRET": False})]
    try:
        assert warmup.compile_in_parallel(launches, ("test_processes_mode", 1), workers=2)
    finally:
        for w in warmup._WORKERS:
            w.stdin.close()
            w.wait(timeout=60)
    seen = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert seen == [["kernel_a", [4, 2], {"p_x": ["torch.bfloat16", True], "DK": 128, "scale": 0.25, "num_warps": 4}],
                    ["kernel_b", [8], {"p_y": ["torch.bfloat16", False], "s": None, "INTERPRET": False}]]


def test_a_launch_workers_cannot_replay_takes_the_threads_path() -> None:
    assert warmup._job(_Kernel(), (1,), {"x": 1}) is None  # no module file behind the kernel


_SCALE_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def scale_kernel(p_x, p_y, n, scale, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(p_y + o, tl.load(p_x + o, mask=m) * scale, mask=m)
'''

_WORKER_THEN_HOST = '''
import importlib.util, json, os, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from dgps.runtime import warmup


class HopperWithoutGPU:
    """Enough of a driver for JITFunction.run(warmup=True), the host's own path, to compile for sm_90 here."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


spec = importlib.util.spec_from_file_location("scale_kernels", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["scale_kernels"] = mod
spec.loader.exec_module(mod)
x = torch.zeros(256, dtype=torch.bfloat16)
kw = {"p_x": x, "p_y": x[1:], "n": 255, "scale": 0.5, "BLOCK": 128, "num_warps": 4}
driver.set_active(HopperWithoutGPU())
cache = os.environ["TRITON_CACHE_DIR"]
if sys.argv[2] == "workers":
    os.environ["DGPS_PARALLEL_COMPILE"] = "1"
    assert warmup.compile_in_parallel([(mod.scale_kernel, (2,), kw)], ("worker_then_host",), workers=1)
    for w in warmup._WORKERS:
        w.stdin.close()
        w.wait(timeout=120)
elif sys.argv[2] == "forks":
    os.environ["DGPS_PARALLEL_COMPILE"] = "fork"
    kw2 = dict(kw, BLOCK=64)  # a second kernel of the list: two children
    assert warmup.compile_in_parallel([(mod.scale_kernel, (2,), kw), (mod.scale_kernel, (4,), kw2)],
                                      ("fork_then_host",))
    mod.scale_kernel.warmup(grid=(4,), **kw2)
before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
mod.scale_kernel.warmup(grid=(2,), **kw)
print(json.dumps({"by_workers": len(before), "by_host": len(set(os.listdir(cache)) - before)}))
'''


@pytest.mark.parametrize("first", ["workers", "forks", "host"])
def test_a_workers_kernel_is_the_one_the_hosts_launch_loads(tmp_path, first: str) -> None:
    """A compile worker (or forked child) holds no CUDA context: it binds and packs the arguments as JITFunction.run
    does and compiles for the host's target, so the host's own launch path computes the same on-disk cache key and
    loads the worker's kernel instead of compiling (no new cache entry). Run without a GPU: a stand-in driver lets the
    host's path compile for sm_90; with no worker first, that path compiles the kernel itself (the check can fail)."""
    import json
    import os
    import subprocess
    import sys

    kernels = tmp_path / "scale_kernels.py"
    kernels.write_text(_SCALE_KERNEL)
    script = tmp_path / "worker_then_host.py"
    script.write_text(_WORKER_THEN_HOST)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(DGPS_NO_AUTO_INTERPRET="1", TRITON_CACHE_DIR=str(tmp_path / "triton"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, str(script), str(kernels), first], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    if first == "workers":  # the kernel, and its launcher where this machine can link one
        assert counts["by_workers"] >= 1 and counts["by_host"] == 0
    elif first == "forks":  # both kernels of the list, each by its own child
        assert counts["by_workers"] >= 2 and counts["by_host"] == 0
    else:
        assert counts == {"by_workers": 0, "by_host": 1}


def test_workers_import_the_starting_module_before_their_first_job(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk module starts the workers naming itself: each imports it (and Triton's compiler) while the host still
    builds its first inputs, not when the first launch list arrives."""
    import time

    marker = tmp_path / "imported"
    path = tmp_path / "starting_module.py"
    path.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    monkeypatch.setenv("DGPS_PARALLEL_COMPILE", "1")
    monkeypatch.setattr(warmup, "_WORKERS", [])
    warmup.start_compile_workers(1, module=("starting_module_for_warmup", str(path)))
    try:
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert marker.exists() and marker.read_text() == "x"  # imported once, with no job sent
    finally:
        for w in warmup._WORKERS:
            w.stdin.close()
            w.wait(timeout=60)


def test_a_failing_fork_leaves_its_kernel_to_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child whose job fails (or that outlives FORK_TIMEOUT_S) makes the list report False: the launches then compile
    what is missing themselves; the children of the others still ran."""
    import os

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork (Linux, macOS); elsewhere the threads mode runs")
    answers = {"good": "ok", "bad": "error RuntimeError: ptxas failed", "slow": None}

    def fake_run_job(job: dict) -> str:
        if answers[job["kernel"]] is None:
            import time

            time.sleep(60)
        return answers[job["kernel"]]

    monkeypatch.setattr(warmup, "_run_job", fake_run_job)
    job = {"module": "m", "file": "f", "grid": [1], "kwargs": {}, "target": ["cuda", 90, 32]}
    assert warmup._compile_in_forks([dict(job, kernel="good"), dict(job, kernel="good")])
    assert not warmup._compile_in_forks([dict(job, kernel="good"), dict(job, kernel="bad")])
    monkeypatch.setattr(warmup, "FORK_TIMEOUT_S", 2.0)
    assert not warmup._compile_in_forks([dict(job, kernel="slow")])
