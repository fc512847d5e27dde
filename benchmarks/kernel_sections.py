"""Where a generated kernel spends its time: the kernel timed whole and with one marked section cut out at a time.

    python benchmarks/kernel_sections.py --system kda --kernel chunk_interaction_kernel \
        [--cut "-- levels s" "-- level 32" "-- triangular_solve"] [--set BK=32 BK=64] [--B 4 --T 4096 --H 16 --D 128]

The package's forward (and backward) runs once with Triton's launcher wrapped, recording the kernel's bound
arguments and grid. Each variant is the generated module's source with the block under one marker comment
deleted (up to the next marker at the same indentation, a dedent, or the next kernel), compiled from a copy on
disk and launched on the recorded arguments; `--set` relaunches the original with a constexpr changed; `--patch
MODULE.NAME=VALUE` renders the module again with a codegen or plan constant changed (its own launch recorded the same
way), e.g. `--patch dgps.compiler.plan.VECTOR_DIAG_FORM=bounded`. The cut
variants compute wrong values: only their times mean anything, as upper bounds of what each section costs
(a cut can also free registers). `--sub FILE`: a JSON object, variant name -> {"sub": [[old, new], ...], "set":
{NAME: VALUE}}, the kernel's source with each `old` replaced by `new` (every occurrence inside the kernel), launched on
the recorded arguments with the constexprs of "set"; `--set` takes NAME=VALUE[,NAME=VALUE...] per variant, where
`grid0=N` sets the grid's first dimension (BV's value blocks, say). Medians of `triton.testing.do_bench`, interleaved
over `--rounds`.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def cut_source(src: str, kernel: str, marker: str) -> str:
    """`src` with the block under the comment line containing `marker` in `kernel`'s body removed."""
    lines = src.splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith(f"def {kernel}("))
    at = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith("#") and marker in lines[i])
    indent = len(lines[at]) - len(lines[at].lstrip())
    end = at + 1
    while end < len(lines):
        s = lines[end]
        body = s.lstrip()
        ind = len(s) - len(body)
        if body and (ind < indent or (ind == indent and body.startswith("# --")) or s.startswith("@triton.jit")):
            break
        end += 1
    keep = lines[:at] + [" " * indent + "pass  # cut: " + marker] + lines[end:]
    return "\n".join(keep) + "\n"


def substituted(src: str, kernel: str, subs: list[list[str]]) -> str:
    """`src` with each [old, new] of `subs` replaced inside `kernel` (its def up to the next kernel's decorator)."""
    start = src.index(f"def {kernel}(")
    end = src.find("@triton.jit", start)
    end = len(src) if end < 0 else end
    body = src[start:end]
    for old, new in subs:
        if old not in body:
            raise SystemExit(f"--sub: not in {kernel}: {old!r}")
        body = body.replace(old, new)
    return src[:start] + body + src[end:]


