"""Launch settings tuned on this machine's GPU: `dgps tune`, and the opt-in DGPS_AUTOTUNE=1.

The shipped launch table (codegen/launch.py) was swept on an H200 at dk = dv = 128; on another GPU, head size or
shape class a stage may run faster at other settings. `tune` sweeps each stage a package launches over the stage's
candidates (codegen/launch.py: tuning_candidates), one stage at a time with the others at the table's settings:

  * every stage's sweep runs in child processes: a candidate that faults (Triton 3.6 builds some settings that fault
    on sm_90, and a fault leaves the CUDA context unusable) ends its child, and a new child goes on with the rest;
  * every candidate's output and gradients are compared with the table setting's on the same inputs before it is
    timed (Triton 3.6 has also built settings that ran and gave a wrong gradient: benchmarks/NOTES.md); one that
    differs by more than the dtype's tolerance is refused, not timed;
  * a stage's time is the profiler's CUDA time of its kernel over one training step (median of three).

The fastest setting per stage is written to DGPS_CACHE_DIR/tuned/<gpu>/<spec>-<digest>.json, keyed by the chunk
module's own text (a regenerated module with other kernels starts untuned) and by the shape class (dk, dv, and
whether the call has few sequences × value heads: codegen/launch.py, few_state_programs). Generated chunk modules read
that file in `launch_config`, after DGPS_LAUNCH and before the table; DGPS_TUNED=0 ignores it. With DGPS_AUTOTUNE=1 a
package's first call of an untuned shape class on a GPU runs `tune` at the call's shape first (minutes: every
candidate compiles), then uses the result.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ..codegen.launch import few_state_programs, tuning_candidates

Config = tuple[int, int, int, int]
# the largest relative difference (norm of the difference over the norm of the table setting's result) a candidate's
# output or gradient may show against the table setting's: summation order moves 16-bit results by an ulp here and
# there (~1e-3 of the norm), a wrongly built kernel by far more
TOLERANCE = {"bfloat16": 2e-2, "float16": 2e-2, "float32": 1e-4}


class TuneError(Exception):
    """A tuning request that cannot run: one line, naming what is wrong."""


@cache  # launch_config's look-ups ask for it on every call
def device_label(device: Any) -> str:
    """A file-name-safe name of the device a call runs on: the GPU's name, or `cpu` (the Triton interpreter)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    name = torch.cuda.get_device_name(device)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@cache
def module_digest(module_file: str) -> str:
    """The first 16 hex digits of the sha256 of a chunk module's text: tuned settings belong to these kernels."""
    return hashlib.sha256(Path(module_file).read_bytes()).hexdigest()[:16]


def tuned_path(module_file: str, spec_name: str, label: str) -> Path:
    from .compile import cache_root

    return cache_root() / "tuned" / label / f"{spec_name}-{module_digest(module_file)}.json"


def shape_class(DK: int, DV: int, n_state: int | None) -> str:
    return f"dk{DK}-dv{DV}-{'few' if few_state_programs(n_state, DV) else 'many'}"


_TABLES: dict[Path, dict] = {}
_LOOKUPS: dict[tuple, Config | None] = {}
_CLASSES: dict[tuple, bool] = {}
_GENERATION = [0]  # tunes recorded in this process: what the generated hosts derive from launch settings keys on it


def forget() -> None:
    """Drop what this process has read of tuned files (after DGPS_CACHE_DIR changes): the next lookups read again,
    and the generated hosts form their call geometries again."""
    _TABLES.clear()
    _LOOKUPS.clear()
    _CLASSES.clear()
    _GENERATION[0] += 1


def tuning_generation() -> int:
    """How many tunes this process has recorded: a generated host keeps what it derives from the launch settings
    (its call geometries) per generation, so that a tune here is seen by the next call."""
    return _GENERATION[0]


def _read(path: Path) -> dict:
    """The tuned file's contents, read once per process (a `tune` in this process replaces them): launch_config
    runs on every call, and a file-system look-up there would be host time on each. A file another process writes
    meanwhile is read by the next process."""
    if path not in _TABLES:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        _TABLES[path] = data if isinstance(data, dict) else {}
    return _TABLES[path]


