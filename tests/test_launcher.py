"""runtime/launcher.py: the direct launches replay exactly what Triton's bound path was given.

No GPU here, so Triton's kernels are stood in for by objects with the same attributes: a JIT function whose
`kernel[grid](**kwargs)` records the call and returns a compiled kernel whose `run` records its arguments.
"""

from __future__ import annotations

import pytest
import torch

from dgps.runtime import launcher


class _Compiled:
    def __init__(self, log: list) -> None:
        self.log, self.function, self.packed_metadata = log, "fn", "meta"

    def launch_metadata(self, grid, stream, *args):  # noqa: ANN001, ANN201
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *args):  # noqa: ANN001, ANN201
        self.log.append(("direct", (g0, g1, g2), stream, args))


class _Kernel:
    def __init__(self, arg_names: list[str], compiled_attrs: bool = True) -> None:
        self.arg_names, self.log = arg_names, []
        self.compiled = _Compiled(self.log) if compiled_attrs else object()

    def __getitem__(self, grid):  # noqa: ANN001, ANN204
        def call(**kwargs):  # noqa: ANN202
            self.log.append(("bound", tuple(grid), kwargs))
            return self.compiled
        return call


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    launcher._COMPILED.clear()
    launcher._LIST_NAMES.clear()
    monkeypatch.setattr(launcher, "BOUND_ONLY", False)
    monkeypatch.setattr(launcher, "current_stream", lambda: 7)


def _launches(kernel: _Kernel) -> list:
    return [(kernel, (4, 2), {"H": 16, "scale": 0.5, "num_warps": 4, "num_stages": 2}, ("x", "y"))]


def test_second_call_replays_the_bound_arguments_in_parameter_order() -> None:
    kernel = _Kernel(["x", "H", "y", "scale"])
    t = {"x": torch.zeros(8), "y": torch.ones(8)}
    launcher.launch_all(_launches(kernel), t, "geom")
    t2 = {"x": torch.zeros(8), "y": torch.ones(8)}
    launcher.launch_all(_launches(kernel), t2, "geom")
    assert kernel.log[0][0] == "bound" and kernel.log[0][2]["x"] is t["x"]
    kind, grid, stream, args = kernel.log[1]
    assert (kind, grid, stream) == ("direct", (4, 2, 1), 7)
    assert args[0] is t2["x"] and args[1] == 16 and args[2] is t2["y"] and args[3] == 0.5


@pytest.mark.parametrize("change", ["alignment", "dtype"])
def test_a_tensor_triton_would_specialise_differently_takes_the_bound_path(change: str) -> None:
    kernel = _Kernel(["x", "H", "y", "scale"])
    base = torch.zeros(16, dtype=torch.bfloat16)
    launcher.launch_all(_launches(kernel), {"x": base[:8], "y": base[8:]}, "geom")
    launcher.launch_all(_launches(kernel), {"x": base[:8], "y": base[8:]}, "geom")
    other = base[1:9] if change == "alignment" else torch.zeros(8)  # 2 bytes off the 16-byte grid / fp32
    launcher.launch_all(_launches(kernel), {"x": other, "y": base[8:]}, "geom")
    assert [e[0] for e in kernel.log] == ["bound", "direct", "bound"]


def test_interpreter_and_kernels_without_a_launcher_keep_the_bound_path() -> None:
    kernel = _Kernel(["x", "H", "y", "scale"])
    t = {"x": torch.zeros(8), "y": torch.ones(8)}
    for _ in range(3):
        launcher.launch_all(_launches(kernel), t, "geom", interpret=True)
    plain = _Kernel(["x", "H", "y", "scale"], compiled_attrs=False)
    for _ in range(3):
        launcher.launch_all(_launches(plain), t, "other")
    assert [e[0] for e in kernel.log + plain.log] == ["bound"] * 6


def test_a_parameter_left_to_its_default_keeps_the_bound_path() -> None:
    kernel = _Kernel(["x", "H", "y", "scale", "EXTRA"])
    t = {"x": torch.zeros(8), "y": torch.ones(8)}
    for _ in range(2):
        launcher.launch_all(_launches(kernel), t, "geom")
    assert [e[0] for e in kernel.log] == ["bound", "bound"]


