"""Write a standalone reproducer of one generated kernel's launch, for a report to Triton: the kernel's source and the
@triton.jit helpers of its module, and its launch as the dgps host makes it at a given shape and launch setting —
every tensor argument's shape, strides and dtype (index tensors with their values; the rest filled at random), the
scalars, the constexprs, the grid, warps and stages. The file imports torch and triton only (not dgps).

    python benchmarks/triton_repro.py pgdn chunk_bwd_grad_kernel --launch "bwd_key_grads=32,64,4,1" \\
        --shape 4 4096 16 128 -o repro_pgdn_bwd_key_grads.py
    compute-sanitizer --tool memcheck python3 repro_pgdn_bwd_key_grads.py        # on an sm_90 GPU
    TRITON_INTERPRET=1 python3 repro_pgdn_bwd_key_grads.py --device cpu          # the interpreter: the same launch

The host runs on the CPU with Triton's launcher replaced by a recorder (as the compile report does), so no kernel
runs here: the arguments are what a GPU call would pass, the values of float buffers are not (a shared-memory
fault of a compiled kernel does not depend on them).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("DGPS_NO_AUTO_INTERPRET", "1")  # real JIT functions: recorded, never run
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
INDEX_VALUES_MAX = 1 << 16  # integer tensors up to this many elements are written out with their values


@contextlib.contextmanager
def recording(calls: list) -> Iterator[None]:
    """Triton's JIT launch replaced by a recorder of (kernel, bound arguments, grid)."""
    from triton.runtime.jit import JITFunction

    def record(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202 - Triton's signature
        if warmup:  # a parallel compile ahead of the launches (stand-in tensors): the launch itself follows
            return None
        bound = dict(zip(self.arg_names, args, strict=False)) | kwargs
        calls.append((self, bound, grid(bound) if callable(grid) else tuple(grid)))

    old = JITFunction.run
    JITFunction.run = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        JITFunction.run = old  # type: ignore[method-assign]


def jit_sources(module_file: str, kernel: str) -> str:
    """The source of every @triton.jit helper of the module (names not ending in _kernel) and of `kernel`."""
    text = Path(module_file).read_text()
    lines = text.splitlines()
    out = []
    for node in ast.parse(text).body:
        if not isinstance(node, ast.FunctionDef) or not node.decorator_list:
            continue
        if "jit" not in ast.unparse(node.decorator_list[0]):
            continue
        if node.name.endswith("_kernel") and node.name != kernel:
            continue
        start = node.decorator_list[0].lineno - 1
        out.append("\n".join(lines[start:node.end_lineno]))
    return "\n\n\n".join(out)


def argument_lines(bound: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(statements building the tensors, `name=value` items of the launch) for a recorded launch."""
    build, items = [], []
    for name, v in bound.items():
        if isinstance(v, torch.Tensor):
            shape, stride = tuple(v.shape), tuple(v.stride())
            if not v.is_floating_point() and v.numel() <= INDEX_VALUES_MAX:
                build.append(f"{name} = torch.tensor({v.flatten().tolist()}, dtype={v.dtype}, "
                             f"device=dev).reshape({shape})")
            elif v.is_floating_point():
                build.append(f"{name} = torch.empty_strided({shape}, {stride}, dtype={v.dtype}, "
                             f"device=dev).normal_()")
            else:
                build.append(f"{name} = torch.zeros({shape}, dtype={v.dtype}, device=dev)")
            items.append(f"{name}={name}")
        else:
            items.append(f"{name}={v!r}")
    return build, items


def sm90_summary(fn: Any, bound: dict[str, Any]) -> str:
    """The kernel compiled for sm_90 on this machine, as the host's launch would specialise it: registers, spill and
    the shared memory its launch allocates (a fault's out-of-bounds shared address is read against this)."""
    from dgps.runtime.report import HOPPER, _resource_usage
    from dgps.runtime.warmup import _compile_for

    compiled = _compile_for(fn, bound, HOPPER)
    regs, spill, _ = _resource_usage(compiled.asm["cubin"])
    return (f"sm_90 (triton.compile without a GPU): {regs} registers, {spill} B spill, "
            f"{compiled.metadata.shared} B ({compiled.metadata.shared:#x}) of shared memory per program")


def reproducer(spec: str, kernel: str, launch: str, shape: list[int], occurrence: int) -> str:
    import triton

    import dgps
    from dgps.codegen.launch import parse_launch_overrides
    from dgps.runtime.compile import load_chunk

    path = Path(spec)
    rec = dgps.load(path if path.exists() else ROOT / "specs" / f"{spec}.dgps")
    mod = load_chunk(rec.ir)
    mod.LAUNCH_OVERRIDES.update(parse_launch_overrides(launch))
    B, T, H, D = shape
    x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0)
    calls: list = []
    with recording(calls):
        _, kept = mod.chunk_forward_train(x)
        mod.chunk_backward(x, do=torch.zeros_like(x["v"]), kept=kept)
    mine = [c for c in calls if c[0].__name__ == kernel]
    if len(mine) <= occurrence:
        names = sorted({c[0].__name__ for c in calls})
        raise SystemExit(f"triton_repro: {spec} launches {kernel} {len(mine)} time(s); its kernels: {', '.join(names)}")
    fn, bound, grid = mine[occurrence]
    summary = sm90_summary(fn, bound)
    build, items = argument_lines(bound)
    src = jit_sources(sys.modules[fn.fn.__module__].__file__, kernel)
    cmd = f"python benchmarks/triton_repro.py {spec} {kernel} --launch \"{launch}\" --shape {' '.join(map(str, shape))}"
    body = "\n    ".join(build)
    args = ",\n        ".join(items)
    return f'''"""Standalone launch of dgps's generated `{kernel}` (spec {rec.name}, shape B T H D = {B} {T} {H} {D}, launch
setting "{launch}"), written by `{cmd}`
with triton {triton.__version__}. Float buffers hold random values; index tensors hold the host's.
{summary}.

    compute-sanitizer --tool memcheck python3 {{this file}}        # sm_90
    TRITON_INTERPRET=1 python3 {{this file}} --device cpu          # the Triton interpreter
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice  # noqa: F401 - read by some kernels' maps


{src}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    dev = p.parse_args().device
    torch.manual_seed(0)
    {body}
    {kernel}[{grid!r}](
        {args},
    )
    if dev == "cuda":
        torch.cuda.synchronize()
    print("{kernel}: launch completed")


if __name__ == "__main__":
    main()
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("kernel", help="the generated kernel's name, e.g. chunk_bwd_grad_kernel")
    p.add_argument("--launch", default="", help='DGPS_LAUNCH form: "stage=BK,BV,warps,stages;..."')
    p.add_argument("--shape", type=int, nargs=4, default=[1, 256, 2, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--occurrence", type=int, default=0, help="which of the kernel's launches (0: the first)")
    p.add_argument("-o", "--out", required=True, help="the reproducer's path")
    a = p.parse_args()
    Path(a.out).write_text(reproducer(a.spec, a.kernel, a.launch, a.shape, a.occurrence))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
