"""A plan decision flipped for one spec, measured against the shipped plan in one process: errors of both against the
float64 reference, then forward and forward+backward times (interleaved medians) and kernel sums.

    python benchmarks/plan_experiment.py SPEC... --patch fuse_output [--shape 4 4096 16 128] [--reps 5]

The experiment's package is the spec renamed `<name>__<patch>` (so the package cache keys differ); the patch changes
the plan rule for that name only, so both packages live side by side. A patch is a question for the GPU before a
plan rule changes, not a setting: a result that holds moves into compiler/plan.py with its measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _for_renamed(shipped: Callable, suffix: str, replacement: Callable) -> Callable:
    """The plan rule `shipped`, answered by `replacement` for the spec renamed `<name>__<suffix>` alone."""
    def rule(b) -> bool:  # noqa: ANN001
        return replacement(b) if b.ir.name.endswith(f"__{suffix}") else shipped(b)
    return rule


def _fuse_output(plan) -> Callable:  # noqa: ANN001
    """The output inside the state pass for every scalar- or no-decay tied/additive spec, fp32 k̃ or q̂ included
    (compiler/plan.py: _output_in_state_pass excludes them after run 40's NaN under Triton 3.6)."""
    return _for_renamed(plan._output_in_state_pass, "fuse_output",
                        lambda b: b.s.decay != "vector" and b.family != "untied")


def _no_inference_wy(plan) -> Callable:  # noqa: ANN001
    """An inference call launches wy before the fused state pass + output, as a training forward does (the plan
    before compiler/plan.py's _wy_in_inference_state_pass)."""
    return _for_renamed(plan._wy_in_inference_state_pass, "no_inference_wy", lambda b: False)


def _keep_scores(plan) -> Callable:  # noqa: ANN001
    """The reverse state pass forms dU's local share from stored scores: a training forward stores the output's
    (compiler/plan.py: _scores_kept), per-channel decay reads the interaction's Q⋆A (scores_in_reverse_pass); both off
    in the shipped plan before run 123 (KEEP_SCORES; the vector family's QA_IN_REVERSE_PASS still is). Patches
    _scores_kept and, for the vector family, QA_IN_REVERSE_PASS inside scores_in_reverse_pass for the renamed spec
    only."""
    shipped_reverse = plan.scores_in_reverse_pass

    def reverse(p):  # noqa: ANN001, ANN202
        if not p.name.endswith("__keep_scores") or plan.QA_IN_REVERSE_PASS:
            return shipped_reverse(p)
        plan.QA_IN_REVERSE_PASS = True
        try:
            return shipped_reverse(p)
        finally:
            plan.QA_IN_REVERSE_PASS = False
    import dgps.codegen.chunk as codegen_chunk

    plan.scores_in_reverse_pass = codegen_chunk.scores_in_reverse_pass = reverse  # the plan's rules and codegen's
    return _for_renamed(plan._scores_kept, "keep_scores", plan.scores_keepable)


def _no_keep_scores(plan) -> Callable:  # noqa: ANN001
    """The training forward stores no scores and bwd_local_values forms dU's local share (the shipped plan before
    run 123: KEEP_SCORES off) for the renamed spec."""
    return _for_renamed(plan._scores_kept, "no_keep_scores", lambda b: False)


def _more_scores(plan) -> Callable:  # noqa: ANN001
    """The read-corrected (CCQ) and preconditioned (pdn, pgdn, exact_atk) specs keep the output's scores as well
    (compiler/plan.py: SCORES_WITH_READ_CORRECTION, SCORES_WITH_PRECONDITIONER, off in the shipped plan) for the
    renamed spec."""
    return _for_renamed(plan._scores_kept, "more_scores", lambda b: plan.KEEP_SCORES and b.family == "tied")


def _wy_train(plan) -> Callable:  # noqa: ANN001
    """A training forward forms the WY form inside its fused state pass + output, storing W and Ũ for the backward
    (compiler/plan.py: WY_IN_TRAINING_STATE_PASS, off in the shipped plan), for the renamed spec."""
    return _for_renamed(plan._wy_in_training_state_pass, "wy_train", lambda b: True)


def _no_route_rerun(plan) -> Callable:  # noqa: ANN001
    """The backward's rerun of the state pass forms R = Ũ − W H_n (+ Z) again instead of reading the forward's route
    output (compiler/plan.py: rerun_reads_route; the shipped plan before the thirty-first session), for the renamed
    spec."""
    shipped = plan._route_in_rerun
    return lambda p: False if p.name.endswith("__no_route_rerun") else shipped(p)


def _fused_cumsum(plan) -> Callable:  # noqa: ANN001
    """The per-channel chunk cumsum at the start of the interaction's launch (compiler/plan.py: _cumsum_in_interaction,
    CUMSUM_IN_INTERACTION off in the shipped plan after run 150), for the renamed spec."""
    shipped = plan._cumsum_in_interaction

    def rule(b, exclusive: bool) -> bool:  # noqa: ANN001
        if not b.ir.name.endswith("__fused_cumsum") or plan.CUMSUM_IN_INTERACTION:
            return shipped(b, exclusive)
        plan.CUMSUM_IN_INTERACTION = True
        try:
            return shipped(b, exclusive)
        finally:
            plan.CUMSUM_IN_INTERACTION = False
    return rule


PATCHES = {"fuse_output": ("_output_in_state_pass", _fuse_output),
           "fused_cumsum": ("_cumsum_in_interaction", _fused_cumsum),
           "no_route_rerun": ("_route_in_rerun", _no_route_rerun),
           "no_inference_wy": ("_wy_in_inference_state_pass", _no_inference_wy),
           "keep_scores": ("_scores_kept", _keep_scores),
           "no_keep_scores": ("_scores_kept", _no_keep_scores),
           "more_scores": ("_scores_kept", _more_scores),
           "wy_train": ("_wy_in_training_state_pass", _wy_train)}


def renamed(text: str, name: str, suffix: str) -> str:
    return text.replace(f"recurrence {name}", f"recurrence {name}__{suffix}", 1)


def main() -> int:
    from bench_backward import kernel_times
    from bench_fla import fwd_bwd, interleaved
    from grad_errors import grad_errors

    import dgps

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="+")
    p.add_argument("--patch", choices=sorted(PATCHES), required=True)
    p.add_argument("--shape", nargs=4, type=int, default=[4, 4096, 16, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--check-dtypes", nargs="*", default=["bf16", "fp32"])
    p.add_argument("--check-shape", nargs=4, type=int, default=[2, 300, 2, 128], metavar=("B", "T", "H", "D"))
    p.add_argument("--device", default="cuda", help="cpu: the checks alone, under TRITON_INTERPRET=1")
    p.add_argument("--json")
    p.add_argument("--patched-launch", default="",
                   help="launch settings of the patched side only, as DGPS_LAUNCH writes them (\"stage=BK,BV,warps,"
                        "stages;...\"): a form that wants other settings than the table's")
    p.add_argument("--keep-states", action="store_true",
                   help="also time each side's training step with keep_states=True (side '<name> keep')")
    a = p.parse_args()
    import dgps.compiler.plan as plan

    attr, factory = PATCHES[a.patch]
    setattr(plan, attr, factory(plan))
    B, T, H, D = a.shape
    result: dict[str, dict] = {}
    for name in a.specs:
        text = (ROOT / "specs" / f"{name}.dgps").read_text()
        recs = {name: dgps.load(text), f"{name}__{a.patch}": dgps.load(renamed(text, name, a.patch))}
        if a.patched_launch:  # the patched side's modules (the package's, the checks'): the shipped side keeps the table
            from dgps.codegen.launch import parse_launch_overrides
            from dgps.runtime.compile import load_chunk

            patched = recs[f"{name}__{a.patch}"]
            for mod in (dgps.compile(patched).chunk, load_chunk(patched.ir)):
                mod.LAUNCH_OVERRIDES.update(parse_launch_overrides(a.patched_launch))
        row: dict[str, dict] = {"errors": {}, "fwd_ms": {}, "fwdbwd_ms": {}, "kernels": {}}
        for dt in a.check_dtypes:
            for key, rec in recs.items():
                B0, T0, H0, D0 = a.check_shape
                e = grad_errors(rec, B0, T0, H0, H0, D0, D0, {"bf16": torch.bfloat16, "fp32": torch.float32}[dt],
                                seed=0, device=a.device, train=True)
                # the inference call's o and final states (chunk_forward: its own launch list where the plan says)
                e_inf = grad_errors(rec, B0, T0, H0, H0, D0, D0,
                                    {"bf16": torch.bfloat16, "fp32": torch.float32}[dt], seed=0, device=a.device)
                e["o (inference)"] = e_inf["o"]
                row["errors"][f"{key} {dt}"] = e
                print(f"{key:<28} {dt} worst {max(e.values()):.2e}  "
                      + " ".join(f"{k}={v:.1e}" for k, v in e.items()), flush=True)
        result[name] = row
        if a.device != "cuda":
            continue
        fwds, steps = {}, {}
        for key, rec in recs.items():
            pkg = dgps.compile(rec)
            x = rec.random_inputs(B, T, H, D, D, dtype=torch.bfloat16, seed=0, device="cuda")
            do = torch.randn(B, T, H, D, dtype=torch.bfloat16, device="cuda")
            fwds[key] = lambda pkg=pkg, x=x: pkg.forward(**x).o
            steps[key] = fwd_bwd(lambda xx, pkg=pkg: pkg.forward(**xx).o, x, do)
            steps[key]()
            if a.keep_states:
                steps[f"{key} keep"] = fwd_bwd(lambda xx, pkg=pkg: pkg.forward(**xx, keep_states=True).o, x, do)
                steps[f"{key} keep"]()
        row["fwd_ms"] = interleaved(fwds, a.reps)
        row["fwdbwd_ms"] = interleaved(steps, a.reps)
        row["kernels"] = {k: kernel_times(s) for k, s in steps.items()}
        for key in steps:
            fwd = f"fwd {row['fwd_ms'][key]:.3f} ms  " if key in row["fwd_ms"] else ""
            print(f"{key:<28} {fwd}fwd+bwd {row['fwdbwd_ms'][key]:.3f} ms  kernel sum "
                  f"{sum(row['kernels'][key].values()):.3f}  {json.dumps(row['kernels'][key])}", flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
