"""A training step's rerun of the state pass reads R from the forward's route output (compiler/plan.py:
rerun_reads_route): under the residual route's solve form the route r is R = Ũ − W H_n (+ Z) itself, so the
backward's rerun loads it as vn_buf and forms neither W H_n nor R again. Under the interpreter: the plan says which
specs do this; the rerun takes the route (a wrong route gives wrong gradients: the kernel reads it); with fp32 inputs
the gradients equal those of the rerun that forms R, and every gradient matches the float64 reference through the
package's training path (eager and custom-op), packed sequences included; an in-place change to the route before the
backward is refused by autograd, not silently used."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
from dgps.compiler.plan import build_plan, rerun_reads_route  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402
from dgps.runtime.reference import random_states  # noqa: E402
from dgps.runtime.tensors import Dims  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPECS = {"cler_h_gdn": ROOT / "specs" / "cler_h_gdn.dgps", "cler_h_kda": ROOT / "specs" / "cler_h_kda.dgps",
         "residual_no_gain": ROOT / "tests" / "residual_no_gain.dgps"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("name", ["gdn", "clvr_gdn", "clvr_kda", "kda", "cler_h_gdn", "cler_h_kda"])
def test_the_plan_says_which_reruns_read_the_route(name: str) -> None:
    p = build_plan(dgps.load(ROOT / "specs" / f"{name}.dgps").ir, 64, 16)
    assert rerun_reads_route(p) == name.startswith("cler_h")  # the residual route only: a value route is v itself


def _case(name: str, cu: bool) -> tuple:
    rec = dgps.load(SPECS[name])
    B, T, H, D = (1, 150, 2, 16) if cu else (2, 90, 2, 16)
    x = rec.random_inputs(B, T, H, D, D, HV=H, dtype=torch.float32, seed=3)
    cus = torch.tensor([0, 37, 101, 150], dtype=torch.int32) if cu else None
    s0 = {n: s.float() for n, s in random_states(rec.ir, Dims(B, T, H, H, D, D), 3 if cu else B, seed=3).items()}
    do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(4))
    dr = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(5))
    return rec, x, cus, s0, do, dr


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("cu", [False, True], ids=["rows", "packed"])
def test_the_rerun_reads_the_route(name: str, cu: bool) -> None:
    rec, x, cus, s0, do, dr = _case(name, cu)
    mod = load_chunk(rec.ir)
    given: list[bool] = []
    launch = mod._Run.launch

    def record(self, kernels):  # noqa: ANN001, ANN202
        if self.o is None and any(k[0] == "state_pass" for k in kernels):  # the backward's rerun (no output)
            given.append(self.r_given)
        return launch(self, kernels)

    def step(route_of) -> dict[str, torch.Tensor]:  # noqa: ANN001
        fwd, kept = mod.chunk_forward_train(x, initial_state=s0, cu_seqlens=cus)
        return mod.chunk_backward(x, initial_state=s0, do=do, d_route=dr, kept=kept, cu_seqlens=cus,
                                  route=route_of(fwd.route))[0]

    mod._Run.launch = record
    try:
        with_route = step(lambda r: r)
        formed = step(lambda r: None)
        wrong = step(lambda r: r * 0.5)
    finally:
        mod._Run.launch = launch
    assert given == [True, False, True]
    for n in x:
        # fp32: the route holds R exactly as the rerun would form it (up to the order of W H_n's accumulation)
        assert _rel(with_route[n], formed[n]) < 1e-5, (n, _rel(with_route[n], formed[n]))
    # the kernel reads the route: a wrong one moves the gradients that depend on H_n
    assert max(_rel(wrong[n], formed[n]) for n in x) > 1e-2


@pytest.mark.parametrize("name", ["cler_h_gdn", "cler_h_kda"])
@pytest.mark.parametrize("path", ["eager", "custom_op"])
def test_training_step_against_the_reference(name: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rec, x, cus, s0, do, dr = _case(name, True)
    pkg = dgps.compile(SPECS[name].read_text())
    if path == "custom_op":  # the torch.compile path's op, called eagerly
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    out = pkg.forward(**leaves, initial_state={n: s.clone() for n, s in s0.items()}, cu_seqlens=cus)
    ((out.o * do).sum() + (out.route * dr).sum()).backward()
    x64 = {n: t.double().requires_grad_(True) for n, t in x.items()}
    ref = rec.reference(**x64, initial_state={n: s.double() for n, s in s0.items()}, output_final_state=True,
                        cu_seqlens=cus)
    ((ref.o * do.double()).sum() + (ref.route * dr.double()).sum()).backward()
    assert _rel(out.o, ref.o) < 1e-4 and _rel(out.route, ref.route) < 1e-4
    for n, t in x64.items():
        assert _rel(leaves[n].grad, t.grad) < 1e-4, (n, _rel(leaves[n].grad, t.grad))


def test_an_in_place_change_to_the_route_is_refused() -> None:
    rec, x, cus, s0, do, dr = _case("cler_h_gdn", False)
    pkg = dgps.compile(SPECS["cler_h_gdn"].read_text())
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    out = pkg.forward(**leaves)
    loss = (out.o * do).sum()
    with torch.no_grad():
        out.route.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
