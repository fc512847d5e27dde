"""dgps next to FLA (and FlashQLA for GDN, when installed) in one process, through FLA's signatures.

    python benchmarks/bench_fla.py [--systems gdn delta_rule ...] [--shape B T H D] [--reps 5]
                                   [--json benchmarks/latest.json] [--profile] [--variants [scalar|vector ...]] [--cold-start]

Both sides are called through fla-core 0.6.0's public signatures with its default options (dgps through
`dgps.fla_compat`, FLA through `fla.ops`), on the same bf16 inputs (q, k L2-normalised beforehand, as FLA's
delta-rule kernels expect when `use_qk_l2norm_in_kernel` is off; precond_gdn keeps FLA's default of
normalising in the kernel). Each measurement is `triton.testing.do_bench`'s median; the implementations are
timed interleaved (dgps, FLA, FlashQLA, dgps, FLA, ...) `--reps` times and the median of those is reported.
Peak memory is the allocator's peak during one forward+backward above what the inputs already hold.

fla-core 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 (its #640 guard); this script lifts
the guard (`fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True`) to take FLA's timings, and says so in the
output. `--variants` times dgps's library specs forward+backward next to their base system (no FLA counterpart):
scalar gdn, ccq_gdn, pgdn, cler_h_gdn; vector kda, gla, pkda, ccq_gla, clvr_kda, cler_h_kda. The library's kda and gla
take q, k as given (FLA's signatures) while clvr_kda, cler_h_kda and ccq_gla normalise them (`normalize q, k`), so the
vector family is also timed against kda_l2norm and gla_l2norm (the base spec with that one line added): the
normalisation is not the variant's cost.
`--cold-start` times a fresh process's first forward+backward of gdn with empty caches.
`--output-forms` also times dgps with its output forced into the state pass's launch and forced into a launch of its
own (sides dgps_fused, dgps_unfused; `dgps` picks per call: few sequences × heads on a GPU take the unfused pair).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_backward import kernel_times, reference_o_and_grads  # noqa: E402
from bench_forward import rel  # noqa: E402

SCALAR = ("simple_gla", "delta_rule", "gdn", "precond_gdn")
VECTOR = ("gla", "kda", "gdn2", "precond_kda", "dplr")


def make_inputs(system: str, B: int, T: int, H: int, D: int, seed: int = 0,
                device: str = "cuda") -> dict[str, torch.Tensor]:
    """FLA-convention inputs in bf16 (the gates are log-decays in (−∞, 0), β in (0, 1)); `device` "cpu" for
    benchmarks/memory_trace.py."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    bf = torch.bfloat16
    x = {"q": F.normalize(randn(B, T, H, D), dim=-1).to(bf), "k": F.normalize(randn(B, T, H, D), dim=-1).to(bf),
         "v": randn(B, T, H, D).to(bf)}
    if system in ("simple_gla", "gdn", "precond_gdn"):
        x["g"] = F.logsigmoid(randn(B, T, H) + 3.0).to(bf)
    if system in ("gla", "kda", "gdn2", "precond_kda"):
        x["g"] = (F.logsigmoid(randn(B, T, H, D) + 3.0) / 8).to(bf)
    if system not in ("simple_gla", "gla", "dplr"):
        x["beta"] = torch.sigmoid(randn(B, T, H)).to(bf)
    if system in ("precond_gdn", "precond_kda"):
        x["g_atk"] = F.logsigmoid(randn(B, T, H) + 3.0).to(bf)
        x["beta_atk"] = torch.sigmoid(randn(B, T, H)).to(bf)
    if system == "gdn2":
        x["b"] = torch.sigmoid(randn(B, T, H, D)).to(bf)
        x["w"] = torch.sigmoid(randn(B, T, H, D)).to(bf)
    if system == "dplr":  # RWKV-7: a = −κ̂ (unit removal key), b = κ̂ ⊙ ι (in-context learning rate), per-channel log-gates
        kappa = F.normalize(randn(B, T, H, D), dim=-1)
        x["a"] = (-kappa).to(bf)
        x["b"] = (kappa * torch.sigmoid(randn(B, T, H, D))).to(bf)
        x["gk"] = (F.logsigmoid(randn(B, T, H, D) + 3.0) / 8).to(bf)
        x["k"] = (0.5 * x["k"].float()).to(bf)
    return x