def tuned_launch(module_file: str, spec_name: str, stage: str, DK: int, DV: int, n_state: int | None,
                 device: Any) -> Config | None:
    """The tuned (BK, BV, num_warps, num_stages) of `stage` for this module, device and shape class, if one is
    recorded (and DGPS_TUNED is not 0)."""
    if device is None or os.environ.get("DGPS_TUNED", "") == "0":
        return None
    key = (module_file, stage, DK, DV, n_state, device)
    if key not in _LOOKUPS:  # launch_config runs on every call: one dict look-up there after the first (~80 µs)
        entry = _class_entry(module_file, spec_name, DK, DV, n_state, device)
        cfg = (entry or {}).get(stage, {}).get("config")
        _LOOKUPS[key] = tuple(cfg) if cfg else None
    return _LOOKUPS[key]


def _class_entry(module_file: str, spec_name: str, DK: int, DV: int, n_state: int | None, device: Any) -> dict | None:
    return _read(tuned_path(module_file, spec_name, device_label(device))).get(shape_class(DK, DV, n_state))


def is_tuned(module_file: str, spec_name: str, DK: int, DV: int, n_state: int | None, device: Any) -> bool:
    key = (module_file, DK, DV, n_state, device)
    if not _CLASSES.get(key):  # looked up again until found (a tune in this process records it)
        _CLASSES[key] = _class_entry(module_file, spec_name, DK, DV, n_state, device) is not None
    return _CLASSES[key]


def _record(path: Path, cls: str, results: dict[str, dict], meta: dict) -> None:
    """Merge one shape class's results into the tuned file, atomically (write a temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _TABLES.pop(path, None)  # the file as it is now: another process may have tuned another class meanwhile
    data = dict(_read(path))
    data[cls] = {**results, "_meta": meta}
    fd, tmp = tempfile.mkstemp(prefix=".tuned_", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    _TABLES[path] = data
    _LOOKUPS.clear()
    _CLASSES.clear()
    _GENERATION[0] += 1


# ---- the child: one stage's candidates, each checked and timed ---------------------------------------------------------

def _relative_difference(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def stage_kernels(mod: Any, n_state: int, DV: int, device: Any) -> dict[str, str]:
    """stage -> kernel name, for the stages a chunk module launches in one training step of a call with `n_state`
    sequences × value heads: the forward (with the output fused into the state pass or not: the host's _per_call),
    the backward's rerun of the state pass, the backward; in launch order."""
    fwd = mod._per_call(mod._kernels(), n_state, DV, device) if hasattr(mod, "_per_call") else mod._kernels()
    return {name: k.__name__ for name, k, _ in fwd + mod._rerun_kernels(True) + mod._bwd_kernels()}


def inference_stage_kernels(mod: Any, n_state: int, DV: int, device: Any) -> dict[str, str]:
    """stage -> kernel name, for the stages an inference call (no gradient) launches and a training step does not:
    the fused state pass + output with the wy stage formed inside it (the host's _inference_kernels), where the plan
    forms it and the call keeps it fused."""
    if not hasattr(mod, "_inference_kernels"):
        return {}
    fwd = mod._per_call(mod._inference_kernels(), n_state, DV, device)
    training = stage_kernels(mod, n_state, DV, device)
    return {name: k.__name__ for name, k, _ in fwd if name not in training}


def _sweep_stage(package_dir: str, stage: str, shape: Sequence[int], dtype_name: str, device_name: str,
                 configs: Sequence[Config]) -> None:
    """(child process) One JSON line per candidate of `stage`: its time, or why it was refused."""
    import torch
    from triton.compiler.errors import CompilationError

    from .api import random_inputs
    from .compile import import_package

    os.environ["DGPS_TUNED"] = "0"  # the reference is the table's setting; candidates enter as overrides
    os.environ["DGPS_AUTOTUNE"] = "0"
    B, T, H, HV, DK, DV = shape
    pkg = import_package(package_dir, "dgps_tuning.package")  # the very files the parent runs
    mod = pkg.chunk
    device = torch.device(device_name)
    dtype = getattr(torch, dtype_name)
    x = random_inputs(pkg.IR, B, T, H, DK, DV, HV, dtype=dtype, seed=0, device=device,
                      on_device=device.type == "cuda")
    x = {k: v.requires_grad_(True) if v.is_floating_point() else v for k, v in x.items()}
    gen = torch.Generator(device="cpu").manual_seed(1)
    do = torch.randn(B, T, HV, DV, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)  # o's shape

    inference = inference_stage_kernels(mod, B * HV, DV, device)

    def step() -> list:
        if stage in inference:  # an inference call's own kernel: the forward without gradients, o and the states
            with torch.no_grad():
                out = pkg.forward(**x, output_final_state=True)
            return [out.o, *out.final_state.values()]
        for t in x.values():
            t.grad = None
        out = pkg.forward(**x)
        out.o.backward(do)
        return [out.o.detach()] + [t.grad for t in x.values() if t.grad is not None]

    kernel = {**stage_kernels(mod, B * HV, DV, device), **inference}.get(stage)
    if kernel is None:
        print(json.dumps({"stage": stage, "skip": f"{mod.NAME} launches no stage {stage} at this shape"}), flush=True)
        return
    saved = dict(mod.LAUNCH_OVERRIDES)
    # the reference: the setting the parent calls the table's (the launch table, or DGPS_LAUNCH where it names the stage)
    reference = [t.clone() for t in step()]
    # the reference ran: a child that dies after this line died of a candidate, not of the stage or the package
    print(json.dumps({"stage": stage, "ready": True}), flush=True)
    tol = float(os.environ.get("DGPS_TUNE_TOLERANCE", TOLERANCE[dtype_name]))  # (tests set it)

    def timed() -> float:
        if device.type != "cuda":
            t0 = time.perf_counter()
            step()
            return (time.perf_counter() - t0) * 1e3
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages() if e.key == kernel) / 1e3

    try:
        for cfg in configs:
            mod.LAUNCH_OVERRIDES[stage] = tuple(cfg)
            try:
                got = step()
            except (ValueError, CompilationError) as e:  # check_launch's refusal, or a kernel's static_assert
                print(json.dumps({"stage": stage, "config": list(cfg), "refused": str(e).splitlines()[-1][:200]}),
                      flush=True)
                continue
            worst = max(_relative_difference(a, b) for a, b in zip(got, reference, strict=True))
            if not worst <= tol:  # NaN included
                print(json.dumps({"stage": stage, "config": list(cfg), "refused":
                                  f"results differ from the table setting's by {worst:.2e} (tolerance {tol:.0e})"}),
                      flush=True)
                continue
            if device.type == "cuda":
                torch.cuda.synchronize()
            ms = statistics.median(timed() for _ in range(3))
            print(json.dumps({"stage": stage, "config": list(cfg), "ms": ms, "difference": worst}), flush=True)
    finally:
        mod.LAUNCH_OVERRIDES.clear()
        mod.LAUNCH_OVERRIDES.update(saved)


