"""Channel reductions in the spec language (`sum`, `l2norm`): checker facts, the float64 reference, the explicit
adjoints the recurrent backward uses, the library systems built on them (RWKV-7's unit removal key, Longhorn's
gain) and the plan's account of why such specs run the recurrent kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch

import dgps
from dgps.codegen.chunk import supports_chunk
from dgps.compiler.ir import Reduction
from dgps.dsl.errors import NotLogDomain
from dgps.runtime.compile import compile as compile_spec
from dgps.runtime.reductions import derived_input_grads, reduce_channels, reduction_adjoint
from dgps.runtime.reference import build_env
from dgps.runtime.tensors import check_inputs
from dgps.runtime.verify import format_rows, verify, verify_gradients

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"

# A spec that reads every kind of reduction: nested (sum of an l2norm), over key and value channels, over a
# normalised key, a key-head input and a per-head param, inside a decay, a gain and a vector gain.
EVERYTHING = (Path(__file__).resolve().parent / "reductions_everything.dgps").read_text()


def test_ir_binds_each_reduction_once_in_dependence_order() -> None:
    ir = dgps.load(EVERYTHING).ir
    assert [(r.name, r.op, r.side) for r in ir.reductions] == [
        ("l2norm_0", "l2norm", "key"), ("sum_0", "sum", "key"), ("sum_1", "sum", "key"),
        ("l2norm_1", "l2norm", "value")]
    assert ir.reductions[3].eps == 0.01 and ir.reductions[0].eps == 1e-6
    assert "l2norm_0" in {s.name for s in ir.reductions[1].arg.free_symbols}


# Two reductions whose arguments simplify to the same expression on different sides: the key gain's l2norm and the
# value gain's are both l2norm(0). The fuzzer drew this; one reduction (a key-channel vector) stood for both, and the
# value gain v' = v · sigmoid(l2norm_0) mixed key and value channels (the recurrent codegen refused it).
SAME_ARGUMENT_TWO_SIDES = """recurrence same_argument_two_sides
  input q, k : key
  input v : value
  param pk : key_channel free
  param pv : value_channel free
  normalize q, k
  gain key = sigmoid(l2norm(2 * (pk - pk), 0.01)), value = sigmoid(l2norm(2 * (pv - pv), 0.01))
  solve erase_write
end
"""


def test_a_reduction_per_side_for_the_same_argument() -> None:
    rec = dgps.load(SAME_ARGUMENT_TWO_SIDES)
    assert sorted((r.op, str(r.arg), r.side) for r in rec.ir.reductions) == [("l2norm", "0", "key"),
                                                                               ("l2norm", "0", "value")]
    package = compile_spec(rec)
    # dk != dv, so a key-channel vector in the value gain would not broadcast; forward, decode and the gradients
    rows = verify(rec, package, B=1, T=20, H=2, dk=8, dv=12) + verify_gradients(rec, package, B=1, T=20, H=2, dk=8,
                                                                                 dv=12)
    assert rows and all(r.ok for r in rows), format_rows(rows)


def test_signs_follow_the_argument() -> None:
    base = "recurrence s\n input q, k : key\n input v : value\n decay scalar({})\n solve additive\nend\n"
    dgps.load(base.format("-sum(k * k)"))  # a sum of squares is >= 0
    dgps.load(base.format("-0.5 * sum(l2norm(exp(k)))"))  # l2norm keeps each channel's sign
    with pytest.raises(NotLogDomain):
        dgps.load(base.format("-sum(k)"))


def test_an_unused_let_reduction_is_not_computed() -> None:
    text = "recurrence s\n input q, k : key\n input v : value\n let unused = sum(q * q)\n solve additive\nend\n"
    assert dgps.load(text).ir.reductions == ()
    used = text.replace("solve additive", "gain 1 / (1 + unused)\n solve additive")
    assert [r.op for r in dgps.load(used).ir.reductions] == ["sum"]


def test_reference_matches_explicit_reductions() -> None:
    """The reference's environment holds Σ and x/√(Σx² + eps) of exactly the argument, per token and head."""
    rec = dgps.load(EVERYTHING)
    x = rec.random_inputs(2, 5, 2, 8, 6, HV=4, dtype=torch.float64, seed=3)
    xs, dims = check_inputs(rec.ir, x)
    env = build_env(rec.ir, xs, dims, torch.float64)
    k = torch.nn.functional.normalize(xs["k"], dim=-1, eps=0.0).repeat_interleave(2, dim=2)
    k = k * torch.rsqrt(1 + 1e-6 / (xs["k"].repeat_interleave(2, dim=2) ** 2).sum(-1, keepdim=True))
    u = xs["u"].repeat_interleave(2, dim=2)
    torch.testing.assert_close(env["sum_1"], (k * k + u.abs()).sum(-1, keepdim=True), rtol=1e-14, atol=0)
    kp = k * xs["p"]
    torch.testing.assert_close(env["l2norm_0"], kp / ((kp * kp).sum(-1, keepdim=True) + 1e-6).sqrt(),
                               rtol=1e-14, atol=0)
    wv = xs["w"] * xs["v"]
    torch.testing.assert_close(env["l2norm_1"], wv / ((wv * wv).sum(-1, keepdim=True) + 0.01).sqrt(),
                               rtol=1e-14, atol=0)