def ragged_cu_seqlens(total: int, n: int, seed: int = 0) -> torch.Tensor:
    """int32 cu_seqlens of `n` sequences of ragged lengths (between half and one and a half of the mean) summing
    to `total` tokens."""
    gen = torch.Generator().manual_seed(seed)
    w = 0.5 + torch.rand(n, generator=gen, dtype=torch.float64)
    cuts = torch.round(torch.cumsum(w, 0) / w.sum() * total).long()
    return torch.cat([torch.zeros(1, dtype=torch.long), cuts]).to(torch.int32).cuda()


def calls(mod) -> dict[str, Callable]:  # noqa: ANN001 - fla.ops or dgps.fla_compat
    """system -> f(x) -> o, one FLA signature per system (the same call for both libraries)."""
    return {
        "simple_gla": lambda x: mod.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"])[0],
        "gla": lambda x: mod.chunk_gla(x["q"], x["k"], x["v"], x["g"])[0],
        "delta_rule": lambda x: mod.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"])[0],
        "gdn": lambda x: mod.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                    cu_seqlens=x.get("cu_seqlens"))[0],
        "kda": lambda x: mod.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x.get("cu_seqlens"))[0],
        "gdn2": lambda x: mod.chunk_gdn2(x["q"], x["k"], x["v"], x["g"], x["b"], x["w"])[0],
        "precond_gdn": lambda x: mod.chunk_precond_gated_delta_rule(x["q"], x["k"], x["v"], x["g_atk"], x["g"],
                                                                    x["beta_atk"], x["beta"])[0],
        "precond_kda": lambda x: mod.chunk_precond_kda(x["q"], x["k"], x["v"], x["g"], x["g_atk"], x["beta_atk"],
                                                       x["beta"])[0],
        "dplr": lambda x: mod.chunk_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["gk"])[0],
    }


def fla_module():  # noqa: ANN201

    import fla.ops.common.chunk_o as chunk_o
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gdn2 import chunk_gdn2
    from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule
    from fla.ops.gla import chunk_gla
    from fla.ops.kda import chunk_kda
    from fla.ops.precond_gated_delta_rule import chunk_precond_gated_delta_rule
    from fla.ops.precond_kda import chunk_precond_kda
    from fla.ops.simple_gla import chunk_simple_gla

    chunk_o.TRITON_ABOVE_3_7_1 = True  # lift the #640 guard (see the module docstring)

    class M:
        pass

    m = M()
    for f in (chunk_delta_rule, chunk_dplr_delta_rule, chunk_gated_delta_rule, chunk_gdn2, chunk_gla, chunk_kda,
              chunk_precond_gated_delta_rule, chunk_precond_kda, chunk_simple_gla):
        setattr(m, f.__name__, f)
    return m


def flashqla_gdn() -> Callable | None:
    try:
        from flash_qla import chunk_gated_delta_rule  # type: ignore[import-not-found]
    except ImportError:
        return None

    def run(x: dict[str, torch.Tensor]) -> torch.Tensor:
        return chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"].float(), x["beta"])[0]

    return run


def variant_spec(name: str) -> str:
    """The library spec `name`, or for `<base>_l2norm` the base spec with `normalize q, k` added (renamed)."""
    base = name.removesuffix("_l2norm")
    text = (ROOT / "specs" / f"{base}.dgps").read_text()
    if base == name:
        return text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["decay"])
    lines.insert(at, "  normalize q, k")
    return "\n".join(lines).replace(f"recurrence {base}", f"recurrence {name}", 1) + "\n"