# ---- the parent: children per stage, the file --------------------------------------------------------------------------

def _run_children(package_dir: str, stage: str, shape: Sequence[int], dtype_name: str, device_name: str,
                  todo: list[Config], run: Callable[[list[str]], subprocess.CompletedProcess]
                  ) -> tuple[list[dict], list[str]]:
    """Every candidate of `todo` in child processes, in order, a new child after each fault. Returns the rows the
    children printed and one line per faulted candidate."""
    rows: list[dict] = []
    faults: list[str] = []
    idle = 0  # children in a row that died before their reference step ran: two mean the stage itself fails
    while todo and idle < 2:
        cmd = [sys.executable, "-m", "dgps.runtime.autotune", "--child", package_dir, "--stage", stage,
               "--shape", *map(str, shape), "--dtype", dtype_name, "--device", device_name,
               "--configs", *(",".join(map(str, c)) for c in todo)]
        proc = run(cmd)
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        rows += [r for r in got if "ready" not in r]
        if any("skip" in r for r in got):
            break
        err = (proc.stderr or "").strip().splitlines()
        last = next((line for line in reversed(err) if "Error" in line), err[-1] if err else "")
        why = f"the child exited {proc.returncode}" + (f" ({last.strip()[:200]})" if last else "")
        if not any("ready" in r for r in got):  # not a candidate's doing: try once more, then give the stage up
            idle += 1
            faults.append(f"{stage}: {why} before its reference step ran")
            continue
        idle = 0
        done = len([r for r in got if "config" in r])
        if proc.returncode == 0 or done >= len(todo):
            break
        faults.append(f"{stage} {list(todo[done])}: {why}")
        todo = todo[done + 1:]
    return rows, faults


