"""keep_states (FLA's disable_recompute) against the default recompute, dgps only, in one process.

    python benchmarks/keep_states_ab.py [--systems gdn kda ...] [--shape B T H D] [--reps 5] [--json FILE]

Each system is called through its FLA signature in dgps.fla_compat on bench_fla's bf16 inputs; the keep side runs
the same call with every package forward's `keep_states=True` (dgps.runtime.fla_compat._run patched for the call:
FLA's signatures carry `disable_recompute` only for kda, gdn2, precond_kda and dplr). Reported per system, both
sides: the training step's time (median over `--reps` interleaved rounds of do_bench medians), its peak memory above
the inputs, and what the forward holds for its backward (allocated after the forward, before the backward, above the
inputs; o included). The gradients of the two sides are compared (max relative difference by norm; the same kernel
stores H_n and U either way, so 0 is expected; o may differ in rounding where the plan fuses the output into the
state pass, which keep_states runs as two launches).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fla import SCALAR, VECTOR, calls, fwd_bwd, interleaved, make_inputs, peak_mib, source_hash  # noqa: E402


def keeping(fn: Callable, impl) -> Callable:  # noqa: ANN001 - dgps.runtime.fla_compat
    """`fn` with every package forward it reaches called with keep_states=True."""
    run = impl._run

    def forced(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - _run's own
        # over the call's own keep_states too (chunk_kda passes disable_recompute's, False by default)
        return run(*args, **{**kwargs, "keep_states": True})

    def call(x: dict[str, torch.Tensor]) -> torch.Tensor:
        impl._run = forced
        try:
            return fn(x)
        finally:
            impl._run = run

    return call


def held_mib(fn: Callable, x: dict[str, torch.Tensor]) -> float:
    """Memory the forward leaves allocated for its backward (outputs and saved buffers), above the inputs."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    out = fn(leaves)
    torch.cuda.synchronize()
    held = (torch.cuda.memory_allocated() - base) / 2**20
    del out
    return held


def grads_of(fn: Callable, x: dict[str, torch.Tensor], do: torch.Tensor) -> dict[str, torch.Tensor]:
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in x.items()}
    fn(leaves).backward(do)
    return {k: v.grad.float() for k, v in leaves.items() if v.grad is not None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", nargs="*", default=list(SCALAR + VECTOR[:4]))
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    import dgps.runtime.fla_compat as impl
    from dgps import fla_compat

    B, T, H, D = a.shape
    ours = calls(fla_compat)
    rows = {}
    print(f"{torch.cuda.get_device_name()}  shape B={B} T={T} H={H} D={D} bf16, pipeline {source_hash()}")
    print(f"{'system':<12} {'step ms':>9} {'keep ms':>9} {'ratio':>6} {'peak MiB':>9} {'keep':>7} "
          f"{'held MiB':>9} {'keep':>7} {'grad diff':>9}")
    for system in a.systems:
        x = make_inputs(system, B, T, H, D)
        base, keep = ours[system], keeping(ours[system], impl)
        do = torch.randn_like(base(x).float()).to(torch.bfloat16)
        gb, gk = grads_of(base, x, do), grads_of(keep, x, do)
        diff = max(float((gk[n] - gb[n]).norm() / gb[n].norm().clamp_min(1e-30)) for n in gb)
        steps = {"recompute": fwd_bwd(base, x, do), "keep": fwd_bwd(keep, x, do)}
        for f in steps.values():
            f()
        ms = interleaved(steps, a.reps)
        peak = {k: peak_mib(f) for k, f in steps.items()}
        held = {"recompute": held_mib(base, x), "keep": held_mib(keep, x)}
        rows[system] = {"recompute_ms": ms["recompute"], "keep_ms": ms["keep"], "recompute_peak_mib": peak["recompute"],
                        "keep_peak_mib": peak["keep"], "recompute_held_mib": held["recompute"],
                        "keep_held_mib": held["keep"], "grad_max_rel_diff": diff}
        print(f"{system:<12} {ms['recompute']:9.3f} {ms['keep']:9.3f} {ms['keep'] / ms['recompute']:6.3f} "
              f"{peak['recompute']:9.1f} {peak['keep']:7.1f} {held['recompute']:9.1f} {held['keep']:7.1f} {diff:9.2e}",
              flush=True)
    if a.json:
        a.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "shape": a.shape, "reps": a.reps,
                                      "torch": torch.__version__, "pipeline": source_hash(), "systems": rows},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