def _o_and_route(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return out.o, out.route


def fwd_bwd(fn: Callable, x: dict[str, torch.Tensor], do: torch.Tensor,
            dr: torch.Tensor | None = None) -> Callable[[], None]:
    """One training step: forward, then backward from `do` (and, where `fn` also returns the route output the next
    layer reads, from its gradient `dr`, so that the route's backward is timed as a stack runs it)."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}

    def step() -> None:
        for t in leaves.values():
            t.grad = None
        out = fn(leaves)
        if dr is None:
            out.backward(do)
        else:
            torch.autograd.backward(list(out), [do, dr])

    return step


def peak_mib(step: Callable[[], None]) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


SOURCE_DIRS = ("dsl", "compiler", "codegen", "runtime")


def source_hash() -> str:
    """SHA-256 (16 hex digits) of the package's pipeline sources (dsl, compiler, codegen, runtime: .py and .jinja, by
    relative path and content), which name the tree a benchmark ran whatever the checkout's git says."""
    import hashlib

    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for f in sorted((ROOT / d).rglob("*")):
            if f.suffix in (".py", ".jinja") and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def forced_output(fn: Callable, fuse: bool) -> Callable:
    """`fn` with every loaded chunk module that fuses its output per call (FUSE_OUTPUT) forced to `fuse` while it runs
    (only the forward's launch list depends on it; the modules are found at the first call, which loads them)."""

    found: list = []  # after the first call: a scan of sys.modules costs ~1 ms of host time, more than the forward

    def call(x: dict[str, torch.Tensor]) -> torch.Tensor:
        mods = found or [m for m in list(sys.modules.values())
                         if hasattr(m, "_unfused_kernels") and hasattr(m, "FUSE_OUTPUT")]
        if not found:
            found.extend(mods)
        saved = [m.FUSE_OUTPUT for m in mods]
        for m in mods:
            m.FUSE_OUTPUT = fuse
        try:
            return fn(x)
        finally:
            for m, v in zip(mods, saved, strict=True):
                m.FUSE_OUTPUT = v

    return call


def interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median over `reps` interleaved rounds of each function's do_bench median (ms)."""
    import triton.testing

    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median"))
    return {k: statistics.median(v) for k, v in times.items()}


def accuracy(system: str, sides: dict[str, Callable], x: dict[str, torch.Tensor], do: torch.Tensor) -> dict:
    """Relative errors ‖x − ref‖/‖ref‖ of o and of every input gradient, for each side, against the float64
    reference of the spec dgps.fla_compat built for this call (same bf16-rounded inputs)."""
    import dgps.runtime.fla_compat as compat

    seen: dict = {}
    run = compat._run

    def spy(fn, spec, inputs, **kw):  # noqa: ANN001, ANN202
        seen.update(spec=spec, inputs=inputs)
        return run(fn, spec, inputs, **kw)

    compat._run = spy
    try:
        sides["dgps"](x)
    finally:
        compat._run = run
    # the spec's inputs are FLA's arguments themselves (default options): map them back by identity
    by_id = {id(t): n for n, t in x.items()}
    spec_inputs = {n: t for n, t in seen["inputs"].items() if t is not None}
    if not all(id(t) in by_id for t in spec_inputs.values()):
        return {"skipped": "the spec's inputs are derived from FLA's arguments"}
    rec = compat.compiled(seen["spec"]).RECURRENCE
    ref_o, ref_g = reference_o_and_grads(rec, spec_inputs, do)
    out: dict = {}
    for side, f in sides.items():
        leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
        o = f(leaves)
        o.backward(do)
        errs = {"o": rel(o, ref_o)}
        for n, t in spec_inputs.items():
            errs[by_id[id(t)]] = rel(leaves[by_id[id(t)]].grad, ref_g[n])
        out[side] = errs
    return out