def _subprocess_run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def tune(pkg: Any, shape: Sequence[int], *, HV: int | None = None, dtype: str = "bfloat16", device: str = "cuda",
         stages: Sequence[str] | None = None, configs: Sequence[Config] | None = None, record: bool = True,
         log: Callable[[str], None] = print,
         run: Callable[[list[str]], subprocess.CompletedProcess] = _subprocess_run) -> tuple[Path, dict[str, dict]]:
    """Sweep the chunk stages of the compiled package `pkg` (dgps.compile's module) at shape (B, T, H, dk, dv), HV
    value heads (default H); `record`: write the fastest checked setting of each to its tuned file. Returns the file's
    path and, per stage, the best setting, the table's, and every row the children printed (`rows`: timed, refused,
    skipped) with the faulted candidates (`faults`)."""
    import torch

    mod = getattr(pkg, "chunk", None)
    if mod is None:
        raise TuneError(f"{pkg.__name__}: no chunk module (the package runs the recurrent kernels): nothing to tune")
    if dtype not in TOLERANCE:
        raise TuneError(f"dtype {dtype!r}: expected one of {', '.join(TOLERANCE)}")
    if len(shape) != 5 or min(shape) < 1:
        raise TuneError(f"shape {tuple(shape)}: expected five positive sizes B, T, H, dk, dv")
    B, T, H, DK, DV = shape
    HV = HV or H
    dev = torch.device(device)
    launched = list(stage_kernels(mod, B * HV, DV, dev)) + list(inference_stage_kernels(mod, B * HV, DV, dev))
    unknown = [s for s in (stages or []) if s not in launched]
    if unknown:
        raise TuneError(f"{pkg.__name__}: stage(s) {', '.join(unknown)} not launched; its stages: {', '.join(launched)}")
    package_dir = str(Path(mod.__file__).resolve().parent)
    path = tuned_path(mod.__file__, mod.NAME, device_label(dev))
    results: dict[str, dict] = {}
    for stage in stages or launched:
        table = mod.launch_config(stage, DK, DV, B * HV)  # the table's (or DGPS_LAUNCH's) setting: the reference
        cands = [table] + [c for c in (configs or tuning_candidates(stage, DK, DV, around=table)) if tuple(c) != tuple(table)]
        rows, faults = _run_children(package_dir, stage, (B, T, H, HV, DK, DV), dtype, device,
                                     [tuple(c) for c in cands], run)
        for f in faults:
            log(f"  faulted: {f}")
        for r in rows:
            if "refused" in r:
                log(f"  refused: {stage} {r['config']}: {r['refused']}")
        timed = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
        base = next((r["ms"] for r in timed if tuple(r["config"]) == tuple(table)), None)
        if not timed or base is None:
            log(f"{stage}: not tuned (the table's setting {list(table)} did not run to a time)")
            continue
        best = timed[0]
        results[stage] = {"config": best["config"], "ms": best["ms"], "table": list(table), "table_ms": base,
                          "rows": rows, "faults": faults}
        log(f"{stage}: table {list(table)} {base:.4f} ms, best {best['config']} {best['ms']:.4f} ms "
            f"({len(timed)} timed)")
    meta = {"shape": [B, T, H, HV, DK, DV], "dtype": dtype, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__, "triton": __import__("triton").__version__}
    if record:
        best = {stage: {k: r[k] for k in ("config", "ms", "table", "table_ms")} for stage, r in results.items()}
        _record(path, shape_class(DK, DV, B * HV), best, meta)
    return path, results


def ensure_tuned(module: Any, N: int, T: int, H: int, HV: int, DK: int, DV: int, device: Any, dtype: Any,
                 log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> None:
    """DGPS_AUTOTUNE=1: tune the package of chunk module `module` at the call's shape once per device and shape
    class, before the class's first launch (the generated hosts call it on a GPU only)."""
    if os.environ.get("DGPS_AUTOTUNE", "") != "1" or is_tuned(module.__file__, module.NAME, DK, DV, N * HV, device):
        return
    pkg = sys.modules[module.__name__.rpartition(".")[0]]
    log(f"dgps: DGPS_AUTOTUNE=1: tuning {module.NAME} at B={N} T={T} H={H} HV={HV} dk={DK} dv={DV} on "
        f"{device_label(device)} (once per shape class; minutes: every candidate compiles)")
    tune(pkg, (N, T, H, DK, DV), HV=HV, dtype=str(dtype).removeprefix("torch."), device=str(device),
         log=lambda s: log("  " + s))  # and records


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dgps.runtime.autotune")
    p.add_argument("--child", required=True)
    p.add_argument("--stage", required=True)
    p.add_argument("--shape", nargs=6, type=int, required=True, help="B T H HV dk dv")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--configs", nargs="+", required=True)
    a = p.parse_args(argv)
    configs = [tuple(int(v) for v in c.split(",")) for c in a.configs]
    _sweep_stage(a.child, a.stage, a.shape, a.dtype, a.device, configs)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
