"""Ahead-of-time compilation of every generated kernel for Hopper, without a GPU.

The package's own host code is run on small CPU tensors with Triton's launcher replaced by a
recorder: each launch's bound arguments give the exact signature and constexprs the kernel would be
specialised on (autotuned kernels: every config). Each is then compiled with
`triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`, and cuobjdump (shipped with triton)
reports registers and local memory (spills) of the cubin and its SASS, the compile metadata its shared memory.
The SASS counts are static (each instruction once, loops not unrolled by the compiler counted once): a proxy for
where a kernel's work goes — tensor-core products (HMMA / HGMMA), fp32 FMAs (an IEEE fp32 dot runs as FMA loops
through shared memory), shared-memory traffic and barriers — read before spending device time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .api import Recurrence

HOPPER = ("cuda", 90, 32)


@dataclass(frozen=True)
class KernelReport:
    module: str
    kernel: str
    dk: int
    dv: int
    config: str
    registers: int
    spill_bytes: int
    shared_bytes: int
    ok: bool
    error: str = ""
    # instructions, mma, ffma, shared, barriers (not hashed: a frozen report stays hashable)
    sass: dict[str, int] = dataclasses.field(default_factory=dict, hash=False, compare=False)


@contextlib.contextmanager
def _no_interpreter() -> Iterator[None]:
    old = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if old is not None:
            os.environ["TRITON_INTERPRET"] = old


@contextlib.contextmanager
def _recording(calls: list) -> Iterator[None]:
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    def record(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202 - Triton's signature
        if not warmup:  # a parallel compile ahead of the launches compiles what they launch (runtime/warmup.py)
            calls.append((self, args, dict(kwargs)))
        return None

    def every_config(self, *args, **kwargs):  # noqa: ANN001, ANN202
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    old_run, old_tune = JITFunction.run, Autotuner.run
    JITFunction.run, Autotuner.run = record, every_config  # type: ignore[method-assign]
    try:
        yield
    finally:
        JITFunction.run, Autotuner.run = old_run, old_tune  # type: ignore[method-assign]


# SASS opcode classes the report counts (sm_90): tensor-core products, fp32 FMAs, shared-memory loads / stores
# (LDSM included), barriers
SASS_CLASSES = {"mma": ("HMMA", "HGMMA", "IMMA"), "ffma": ("FFMA",), "shared": ("LDS", "LDSM", "STS"),
                "barriers": ("BAR",)}
_SASS_OP = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def sass_counts(sass: str) -> dict[str, int]:
    """Static counts of a kernel's SASS (cuobjdump -sass): every instruction, and those of SASS_CLASSES."""
    ops = [m.group(1) for m in _SASS_OP.finditer(sass)]
    out = {"instructions": len(ops)}
    for name, prefixes in SASS_CLASSES.items():
        out[name] = sum(op in prefixes for op in ops)
    return out


def _resource_usage(cubin: bytes, sass_path: Path | None = None) -> tuple[int, int, dict[str, int]]:
    """(registers, spill bytes per thread, SASS counts) of a cubin, read by the cuobjdump shipped with triton.

    A Triton kernel has no stack arrays or recursion, so its stack frame (and any local memory) is
    register spill: it matches ptxas's "bytes spill stores". Reading the cubin avoids a second ptxas run.
    """
    import triton

    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([str(exe), "--dump-resource-usage", "--dump-sass", str(path)], capture_output=True,
                             text=True, check=True).stdout
    if sass_path is not None:
        sass_path.write_text(out)
    regs = max((int(x) for x in re.findall(r"REG:(\d+)", out)), default=0)
    stack = max((int(x) for x in re.findall(r"STACK:(\d+)", out)), default=0)
    local = max((int(x) for x in re.findall(r"LOCAL:(\d+)", out)), default=0)
    return regs, max(stack, local), sass_counts(out)


def _compile(fn, args: tuple, kwargs: dict, sass_path: Path | None = None  # noqa: ANN001
             ) -> tuple[int, int, int, str, dict[str, int]]:
    from .warmup import _compile_for

    compiled = _compile_for(fn, kwargs, HOPPER, args)  # as the package's own launch would specialise it
    regs, spills, sass = _resource_usage(compiled.asm["cubin"], sass_path)
    config = f"warps={compiled.metadata.num_warps} stages={compiled.metadata.num_stages}"
    return regs, spills, int(compiled.metadata.shared), config, sass