COLD = r"""
import json, time
t0 = time.time()
import torch, triton, triton.compiler
from triton.backends.nvidia import driver as nv
spent = {"kernel_compile_s": 0.0, "launcher_build_s": 0.0, "kernels": 0, "launchers": 0}
def timed(f, key):
    def g(*a, **k):
        t = time.time()
        try:
            return f(*a, **k)
        finally:
            spent[key + "_s"] += time.time() - t
            spent[key.split("_")[0] + "s"] += 1
    return g
triton.compiler.compile = timed(triton.compiler.compile, "kernel_compile")  # JITFunction binds it at first use
nv.CudaLauncher.__init__ = timed(nv.CudaLauncher.__init__, "launcher_build")
import dgps
torch.cuda.init()
t1 = time.time()
import dgps.runtime.compile  # the pipeline's modules (sympy, jinja): bytecode compiled on a fresh machine
t_imp = time.time()
pkg = dgps.compile(open(%r).read())
rec = dgps.load(open(%r).read())
t2 = time.time()
x = rec.random_inputs(4, 4096, 16, 128, 128, dtype=torch.bfloat16, seed=0, device="cuda", on_device=True)
x = {k: v.requires_grad_(True) for k, v in x.items()}
torch.cuda.synchronize()
t3 = time.time()
out = pkg.forward(**x)
torch.cuda.synchronize()
t4 = time.time()
out.o.float().sum().backward()
torch.cuda.synchronize()
t5 = time.time()
print(json.dumps(dict(total_s=t5 - t0, import_and_cuda_init_s=t1 - t0, spec_compile_s=t2 - t1,
                      of_which_dgps_import_s=t_imp - t1, inputs_s=t3 - t2,
                      forward_s=t4 - t3, backward_s=t5 - t4, **spent)))
"""