@pytest.mark.parametrize("op", ["sum", "l2norm"])
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_adjoint_equals_autograd(op: str, eps: float) -> None:
    """The explicit adjoint (dx = dy for Σ; (dy − y (y·dy)) / √(|x|² + eps) for l2norm) is the exact vector-
    Jacobian product: it agrees with float64 autograd to rounding, for small and large eps."""
    gen = torch.Generator().manual_seed(0)
    r = Reduction("r", op, sympy.Integer(0), "key", eps)
    x = (0.3 * torch.randn(3, 7, 2, 16, generator=gen, dtype=torch.float64)).requires_grad_(True)
    y = reduce_channels(r, x)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    (want,) = torch.autograd.grad(y, x, dy)
    got = reduction_adjoint(r, x.detach(), dy)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_input_gradients_through_reductions_equal_autograd() -> None:
    """derived_input_grads (the backward's host step, no autograd) against float64 autograd through the
    reference's own evaluation of the same reductions, for every input and param they read."""
    rec = dgps.load(EVERYTHING)
    x = rec.random_inputs(2, 4, 2, 8, 6, HV=4, dtype=torch.float64, seed=5)
    xs, dims = check_inputs(rec.ir, x)
    leaves = {n: t.clone().requires_grad_(True) for n, t in xs.items()}
    env = build_env(rec.ir, leaves, dims, torch.float64)
    gen = torch.Generator().manual_seed(9)
    shapes = {r.name: ((2, 4, 4) if r.op == "sum" else (2, 4, 4, {"key": 8, "value": 6}[r.side]))
              for r in rec.ir.reductions}
    d_derived = {n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in shapes.items()}
    loss = sum((env[n].expand(2, 4, 4, -1).reshape(s) * d_derived[n]).sum() for n, s in shapes.items())
    names = list(leaves)
    want = dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True), strict=True))
    got = derived_input_grads(rec.ir, {n: t.float() for n, t in xs.items()}, dims,
                              {n: t.float() for n, t in d_derived.items()})
    assert set(got) == {n for n, g in want.items() if g is not None} == {"q", "k", "v", "w", "u", "p"} - {"q"}
    for n, g in got.items():
        torch.testing.assert_close(g.double(), want[n], rtol=1e-4, atol=1e-5)


def test_chunk_path_takes_reductions_as_derived_inputs() -> None:
    """The chunk module of a spec with reductions declares the kernels' derived inputs apart from the spec's
    (check_inputs sees only the spec's); tests/test_chunk_backward.py checks its gradients."""
    from dgps.codegen.chunk import render_chunk

    for ir in (dgps.load(EVERYTHING).ir, dgps.load(SPECS / "longhorn.dgps").ir):
        assert supports_chunk(ir) == (True, "")
        src = render_chunk(ir)
        assert "x.update(derived_inputs(IR, x, dims))" in src and "derived_input_grads(IR" in src
        for r in ir.reductions:
            assert f"TensorDecl(name='{r.name}'" in src.split("derived = (")[1].split(")\n")[0]


def _max_state(text: str, T: int, seed: int = 0) -> float:
    """The largest |S| entry over a long random sequence, fp32 reference (state checkpointed every 25 tokens)."""
    rec = dgps.load(text)
    x = rec.random_inputs(1, T, 2, 32, 32, dtype=torch.float32, seed=seed)
    state, peak = None, 0.0
    for a in range(0, T, 25):
        part = {n: (t[:, a:a + 25] if not rec.ir.input(n).is_param else t) for n, t in x.items()}
        out = rec.reference(**part, initial_state=state, output_final_state=True)
        state = out.final_state
        peak = max(peak, state["S"].abs().max().item())
        if not torch.isfinite(state["S"]).all():
            return float("inf")
    return peak