def test_cu_seqlens_read_once_per_tensor_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_cu_seqlens reads a cu_seqlens tensor (a device-to-host copy that waits for the queued kernels on a GPU)
    once per tensor object and version: the training step's forward and its backward's rerun read it once; an
    in-place change is read again, and a bad one still refused."""
    from dgps.runtime import tensors as tm

    reads = []
    real = torch.Tensor.tolist

    def counting_tolist(self):  # noqa: ANN001, ANN202
        reads.append(self.data_ptr())
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    dims = tm.Dims(1, 100, 1, 1, 8, 8)
    cu = torch.tensor([0, 1, 65, 100], dtype=torch.int32)
    assert tm.check_cu_seqlens(cu, dims) == [(0, 1), (1, 65), (65, 100)]
    assert tm.check_cu_seqlens(cu, dims) == [(0, 1), (1, 65), (65, 100)]
    assert len(reads) == 1
    cu[1] = 30  # in place: a new version
    assert tm.check_cu_seqlens(cu, dims) == [(0, 30), (30, 65), (65, 100)]
    assert len(reads) == 2
    cu[2] = 10
    with pytest.raises(tm.TensorError, match="strictly increasing"):
        tm.check_cu_seqlens(cu, dims)
    other = torch.tensor([0, 1, 65, 100], dtype=torch.int32)  # equal values, another tensor: read
    tm.check_cu_seqlens(other, dims)
    assert len(reads) == 4
    with pytest.raises(tm.TensorError, match="end at T"):  # the cached tensor against another T: checked again
        tm.check_cu_seqlens(other, tm.Dims(1, 90, 1, 1, 8, 8))
    with torch.inference_mode():  # no version counter: read every time
        inf = torch.tensor([0, 50, 100], dtype=torch.int32)
        tm.check_cu_seqlens(inf, dims)
        tm.check_cu_seqlens(inf, dims)
    assert len(reads) == 7


class _Launcher36:
    """Stands in for Triton 3.6's CudaLauncher: the same __call__ signature, scratch sizes and C `launch`."""

    def __init__(self, log: list, scratch: int = 0) -> None:
        self.log, self.global_scratch_size, self.profile_scratch_size = log, scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # noqa: ANN001, ANN204, N803
        self.log.append(("wrapper", (gridX, gridY, gridZ), stream, args))

    def launch(self, *args):  # noqa: ANN002, ANN201
        self.log.append(("c_launch", args))


class _Chain:
    """A Triton 3.6 HookChain: never None, empty unless a hook was added."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def __call__(self, *args) -> None:  # noqa: ANN002
        for c in self.calls:
            c(*args)


@pytest.mark.parametrize("scratch", [0, 64])
def test_triton_36_launcher_called_at_its_c_launch_with_the_wrapper_s_arguments(scratch: int,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3.6 launcher without scratch is called at its C launch, with exactly what its __call__ would pass (grid,
    stream, function, cooperative, PDL, no scratch, then metadata, hooks and the arguments); one with scratch keeps
    its __call__, which allocates it."""
    import triton
    from triton import knobs

    monkeypatch.setattr(launcher, "_DIRECT_TRITON", (triton.__version__,))
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", _Chain([]))
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", _Chain([]))
    kernel = _Kernel(["x", "H", "y", "scale"])
    kernel.compiled.run = _Launcher36(kernel.log, scratch)
    t = {"x": torch.zeros(8), "y": torch.ones(8)}
    launcher.launch_all(_launches(kernel), t, "geom")
    launcher.launch_all(_launches(kernel), t, "geom")
    kind, *rest = kernel.log[1]
    if scratch:
        assert kind == "wrapper" and rest[0] == (4, 2, 1) and rest[1] == 7
        args = rest[2]
        assert args[:4] == ("meta", None, None, None)  # packed metadata; empty chains: no metadata, no hooks
        assert args[4] is t["x"] and args[5:] == (16, t["y"], 0.5)
        return
    assert kind == "c_launch"
    args = rest[0]
    assert args[:11] == (4, 2, 1, 7, "fn", False, True, None, None, "meta", None) and args[11:13] == (None, None)
    assert args[13] is t["x"] and args[14:] == (16, t["y"], 0.5)


def test_a_launch_hook_gets_the_launch_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty hook chain is no hook (no metadata formed); a chain with a hook (a profiler's) is passed on with the
    metadata, as Triton's own path passes them."""
    from triton import knobs

    formed = []

    class Compiled(_Compiled):
        def launch_metadata(self, grid, stream, *args):  # noqa: ANN001, ANN201
            formed.append(grid)
            return {"name": "k"}

    kernel = _Kernel(["x", "H", "y", "scale"])
    kernel.compiled = Compiled(kernel.log)
    kernel.compiled.run = lambda *a: kernel.log.append(("run", a))
    t = {"x": torch.zeros(8), "y": torch.ones(8)}
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", _Chain([]))
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", _Chain([]))
    launcher.launch_all(_launches(kernel), t, "geom")
    launcher.launch_all(_launches(kernel), t, "geom")
    assert formed == [] and kernel.log[1][1][6:9] == (None, None, None)
    hook = _Chain([lambda meta: None])
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    launcher.launch_all(_launches(kernel), t, "geom")
    assert formed == [(4, 2, 1)] and kernel.log[2][1][6:9] == ({"name": "k"}, hook, None)