def cold_start(spec: str, mode: str = "0") -> dict[str, float]:
    """A fresh process's first forward+backward of `spec` with empty caches, `mode` the DGPS_PARALLEL_COMPILE value:
    seconds in all (total_s) and per phase, with the seconds spent in Triton's kernel compiles and launcher builds
    (summed over threads: they overlap in the parallel modes)."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DGPS_CACHE_DIR=f"{d}/dgps", TRITON_CACHE_DIR=f"{d}/triton")
        env["DGPS_PARALLEL_COMPILE"] = mode
        env.pop("TRITON_STORE_BINARY_ONLY", None)
        path = str(ROOT / "specs" / f"{spec}.dgps")
        out = subprocess.run([sys.executable, "-c", COLD % (path, path)], env=env, capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    import triton

    import dgps
    import dgps.fla_compat as dgps_fla

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="*", default=list(SCALAR),
                   help="FLA systems to time (none: only --variants / --cold-start)")
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--merge", action="store_true", help="update the systems of an existing --json file")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--variants", nargs="*", choices=("scalar", "vector"), default=None,
                   help="the variants FLA lacks against their base system: both families, or those named")
    p.add_argument("--variant-specs", nargs="+", default=None, metavar="SPEC",
                   help="with --variants: only these specs of the families (a short device call)")
    p.add_argument("--cold-start", action="store_true")
    p.add_argument("--cold-start-rounds", type=int, default=2, help="interleaved rounds of the cold-start modes")
    p.add_argument("--cold-start-modes", nargs="+", default=["0", "threads", "fork", "processes"],
                   choices=("0", "threads", "fork", "processes"), help="DGPS_PARALLEL_COMPILE values to time")
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--varlen", type=int, default=0, metavar="N",
                   help="pack B·T tokens as N ragged sequences in one row (cu_seqlens); system keys get '_varlen'")
    p.add_argument("--fwd-only", action="store_true")
    p.add_argument("--output-forms", action="store_true",
                   help="also dgps with the output forced fused into the state pass and forced into its own launch")
    p.add_argument("--accuracy", action="store_true",
                   help="errors of o and every gradient against the float64 reference, for each side")
    p.add_argument("--source-hash", action="store_true",
                   help="print the hash of the package's sources (the JSON's source_hash) and exit")
    args = p.parse_args()
    if args.source_hash:
        print(source_hash())
        return 0
    B, T, H, D = args.shape
    # DGPS_COMMIT: the device's copy of the checkout may carry an older .git than the tree it was sent (its HEAD is then
    # stale: source_hash names the tree that ran; `--source-hash` at a commit here gives the same value)
    commit = os.environ.get("DGPS_COMMIT") or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                             capture_output=True, text=True).stdout.strip()
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
                    "source_hash": source_hash(),
                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "fla": None, "shape": [B, T, H, D], "repetitions": args.reps, "fla_guard_lifted": True,
                    # the shipped launch table (DGPS_TUNED=0, as benchmarks/device_env.sh sets), or settings a `dgps
                    # tune` recorded for this GPU where present (runtime/autotune.py)
                    "launch_settings": "table" if os.environ.get("DGPS_TUNED", "") == "0" else "tuned where recorded",
                    "systems": {}, "flashqla": {}, "variants_fwdbwd_ms": {}, "cold_start_s": {}, "profiles": {}}
    if args.merge and args.json and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text())
        for key in ("systems", "flashqla", "variants_fwdbwd_ms", "cold_start_s", "profiles"):
            result[key] = {**old.get(key, {}), **result[key]}
    impls: dict[str, dict[str, Callable]] = {"dgps": calls(dgps_fla)}
    if not args.no_fla:
        import fla

        result["fla"] = fla.__version__
        impls["fla"] = calls(fla_module())
    fqla = flashqla_gdn()
    print(json.dumps({k: result[k] for k in ("date", "commit", "gpu", "torch", "triton", "fla", "shape")}), flush=True)
    for system in args.systems:
        if args.varlen:
            x = make_inputs(system, 1, B * T, H, D)
            cu = ragged_cu_seqlens(B * T, args.varlen)
            sides = {k: (lambda xx, f=v[system], cu=cu: f({**xx, "cu_seqlens": cu})) for k, v in impls.items()}
        else:
            x = make_inputs(system, B, T, H, D)
            sides = {k: v[system] for k, v in impls.items()}
        do = torch.randn_like(x["v"])
        if system == "gdn" and fqla is not None:
            sides["flashqla"] = fqla
        if args.output_forms:
            sides["dgps_fused"] = forced_output(sides["dgps"], True)
            sides["dgps_unfused"] = forced_output(sides["dgps"], False)
        for name, f in sides.items():  # first calls (compile / cache restore) outside the timing
            t0 = time.time()
            fwd_bwd(f, x, do)()
            torch.cuda.synchronize()
            print(f"{system} {name}: first forward+backward {time.time() - t0:.1f} s", flush=True)
        fwd = interleaved({k: (lambda f=f, x=x: f(x)) for k, f in sides.items()}, args.reps)
        row: dict[str, float] = {}
        recorded = ("dgps", "fla", "dgps_fused", "dgps_unfused")
        for k in recorded:
            if k in fwd:
                row[f"{k}_fwd_ms"] = fwd[k]
        if not args.fwd_only:
            steps = {k: fwd_bwd(f, x, do) for k, f in sides.items()}
            fb = interleaved(steps, args.reps)
            for k in recorded:
                if k in fb:
                    row[f"{k}_fwdbwd_ms"] = fb[k]
                    row[f"{k}_peak_mib"] = peak_mib(steps[k])
            if "flashqla" in sides:
                result["flashqla"][system] = {"fwd_ms": fwd["flashqla"], "fwdbwd_ms": fb["flashqla"],
                                              "peak_mib": peak_mib(steps["flashqla"])}
            if args.profile:
                result["profiles"][system] = {k: kernel_times(s) for k, s in steps.items()}
        if args.accuracy:
            result.setdefault("accuracy", {})[system] = accuracy(system, sides, x, do)
            print(system, "accuracy", json.dumps(result["accuracy"][system]), flush=True)
        key = f"{system}_varlen" if args.varlen else system
        result["systems"][key] = row
        print(key, json.dumps(row), json.dumps(result["flashqla"].get(system, {})), flush=True)
        if args.json:  # after every system, so that a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        del x, do
        torch.cuda.empty_cache()
    if args.variants is not None:
        # each family against its base system, interleaved within the family (issue 8: the scalar variants
        # against gdn; issue 9: the vector variants against kda and gla)
        families = {"scalar": ("gdn", "ccq_gdn", "pgdn", "cler_h_gdn"),
                    "vector": ("kda", "kda_l2norm", "gla", "gla_l2norm", "pkda", "ccq_gla", "clvr_kda", "cler_h_kda")}
        for family in (families[f] for f in (args.variants or families)):
            if args.variant_specs:
                family = tuple(spec for spec in family if spec in args.variant_specs)
            steps = {}
            for spec in family:
                rec = dgps.load(variant_spec(spec))
                pkg = dgps.compile(rec)
                x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda")
                do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")
                if rec.ir.route != "none":  # CLER: the loss reads the route r too (a zero dR was a fill, not a read)
                    dr = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")
                    steps[spec] = fwd_bwd(lambda xx, pkg=pkg: _o_and_route(pkg.forward(**xx)), x, do, dr)
                else:
                    steps[spec] = fwd_bwd(lambda xx, pkg=pkg: pkg.forward(**xx).o, x, do)
                steps[spec]()
            result["variants_fwdbwd_ms"].update(interleaved(steps, args.reps))
            if args.profile:  # where each variant's extra time goes, per kernel
                result.setdefault("variant_profiles", {}).update({k: kernel_times(s) for k, s in steps.items()})
            del steps
            torch.cuda.empty_cache()
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print("variants", json.dumps(result["variants_fwdbwd_ms"]), flush=True)
    if args.cold_start:
        # interleaved rounds, so that a busy host slows every mode alike; the fastest of each mode is kept
        names = {"0": "gdn", "threads": "gdn_compile_threads", "fork": "gdn_compile_fork",
                 "processes": "gdn_compile_processes"}
        modes = {names[m]: m for m in args.cold_start_modes}
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in modes}
        for _ in range(args.cold_start_rounds):
            for key, mode in modes.items():
                runs[key].append(cold_start("gdn", mode))
        best = {k: min(v, key=lambda r: r["total_s"]) for k, v in runs.items()}
        result["cold_start_s"].update({k: r["total_s"] for k, r in best.items()})
        result["cold_start_phases"] = best
        print("cold start", result["cold_start_s"], flush=True)
        for k, r in best.items():
            print(f"  {k}: " + ", ".join(f"{n} {v:.2f}" if isinstance(v, float) else f"{n} {v}" for n, v in r.items()),
                  flush=True)
    print(f"\n{'system':<12} {'FLA fwd':>8} {'dgps fwd':>8} {'ratio':>6} {'FLA f+b':>8} {'dgps f+b':>8} {'ratio':>6} "
          f"{'peak MiB FLA/dgps':>18}")
    for s, r in result["systems"].items():
        def g(k: str, r: dict = r) -> float:
            return r.get(k, float("nan"))
        print(f"{s:<12} {g('fla_fwd_ms'):>8.3f} {g('dgps_fwd_ms'):>8.3f} {g('dgps_fwd_ms') / g('fla_fwd_ms'):>6.2f} "
              f"{g('fla_fwdbwd_ms'):>8.3f} {g('dgps_fwdbwd_ms'):>8.3f} {g('dgps_fwdbwd_ms') / g('fla_fwdbwd_ms'):>6.2f} "
              f"{g('fla_peak_mib'):>8.0f} / {g('dgps_peak_mib'):<8.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