def load_module(path: Path, name: str):  # noqa: ANN201
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    import triton
    from triton.runtime.jit import JITFunction

    import dgps
    from dgps.runtime.compile import load_chunk

    p = argparse.ArgumentParser()
    p.add_argument("--system", default="kda")
    p.add_argument("--kernel", default="chunk_interaction_kernel")
    p.add_argument("--cut", nargs="*", default=[])
    p.add_argument("--set", nargs="*", default=[],
                   help="NAME=VALUE[,NAME=VALUE] constexpr overrides (grid0=N: the grid's first dimension), one variant each")
    p.add_argument("--sub", help="JSON file: variant -> {'sub': [[old, new], ...], 'set': {NAME: VALUE}}")
    p.add_argument("--patch", nargs="*", default=[], help="MODULE.NAME=VALUE: the module rendered with it, one variant each")
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    rec = dgps.load(str(ROOT / "specs" / f"{a.system}.dgps"))
    x = {k: v.to(torch.bfloat16).cuda() for k, v in rec.random_inputs(a.B, a.T, a.H, a.D, a.D, seed=0).items()}
    orig_run = JITFunction.run

    def recorded(mod) -> tuple:  # noqa: ANN001
        """(args, grid, kwargs) of the kernel's first launch by `mod`'s training forward (and backward)."""
        calls: list = []

        def record(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202
            if self.__name__ == a.kernel and not calls:
                calls.append((args, grid, dict(kwargs)))
            return orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)

        JITFunction.run = record  # type: ignore[method-assign]
        try:
            fwd, kept = mod.chunk_forward_train(x)
            if not calls:
                mod.chunk_backward(x, do=torch.randn_like(fwd.o), kept=kept)
        finally:
            JITFunction.run = orig_run  # type: ignore[method-assign]
        torch.cuda.synchronize()
        if not calls:
            p.error(f"{a.system} launched no {a.kernel}")
        return calls[0]

    mod = load_chunk(rec.ir)
    base_args, base_grid, base_kwargs = recorded(mod)
    src = Path(mod.__file__).read_text()
    variants: dict[str, object] = {"whole": getattr(mod, a.kernel)}
    tmp = Path(tempfile.mkdtemp())
    for i, marker in enumerate(a.cut):
        path = tmp / f"cut{i}.py"
        path.write_text(cut_source(src, a.kernel, marker))
        variants[f"cut {marker!r}"] = getattr(load_module(path, f"dgps_cut{i}"), a.kernel)
    overrides = {f"set {s}": dict(kv.split("=", 1) for kv in s.split(",")) for s in a.set}
    if a.sub:
        import json

        for i, (name, v) in enumerate(json.loads(Path(a.sub).read_text()).items()):
            path = tmp / f"sub{i}.py"
            path.write_text(substituted(src, a.kernel, v["sub"]))
            variants[f"sub {name}"] = getattr(load_module(path, f"dgps_sub{i}"), a.kernel)
            if v.get("set"):
                overrides[f"sub {name}"] = {k: str(x) for k, x in v["set"].items()}
    own: dict[str, tuple] = {}  # variant -> its own recorded launch
    for spec in a.patch:
        target, value = spec.split("=", 1)
        modname, attr = target.rsplit(".", 1)
        owner = importlib.import_module(modname)
        old = getattr(owner, attr)
        if isinstance(old, bool):  # (bool("False") is True)
            if value not in ("True", "False"):
                raise SystemExit(f"--patch {spec}: {attr} is a bool: True or False")
            new: object = value == "True"
        else:
            new = type(old)(value) if not isinstance(old, str) else value
        setattr(owner, attr, new)
        try:
            pmod = load_chunk(rec.ir)
            own[f"patch {spec}"] = recorded(pmod)
            variants[f"patch {spec}"] = getattr(pmod, a.kernel)
        finally:
            setattr(owner, attr, old)

    def launcher(name: str):  # noqa: ANN202
        fn = variants.get(name, variants["whole"])
        args, grid, kwargs = own.get(name, (base_args, base_grid, base_kwargs))
        kw = dict(kwargs)
        for k, v in overrides.get(name, {}).items():
            if k == "grid0":
                grid = (int(v), *tuple(grid)[1:])
            else:
                kw[k] = bool(int(v)) if isinstance(kw.get(k), bool) else int(v)
        return lambda: fn[grid](*args, **kw)

    names = list(dict.fromkeys(list(variants) + list(overrides)))
    runs = {n: launcher(n) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # compile and warm each once
        runs[n]()
    torch.cuda.synchronize()
    for _ in range(a.rounds):
        for n in names:
            times[n].append(triton.testing.do_bench(runs[n], warmup=10, rep=40))
    base = statistics.median(times["whole"])
    print(f"{a.system} {a.kernel} B={a.B} T={a.T} H={a.H} D={a.D} grid={base_grid}")
    for n in names:
        t = statistics.median(times[n])
        kern = getattr(variants.get(n, variants["whole"]), "device_caches", None)
        regs = ""
        try:  # the compiled kernel's registers and spills (the function's last compile: shared by --set variants)
            for cache in (kern or {}).values():
                for ck in cache[0].values():
                    regs = f"  registers {ck.n_regs}, spills {ck.n_spills}"
        except (AttributeError, TypeError, IndexError):
            regs = ""
        print(f"  {n:40s} {t:.4f} ms  ({t - base:+.4f}){regs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