def test_rwkv7_state_stays_bounded_over_long_inputs() -> None:
    """With the unit removal key the transition Diag(exp w) − κ̂(κ̂ ⊙ ι)ᵀ does not expand the state: over 400
    random tokens it stays O(1). The elementwise key this spec used to have (κ/√(κ² + 1e-6), ‖κ̂‖² ≈ dk)
    blows up on the same inputs: the check can tell the two apart."""
    text = (SPECS / "rwkv7_dplr.dgps").read_text()
    assert _max_state(text, 400) < 50.0
    elementwise = text.replace("l2norm(kappa)", "kappa / sqrt(kappa * kappa + 1e-6)")
    assert elementwise != text
    assert _max_state(elementwise, 400) > 1e6


def test_longhorn_state_stays_bounded_over_long_inputs() -> None:
    assert _max_state((SPECS / "longhorn.dgps").read_text(), 400) < 50.0


def test_show_plan_says_the_package_runs_the_recurrent_kernels() -> None:
    # every spec in specs/ is chunked; an untied DPLR with a scalar decay is not
    path = Path(__file__).resolve().parent / "dplr_scalar_decay.dgps"
    out = subprocess.run([sys.executable, "-m", "dgps.cli", "show", str(path), "--stage", "plan"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    first = out.splitlines()[0]
    assert first.startswith("dplr_scalar_decay: the package runs the recurrent kernels"), first
    why = supports_chunk(dgps.load(path).ir)[1]
    assert why and why in first


@pytest.mark.parametrize("spec", ["gdn", "longhorn", "rwkv7_dplr", "exact_atq", "exact_atk"])
def test_show_plan_of_a_chunked_spec_is_the_chunk_plan(spec: str) -> None:
    out = subprocess.run([sys.executable, "-m", "dgps.cli", "show", str(SPECS / f"{spec}.dgps"), "--stage", "plan"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "recurrent kernels" not in out.splitlines()[0]


# The fuzzer drew this (seed 701): a PDN gain σ(tanh(Σ_c σ(p_c) / 4)) over 64 key channels, where tanh(≈ 8) rounds to
# 1 − 2^-23-ish in fp32 and the derivative 1 − tanh² printed into the kernels kept ~1 of its bits; dp came out 25 % off.
# tanh′ = 4σ(2x)σ(−2x) and σ′ = σ(x)σ(−x) keep the derivative's e^{−|x|} size.
SATURATED_GAIN = """recurrence saturated_gain
  input q, k : key
  input v : value
  input gPk : token log_gate key_head
  param pk0 : key_channel free
  let gain = sigmoid(tanh(0.25 * sum(sigmoid(pk0))))
  precond diag(k * k, decay = gPk, gain = gain) -> exp(-log(2) * softsign(log(A + 1e-6))) on write_key
  solve delta
end
"""


# float64 values of the derivatives in forms that do not round to 0 where the function saturates (torch's own backward,
# σ(1 − σ) and 1 − tanh², loses them in float64 too past |x| ≈ 37 and 19)
_STABLE_DERIVATIVE = {
    "sigmoid": lambda t: torch.sigmoid(t) * torch.sigmoid(-t),
    "tanh": lambda t: 4 * torch.sigmoid(2 * t) * torch.sigmoid(-2 * t),
    "silu": lambda t: torch.sigmoid(t) * (1 + t * torch.sigmoid(-t)),
}


@pytest.mark.parametrize("fn", sorted(_STABLE_DERIVATIVE))
def test_derivatives_keep_their_size_where_the_function_saturates(fn: str) -> None:
    """The derivative tree the kernels print, evaluated in fp32 where the function rounds to its bound (and near 0),
    against the float64 derivative."""
    from dgps.compiler.exprs import FUNCTIONS
    from dgps.runtime.evaluate import evaluate

    x = sympy.Symbol("x", real=True)
    tree = sympy.diff(FUNCTIONS[fn][1](x), x)
    pts = torch.tensor([-40.0, -20.0, -9.5, -0.3, 0.3, 9.5, 20.0, 40.0], dtype=torch.float64)
    want = _STABLE_DERIVATIVE[fn](pts)
    got = evaluate(tree, {"x": pts.float()})
    rel = ((got.double() - want).abs() / want.abs()).max().item()
    assert rel < 1e-5, f"{fn}': {rel:.2e} relative error in fp32"


def test_a_saturated_reduction_gain_keeps_its_gradient() -> None:
    rec = dgps.load(SATURATED_GAIN)
    package = compile_spec(rec)
    assert package.METADATA["backward"] == "chunk"
    rows = verify_gradients(rec, package, B=1, T=70, H=1, dk=64, dv=20, seed=202)
    assert all(r.ok for r in rows), format_rows(rows)
