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


@pytest.mark.parametrize(("value", "enabled"), [(None, False), ("0", False), ("", False), ("1", True)])
def test_opt_in(monkeypatch: pytest.MonkeyPatch, value: str | None, enabled: bool) -> None:
    if value is None:
        monkeypatch.delenv("DGPS_PARALLEL_COMPILE", raising=False)
    else:
        monkeypatch.setenv("DGPS_PARALLEL_COMPILE", value)
    assert warmup.parallel_compile_enabled() is enabled
