"""Peak memory of one training step (forward + backward) of dgps, on the CPU: what the peak is made of.

    python benchmarks/memory_trace.py [--systems gdn precond_gdn ...] [--spec specs/pgdn.dgps ...]
                                      [--shape B T H D] [--execute] [--timeline] [--json out.json]

`--systems` calls dgps through FLA's signatures (`dgps.fla_compat`, the inputs of bench_fla.py), as bench_fla.py
measures `torch.cuda.max_memory_allocated` on the H200; `--spec` calls a spec file's package (`dgps.compile(spec)
.forward(...)`, inputs from `dgps.runtime.api.random_inputs` in bf16). One step, after a warm-up step (the bench
measures after its timing loops: the caches of chunk layouts and launch lists are full), with the inputs and dO
allocated before the measurement (as the bench's base).

How: a TorchDispatchMode sees every aten op's outputs; each storage not seen before is an allocation (its size
rounded up to the CUDA caching allocator's 512-byte blocks), and `weakref.finalize` on the storage (torch keeps one
Python object per live storage) records its free. The peak is the largest sum of live bytes at any allocation.
Each allocation is named by the line of dgps code that made it (the buffer name where the line says
`bufs["..."] =`, or the loop's `n`), else by the aten op (autograd's own: gradient accumulation, zeros).

By default the Triton kernels are not run (GridExecutor is replaced by a stub that records the launch and the live
bytes at that moment): what the host allocates does not depend on what the kernels compute, so the step runs at
the reference shape itself (B=4 T=4096 H=16 D=128) in seconds, with no scaling. `--execute` runs the kernels under
the interpreter (small shapes only), to check that the stub changes no allocation (the tool prints a digest of
the allocation sequence: equal digests, equal traces; the interpreter's own copies while a kernel runs are not
counted). Only the eager path: inside a custom op (the torch.compile path) the mode sees the op's outputs, not
the allocations of its body.

Validated against the H200 (run 34, dgps at 50b81e9 / a996e4a): gdn 689, precond_gdn 1589, kda 1297, precond_kda 2325
MiB measured; the tool gives the same four numbers to the MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import linecache
import os
import re
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 2 ** 20
BLOCK = 512  # the CUDA caching allocator rounds every block up to 512 bytes
_OWN = re.compile(r"(dgps|dgps_cache|generated)")  # frames of dgps code (the package, its runtime, the cache)
_BUF_NAME = re.compile(r"""(?:bufs|b)\[\s*["'](\w+)["']\s*(\+\s*n\s*)?\]\s*=""")


@dataclass
class Alloc:
    nbytes: int
    site: str  # the dgps line (file:line) that allocated it, or the aten op
    name: str  # buffer name where the line names one
    shape: tuple[int, ...]
    dtype: str
    phase: str  # the last kernel launched before it ("start" before any)


@dataclass
class Tracker(TorchDispatchMode):
    live: dict[int, Alloc] = field(default_factory=dict)
    now: int = 0
    base: int = 0  # live bytes when the measurement starts (bench_fla.py subtracts memory_allocated() at that point)
    peak: int = 0
    peak_live: list[Alloc] = field(default_factory=list)
    peak_phase: str = "start"
    phase: str = "start"
    launches: list[tuple[str, int]] = field(default_factory=list)  # (kernel, live bytes at its launch)
    sequence: list[tuple[int, str]] = field(default_factory=list)  # (bytes, site) of every allocation, in order
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)  # label -> (live bytes, peak so far)
    in_kernel: bool = False

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if self.in_kernel:  # the interpreter's own copies while a kernel runs (--execute): no device memory
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._see(t, func)
        return out

    def _see(self, t: torch.Tensor, func) -> None:  # noqa: ANN001
        st = t.untyped_storage()
        n = st.nbytes()
        key = id(st)
        if n == 0 or key in self.live:
            return
        site, name = _site(str(func))
        a = Alloc(-(-n // BLOCK) * BLOCK, site, name, tuple(t.shape), str(t.dtype).removeprefix("torch."), self.phase)
        self.live[key] = a
        self.sequence.append((a.nbytes, a.name))
        weakref.finalize(st, self._free, key)
        self.now += a.nbytes
        if self.now > self.peak:
            self.peak, self.peak_live, self.peak_phase = self.now, list(self.live.values()), self.phase

    def adopt(self, t: torch.Tensor) -> None:
        """Count a tensor allocated before the measurement (part of the base) until it is freed."""
        st = t.untyped_storage()
        a = Alloc(-(-st.nbytes() // BLOCK) * BLOCK, "base", "(base: previous step's gradient)", tuple(t.shape),
                  str(t.dtype).removeprefix("torch."), "base")
        self.live[id(st)] = a
        weakref.finalize(st, self._free, id(st))
        self.now += a.nbytes
        self.peak = self.now

    def _free(self, key: int) -> None:
        a = self.live.pop(key, None)
        if a is not None:
            self.now -= a.nbytes

    def launch(self, name: str) -> None:
        self.phase = name
        self.launches.append((name, self.now))

    def mark(self, label: str) -> None:
        self.marks[label] = (self.now, self.peak)


def _site(op: str) -> tuple[str, str]:
    """(file:line, name) of the innermost dgps frame on the stack; the name is the buffer a dgps line a few frames
    out assigns (`bufs["dh_buf"] = buf(...)` around a helper's `torch.empty`), else that innermost line; the aten op
    where no dgps frame is on the stack (autograd's own allocations)."""
    f = sys._getframe(3)
    first = None
    depth = 0
    while f is not None and depth < 4:
        fn = f.f_code.co_filename
        if _OWN.search(fn) and "memory_trace" not in fn and "_python_dispatch" not in fn:
            line = linecache.getline(fn, f.f_lineno).strip()
            here = (f"{Path(fn).parent.name}/{Path(fn).name}:{f.f_lineno}", f"{Path(fn).name}:{f.f_lineno} {line[:70]}")
            first = first or here
            depth += 1
            m = _BUF_NAME.search(line)
            if m:
                return first[0], m.group(1) + (f.f_locals.get("n", "?") if m.group(2) else "")
            if isinstance(f.f_locals.get("n"), str) and re.search(r"\[n\]\s*=", line):
                return first[0], f.f_locals["n"]
        f = f.f_back
    return first if first is not None else (op, f"(torch: {op})")


_ACTIVE: list[Tracker] = []


def stub_kernels(execute: bool) -> None:
    """Record every interpreted launch with the tracker; without `execute`, skip the kernel's body."""
    import triton.runtime.interpreter as ti

    orig = ti.GridExecutor.__call__

    def call(self, *args, **kwargs):  # noqa: ANN001, ANN202
        tr = _ACTIVE[-1] if _ACTIVE else None
        if tr is not None:
            tr.launch(self.fn.__name__)
        if not execute:
            return None
        if tr is not None:
            tr.in_kernel = True
        try:
            return orig(self, *args, **kwargs)
        finally:
            if tr is not None:
                tr.in_kernel = False

    ti.GridExecutor.__call__ = call


def system_step(system: str, B: int, T: int, H: int, D: int):  # noqa: ANN201
    """(step, leaves, do) of one FLA-signature training step through dgps.fla_compat."""
    from bench_fla import calls, make_inputs

    import dgps.fla_compat as compat

    x = make_inputs(system, B, T, H, D, device="cpu")
    fn = calls(compat)[system]
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16)
    return (lambda: fn(leaves)), leaves, do


def spec_step(path: str, B: int, T: int, H: int, D: int):  # noqa: ANN201
    import dgps
    from dgps.runtime.api import random_inputs

    pkg = dgps.compile(Path(path).read_text())
    x = random_inputs(pkg.IR, B, T, H, D, D, dtype=torch.bfloat16)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    do = torch.randn(B, T, H, D, dtype=torch.bfloat16)
    return (lambda: pkg.forward(**leaves).o), leaves, do


def trace(make, B: int, T: int, H: int, D: int) -> Tracker:  # noqa: ANN001
    """One measured training step, as bench_fla.py's peak_mib measures it: after a warm-up step whose gradients are
    still held when the base is taken (the step drops them first), so the peak counts the live bytes above that
    base -- the previous step's gradients are freed inside the step, and the new ones take their place."""
    run, leaves, do = make

    def step(tr: Tracker) -> None:
        for t in leaves.values():
            t.grad = None
        o = run()
        tr.mark("after forward")
        o.backward(do)
        del o
        tr.mark("after backward")

    step(Tracker())  # warm-up (the caches of layouts and launch lists fill)
    tr = Tracker()
    for t in leaves.values():  # the base holds the warm-up's gradients; freeing them lowers the live bytes
        if t.grad is not None:
            tr.adopt(t.grad)
    tr.base = tr.now
    _ACTIVE.append(tr)
    try:
        with tr:
            step(tr)
    finally:
        _ACTIVE.pop()
    return tr


def report(label: str, tr: Tracker, B: int, T: int, H: int, timeline: bool) -> dict:
    """Print and return the peak above the base, what is live at it (by buffer), and the phases."""
    tokens = B * T * H
    groups: dict[str, list[Alloc]] = {}
    for a in tr.peak_live:
        groups.setdefault(a.name, []).append(a)
    rows = sorted(groups.items(), key=lambda kv: -sum(a.nbytes for a in kv[1]))
    digest = hashlib.sha1(json.dumps(tr.sequence).encode()).hexdigest()[:12]
    peak, fwd_live, fwd_peak = (tr.peak - tr.base, tr.marks["after forward"][0] - tr.base,
                                tr.marks["after forward"][1] - tr.base)
    print(f"\n== {label}: peak {peak / MIB:.0f} MiB above the base (at an allocation after {tr.peak_phase}); forward "
          f"peak {fwd_peak / MIB:.0f} MiB, {fwd_live / MIB:.0f} MiB live after it; {len(tr.sequence)} allocations, "
          f"trace digest {digest}")
    print(f"   {'MiB':>8} {'B/tok-head':>10}  {'dtype':<9} {'shape':<28} buffer (allocated after)")
    out_rows = []
    for name, allocs in rows:
        nb = sum(a.nbytes for a in allocs)
        a = allocs[0]
        shape = "x".join(map(str, a.shape)) + (f" ({len(allocs)}x)" if len(allocs) > 1 else "")
        if nb >= 2 ** 16:
            print(f"   {nb / MIB:8.1f} {nb / tokens:10.1f}  {a.dtype:<9} {shape:<28} {name} ({a.phase})")
        out_rows.append({"buffer": name, "mib": round(nb / MIB, 2), "bytes_per_token_head": round(nb / tokens, 1),
                         "dtype": a.dtype, "shape": list(a.shape), "count": len(allocs), "after": a.phase})
    if timeline:
        print("   live MiB above the base at each launch:")
        for name, now in tr.launches:
            print(f"     {(now - tr.base) / MIB:8.0f}  {name}")
    return {"peak_mib": round(peak / MIB, 1), "peak_after": tr.peak_phase, "digest": digest,
            "forward_peak_mib": round(fwd_peak / MIB, 1), "live_after_forward_mib": round(fwd_live / MIB, 1),
            "at_peak": out_rows, "launches": [(n, round((b - tr.base) / MIB, 1)) for n, b in tr.launches],
            "allocations": tr.sequence}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--systems", nargs="*", default=[], help="FLA signatures through dgps.fla_compat (bench_fla.py)")
    ap.add_argument("--spec", nargs="*", default=[], help="spec files, through their package's forward")
    ap.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    ap.add_argument("--execute", action="store_true", help="run the kernels under the interpreter (small shapes)")
    ap.add_argument("--timeline", action="store_true", help="print the live bytes at every launch")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    stub_kernels(args.execute)
    B, T, H, D = args.shape
    results = {}
    for s in args.systems:
        results[s] = report(s, trace(system_step(s, B, T, H, D), B, T, H, D), B, T, H, args.timeline)
    for p in args.spec:
        results[p] = report(p, trace(spec_step(p, B, T, H, D), B, T, H, D), B, T, H, args.timeline)
    if args.json:
        Path(args.json).write_text(json.dumps({"shape": args.shape, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
