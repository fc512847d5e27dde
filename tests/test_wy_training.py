"""The WY form inside a training forward's fused state pass + output (compiler/plan.py WY_IN_TRAINING_STATE_PASS: off
in the shipped plan, run 129 measured it slower; kept measurable through plan_experiment.py --patch wy_train). With it
on, under the interpreter: the training forward launches no wy kernel and its fused kernel stores W and Ũ, which the
backward's state passes read; o and every gradient match the float64 reference in every form a call can take (the
fused kernel, the unfused launches of few programs, keep_states, the backward's rerun with nothing kept, varlen); an
unfused inference call allocates the W and Ũ its wy launch writes (run 128 faulted there). And the launch grouping it
needed (codegen/chunk.py forward_launches) leaves the shipped plans' launches as they were."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
import dgps.compiler.plan as plan_mod  # noqa: E402
from dgps.codegen.buffers import token_buffers  # noqa: E402
from dgps.codegen.chunk import forward_launches, inference_forward_launches, rerun_launches, unfused_form  # noqa: E402
from dgps.codegen.launch import parse_launch_overrides  # noqa: E402
from dgps.compiler.plan import build_plan, wy_in_training_state_pass  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402
from dgps.runtime.reference import random_states  # noqa: E402
from dgps.runtime.tensors import Dims  # noqa: E402

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"


@pytest.fixture
def wy_train(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_mod, "WY_IN_TRAINING_STATE_PASS", True)


def _plan(name: str):  # noqa: ANN202
    return build_plan(dgps.load(SPEC_DIR / f"{name}.dgps").ir, 64, 16)


def _names(launches: list) -> list[str]:
    return [la.name for la in launches]


def test_off_in_the_shipped_plan() -> None:
    assert not plan_mod.WY_IN_TRAINING_STATE_PASS
    p = _plan("gdn")
    assert not wy_in_training_state_pass(p)
    assert _names(forward_launches(p)) == ["l2norm", "chunk_cumsum", "interaction", "wy", "state_output"]


# the shipped plans' forward launches, pinned: the grouping of a host with its guests must not change them (pgdn's
# second chunk_cumsum runs inside precond_diag's launch; kda's output has a launch of its own)
SHIPPED = {
    "gdn": ["l2norm", "chunk_cumsum", "interaction", "wy", "state_output"],
    "cler_h_gdn": ["l2norm", "chunk_cumsum", "interaction", "wy", "state_output"],
    "pgdn": ["l2norm", "chunk_cumsum", "precond_diag", "interaction", "wy", "state_pass", "output"],
    "kda": ["chunk_cumsum", "interaction", "state_pass", "output"],  # wy at the interaction's end (_wy_in_interaction)
    "simple_gla": ["chunk_cumsum", "state_output"],
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_launches(name: str) -> None:
    assert _names(forward_launches(_plan(name))) == SHIPPED[name]


@pytest.mark.parametrize("name", ["gdn", "deltanet", "ccq_gdn", "cler_h_gdn", "pgdn"])
def test_plan_and_launches(name: str, wy_train: None) -> None:
    p = _plan(name)
    shipped_fused = name in ("gdn", "deltanet", "ccq_gdn")  # where an inference call forms the WY form already
    assert wy_in_training_state_pass(p) == shipped_fused
    fwd = _names(forward_launches(p))
    assert ("wy" in fwd) != shipped_fused and ("state_output_wy" in fwd) == shipped_fused
    if not shipped_fused:
        return
    assert [la.kernel for la in forward_launches(p) if la.name == "state_output_wy"] == \
        ["chunk_state_output_wy_keep_kernel"]
    assert [la.kernel for la in inference_forward_launches(p) if la.name == "state_output_wy"] == \
        ["chunk_state_output_wy_kernel"]
    assert unfused_form(p) == {"state_output_wy": ["wy", "state_pass", "output"]}
    # the backward's reruns run each stage alone: with nothing kept, wy again before the state pass
    assert _names(rerun_launches(p, True)) == ["state_pass"]
    assert _names(rerun_launches(p, False))[-3:] == ["wy", "state_pass", "output"]
    # W and Ũ pass between the unfused launches of some calls: allocated by every call, not only kept ones
    bufs = {b.name: b for b in token_buffers(p)}
    assert not bufs["w_buf"].backward_only and not bufs["u_buf"].backward_only


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("name", ["gdn", "deltanet"])
@pytest.mark.parametrize("form", ["fused", "unfused", "keep_states", "no_kept", "varlen", "wide_keys"])
def test_gradients_against_the_reference(name: str, form: str, wy_train: None, launched: Callable,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    monkeypatch.setattr(mod, "FUSE_OUTPUT", form != "unfused")
    # wide_keys: dk = 4 BV with two value programs of BV = 16, so each stores two of W's key-column blocks
    B, T, H = (1, 150, 2) if form == "varlen" else (2, 90, 2)
    dk, dv = (64, 32) if form == "wide_keys" else (16, 16)
    if form == "wide_keys":
        monkeypatch.setattr(mod, "LAUNCH_OVERRIDES", {**mod.LAUNCH_OVERRIDES,
                                                       **parse_launch_overrides("state_output_wy=64,16,4,2")})
    x = rec.random_inputs(B, T, H, dk, dv, HV=H, dtype=torch.float32, seed=3)
    cu = torch.tensor([0, 37, 101, 150], dtype=torch.int32) if form == "varlen" else None
    N = 3 if cu is not None else B
    s0 = {n: s.float() for n, s in random_states(rec.ir, Dims(B, T, H, H, dk, dv), N, seed=3).items()}
    do = torch.randn(B, T, H, dv, generator=torch.Generator().manual_seed(4))
    out: list = []
    if form == "no_kept":
        fwd_names = launched(mod, lambda: out.append(mod.chunk_forward(x, initial_state=s0, output_final_state=True)))
        kept = None
    else:
        fwd_names = launched(mod, lambda: out.append(mod.chunk_forward_train(
            x, initial_state=s0, cu_seqlens=cu, keep_states=form == "keep_states")))
    fused = form not in ("unfused", "keep_states")
    if form == "no_kept":  # an inference call: its own fused kernel, which stores nothing
        assert "chunk_state_output_wy_kernel" in fwd_names and "chunk_wy_kernel" not in fwd_names
        fwd = out[0]
    else:
        fwd, kept = out[0]
        assert ("chunk_state_output_wy_keep_kernel" in fwd_names) == fused
        assert ("chunk_wy_kernel" in fwd_names) == (not fused)
    grads: list = []
    launched(mod, lambda: grads.append(mod.chunk_backward(x, initial_state=s0, do=do, kept=kept, cu_seqlens=cu)[0]))
    x64 = {n: t.double().requires_grad_(True) for n, t in x.items()}
    ref = rec.reference(**x64, initial_state={n: s.double() for n, s in s0.items()}, output_final_state=True,
                        cu_seqlens=cu)
    (ref.o * do.double()).sum().backward()
    assert _rel(fwd.o, ref.o) < 1e-4
    for n, t in x64.items():
        assert _rel(grads[0][n], t.grad) < 1e-4, (n, _rel(grads[0][n], t.grad))


def test_unfused_inference_call_allocates_w(wy_train: None, launched: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 128's fault: an inference call with few programs runs wy, state pass and output apart; wy writes W and Ũ,
    which must be real buffers of the call's size (the fused kernel's stores made them look backward-only)."""
    rec = dgps.load(SPEC_DIR / "gdn.dgps")
    mod = load_chunk(rec.ir)
    monkeypatch.setattr(mod, "FUSE_OUTPUT", False)
    x = rec.random_inputs(1, 70, 2, 16, 16, HV=2, dtype=torch.float32, seed=5)
    bufs: dict = {}
    out: list = []
    names = launched(mod, lambda: out.append(mod.chunk_forward(x)), bufs)
    assert names[-3:] == ["chunk_wy_kernel", "chunk_state_pass_kernel", "chunk_output_kernel"]
    assert bufs["w_buf"].numel() == 70 * 2 * 16 and bufs["u_buf"].numel() == 70 * 2 * 16
    ref = rec.reference(**{n: t.double() for n, t in x.items()})
    assert _rel(out[0].o, ref.o) < 1e-4