def aot_report(rec: Recurrence, dims: tuple[int, ...] = (64, 128), T: int = 256) -> list[KernelReport]:
    """Compile every kernel the package launches (forward, decode, backward) at dk = dv = each of `dims`.

    Runs in a fresh interpreter process: a process that already imported triton under TRITON_INTERPRET=1
    holds interpreter objects that cannot be compiled for a GPU.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["DGPS_NO_AUTO_INTERPRET"] = "1"  # real JIT functions, compiled for sm_90 without a GPU
    cmd = [sys.executable, "-m", "dgps.runtime.report", "--T", str(T), "--dims", *map(str, dims)]
    proc = subprocess.run(cmd, input=rec.source, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"AOT compile report failed for {rec.name}:\n{proc.stderr[-4000:]}")
    return [KernelReport(**row) for row in json.loads(proc.stdout.strip().splitlines()[-1])]


def _aot_report_here(rec: Recurrence, dims: tuple[int, ...], T: int, sass_dir: Path | None = None
                     ) -> list[KernelReport]:
    from ..codegen.package import cache_key
    from .compile import import_package, write_package
    from .reference import initial_states
    from .tensors import check_inputs

    ir = rec.ir
    reports: list[KernelReport] = []
    with tempfile.TemporaryDirectory() as tmp, _no_interpreter():
        write_package(rec, tmp)
        name = f"dgps_aot.{ir.name}_{cache_key(rec.source)}"
        pkg = import_package(tmp, name)
        try:
            for d in dims:
                calls: list = []
                # B = 4 sequences of 16 heads, the benchmarks' batch: the launch table picks some settings by the
                # call's sequences × heads (the state pass's BV 64 needs enough programs), and the report should
                # compile what a call at that shape runs. Nothing is launched, so T stays short.
                x = rec.random_inputs(4, T, 16, d, d, dtype=torch.bfloat16)
                with _recording(calls):
                    pkg.forward(**x, output_final_state=True)
                    chunk = getattr(pkg, "chunk", None)
                    if hasattr(chunk, "FUSE_OUTPUT"):
                        # the per-call unfused output (few sequences × heads on a GPU: the state pass at its small-
                        # batch setting, then the output kernel), forced: the report has no GPU to decide it
                        saved, chunk.FUSE_OUTPUT = chunk.FUSE_OUTPUT, False
                        try:
                            pkg.forward(**rec.random_inputs(1, T, 16, d, d, dtype=torch.bfloat16), output_final_state=True)
                        finally:
                            chunk.FUSE_OUTPUT = saved
                    _, dm = check_inputs(ir, x)
                    state = {k: v.float() for k, v in initial_states(ir, dm, dm.B, None, torch.float32,
                                                                       torch.device("cpu")).items()}
                    pkg.decode(**{k: (v[:, :1] if not ir.input(k).is_param else v) for k, v in x.items()}, state=state)
                    # The backward kernels: autograd through the package's custom op (values are garbage:
                    # nothing is launched, only recorded).
                    xg = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
                    out = pkg.forward(**xg, output_final_state=True)
                    out.o.float().sum().backward()
                seen = set()
                for fn, args, kwargs in calls:
                    key = (fn.__name__, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    module = fn.fn.__module__.rsplit(".", 1)[-1]
                    sass_path = None
                    if sass_dir is not None:
                        sass_path = sass_dir / f"{fn.__name__}_d{d}_{len(seen)}.sass"
                    try:
                        regs, spills, shared, config, sass = _compile(fn, args, kwargs, sass_path)
                        reports.append(KernelReport(module, fn.__name__, d, d, config, regs, spills, shared, True,
                                                    sass=sass))
                    except Exception as e:  # noqa: BLE001 - a compile failure is the report's finding
                        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                        reports.append(KernelReport(module, fn.__name__, d, d, str(kwargs.get("num_warps", "")),
                                                    0, 0, 0, False, msg[:200]))
        finally:
            for mod in [m for m in sys.modules if m.startswith(name)]:
                del sys.modules[mod]
    return reports


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .api import load

    parser = argparse.ArgumentParser(description="AOT-compile a spec's kernels for sm_90; spec text on stdin")
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--sass", type=Path, default=None, metavar="DIR",
                        help="also write each kernel's SASS (cuobjdump) to DIR/<kernel>_d<dim>_<n>.sass")
    args = parser.parse_args(argv)
    rec = load(sys.stdin.read(), filename="<stdin>")
    if args.sass is not None:
        args.sass.mkdir(parents=True, exist_ok=True)
    rows = _aot_report_here(rec, tuple(args.dims), args.T, args.sass)
    print(json.dumps([dataclasses.asdict(r) for r in rows]))
    return 0


def format_report(reports: list[KernelReport]) -> str:
    lines = [f"{'module':<10} {'kernel':<34} {'dk=dv':>5} {'config':<18} {'regs':>5} {'spill B':>8} "
             f"{'shared B':>9} {'sass':>6} {'mma':>5} {'ffma':>5} {'lds/sts':>7} {'bar':>4}  result"]
    for r in reports:
        c = r.sass
        lines.append(f"{r.module:<10} {r.kernel:<34} {r.dk:>5} {r.config:<18} {r.registers:>5} {r.spill_bytes:>8} "
                     f"{r.shared_bytes:>9} {c.get('instructions', 0):>6} {c.get('mma', 0):>5} {c.get('ffma', 0):>5} "
                     f"{c.get('shared', 0):>7} {c.get('barriers', 0):>4}  {'ok' if r.ok else 'FAILED: ' + r.error}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
