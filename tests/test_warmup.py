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

    monkeypatch.setattr(warmup, "_launcher_cls", lambda: launcher)
    launches = [(Kernel(n), (1,), {"x": 1}) for n in ("a", "bad", "b")]
    assert warmup.compile_in_parallel(launches, ("test_threads_mode_builds_every_kernels_launcher",), workers=2)
    assert sorted(built) == [("src a", "meta a"), ("src b", "meta b")]


@pytest.mark.parametrize(("value", "enabled"), [(None, False), ("0", False), ("", False), ("1", True), ("threads", True)])
def test_opt_in(monkeypatch: pytest.MonkeyPatch, value: str | None, enabled: bool) -> None:
    if value is None:
        monkeypatch.delenv("DGPS_PARALLEL_COMPILE", raising=False)
    else:
        monkeypatch.setenv("DGPS_PARALLEL_COMPILE", value)
    assert warmup.parallel_compile_enabled() is enabled


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
