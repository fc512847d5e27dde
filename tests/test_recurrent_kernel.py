"""The generated recurrent (token-by-token / decode) Triton kernel against the float64 reference.

Every spec in specs/ is rendered by codegen/recurrent.py, loaded, and run (under TRITON_INTERPRET=1 on
a machine without a GPU; see conftest.py) on small shapes. Every output — o, each final state, the
route output — must match the reference derived from the same spec, computed in float64 on the very
same (rounded) inputs: relative norm ‖kernel − ref‖ / ‖ref‖ ≤ 1e-5 for fp32 inputs, ≤ 1e-2 for bf16.
Output buffers start as NaN (DEBUG_NAN_FILL), so an element the kernel never writes fails the test.

The interpreter is slow (~5-10 ms of CPU per program per token), so the shapes are tiny and the feature
matrix is spread over the specs: each spec runs a plain case (B=2, T=7, H=2, default launch) and a
GVA (HV=2H) / every-initial-state / two-dv-blocks case; a rotating third case adds packed varlen
(cu_seqlens), T=1, T=33, or dk, dv that are not powers of two (the statistic-carrying and untied specs
get varlen too). Decode steps T=1 with inplace=True through a sequence for every spec (a third of them
as a packed batch of one token per sequence). Four inline specs cover paths no library spec takes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import dgps
from dgps.codegen.recurrent import RecurrentCodegenError, render_recurrent
from dgps.runtime.compile import load_recurrent
from dgps.runtime.reference import state_shapes
from dgps.runtime.tensors import Dims, TensorError

SPECS = sorted((Path(__file__).resolve().parent.parent / "specs").glob("*.dgps"))
IDS = [p.stem for p in SPECS]


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double(), ref.detach().double()
    assert got.shape == ref.shape, f"shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), "NaN in the kernel's output (an element never written?)"
    den = ref.norm().item()
    num = (got - ref).norm().item()
    return num / den if den > 0 else num


@pytest.fixture(scope="module")
def rec():
    cache: dict[str, dgps.Recurrence] = {}

    def get(path: Path) -> dgps.Recurrence:
        if path.stem not in cache:
            cache[path.stem] = dgps.load(path)
        return cache[path.stem]
    return get


def kernel(r: dgps.Recurrence):
    m = load_recurrent(r.ir)
    m.DEBUG_NAN_FILL = True
    return m


def random_states(r: dgps.Recurrence, dims: Dims, N: int, seed: int) -> dict[str, torch.Tensor]:
    """Valid, nonzero initial states (fp32): S, A > 0, P an inverse Gram, C/m/n from a few unit keys."""
    gen = torch.Generator().manual_seed(seed)
    shapes = state_shapes(r.ir, dims, N)
    out = {"S": 0.1 * torch.randn(shapes["S"], generator=gen, dtype=torch.float64)}
    if "A" in shapes:
        out["A"] = torch.rand(shapes["A"], generator=gen, dtype=torch.float64) + 0.1
    if "P" in shapes:
        lam = r.ir.precond.lam
        keys = torch.nn.functional.normalize(torch.randn(*shapes["P"][:2], 3, dims.dk, generator=gen,
                                                         dtype=torch.float64), dim=-1)
        gram = lam * torch.eye(dims.dk, dtype=torch.float64) + keys.transpose(-1, -2) @ keys
        out["P"] = torch.linalg.inv(gram)
    if "C" in shapes:
        keys = torch.nn.functional.normalize(torch.randn(*shapes["m"], 3, generator=gen, dtype=torch.float64)
                                             .transpose(-1, -2), dim=-1)  # [N, H, 3, dk]
        out["C"] = keys.transpose(-1, -2) @ keys
        out["m"] = keys.sum(-2)
        out["n"] = torch.full(shapes["n"], 3.0, dtype=torch.float64)
    return {k: v.float().contiguous() for k, v in out.items()}


def check(got, ref, tol: float, what: str) -> dict[str, float]:
    errs = {"o": rel(got.o, ref.o)}
    if ref.final_state is not None:
        assert got.final_state is not None and set(got.final_state) == set(ref.final_state)
        for name, r in ref.final_state.items():
            errs[name] = rel(got.final_state[name], r)
    if ref.route is not None:
        assert got.route is not None
        errs["route"] = rel(got.route, ref.route)
    else:
        assert got.route is None
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"{what}: relative error above {tol:g}: {bad} (all: {errs})"
    return errs


def run_case(r, *, B, T, H, HV, dk, dv, init, cu=None, block_v=None, dtype=torch.float32, seed=0, tol=1e-5):
    m = kernel(r)
    x = r.random_inputs(B, T, H, dk, dv, HV, dtype=dtype, seed=seed)
    cu_t = torch.tensor(cu, dtype=torch.int32) if cu is not None else None
    N = len(cu) - 1 if cu is not None else B
    h0 = random_states(r, Dims(B, T, H, HV, dk, dv), N, seed + 1) if init else None
    ref = r.reference(**{k: v.double() for k, v in x.items()}, output_final_state=True, cu_seqlens=cu_t,
                      initial_state={k: v.double() for k, v in h0.items()} if h0 else None)
    h0_before = {k: v.clone() for k, v in h0.items()} if h0 else None
    got = m.recurrent_forward(x, output_final_state=True, cu_seqlens=cu_t, initial_state=h0, block_v=block_v)
    assert got.o.dtype == x["q"].dtype
    if h0:  # not inplace: the initial states are left alone
        assert all(torch.equal(h0[k], h0_before[k]) for k in h0)
    return check(got, ref, tol, r.name)


# --- forward: every spec, fp32 ----------------------------------------------------------------------
@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_forward_plain(rec, path):
    run_case(rec(path), B=2, T=7, H=2, HV=2, dk=16, dv=16, init=False)


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_forward_gva_initial_state_split_dv(rec, path):
    # HV = 2H (grouped value heads), two BV blocks per head, every state given
    run_case(rec(path), B=1, T=4, H=2, HV=4, dk=16, dv=16, block_v=8, init=True, seed=3)


ROTATING = [
    ("varlen", dict(B=1, T=14, H=1, HV=2, dk=16, dv=16, init=True, cu=[0, 1, 6, 14])),
    ("T1", dict(B=2, T=1, H=2, HV=2, dk=32, dv=32, init=True)),
    ("T33", dict(B=1, T=33, H=1, HV=1, dk=16, dv=16, init=True)),
    ("padded", dict(B=1, T=5, H=2, HV=2, dk=12, dv=20, init=True, block_v=8)),  # BK=16 > dk, 3 BV blocks
]
ROT_CASES = [(p, *ROTATING[i % len(ROTATING)]) for i, p in enumerate(SPECS)]
# the statistic-carrying and untied specs get varlen as well, whatever their rotation slot
ROT_CASES += [(p, *ROTATING[0]) for i, p in enumerate(SPECS)
              if p.stem in {"pgdn", "exact_atk", "ccq_gdn", "rwkv7_dplr", "cler_h_kda"} and i % len(ROTATING) != 0]


@pytest.mark.parametrize("path,case,kw", ROT_CASES, ids=[f"{p.stem}-{c}" for p, c, _ in ROT_CASES])
def test_forward_rotating(rec, path, case, kw):
    run_case(rec(path), seed=7, **kw)


BF16 = ["gdn", "kda", "gla", "pgdn", "rwkv7_dplr", "ccq_gdn", "exact_atq", "cler_h_gdn", "gdn2", "retnet"]


@pytest.mark.parametrize("name", BF16)
def test_forward_bf16(rec, name):
    r = rec(next(p for p in SPECS if p.stem == name))
    run_case(r, B=1, T=7, H=2, HV=4, dk=16, dv=16, init=True, dtype=torch.bfloat16, seed=11, tol=1e-2)


# Paths no library spec takes: a diag preconditioner on the query with a per-value-head statistic and a
# key-channel param decay; a const decay with a value-channel gain, the curvature read and the value route;
# an untied DPLR whose erase reads the decayed state; the exact preconditioner with a gain and the residual.
FEATURE_SPECS = {
    "atq_diag_value_heads": """
recurrence atq_diag_value_heads
  input q, k : key
  input v : value
  input gP : token log_gate
  input betaP : token unit
  param mu : head = -0.2
  param gk : key_channel log_gate
  normalize q, k
  decay vector(gk)
  precond diag(k * k, decay = gP, gain = betaP) -> exp(-log(1.5) * softsign(log(A + 1e-6) - mu)) on query
  solve additive
end
""",
    "const_value_gain_ccq": """
recurrence const_value_gain_ccq
  input q, k : key
  input v : value
  input wv : value_channel unit
  input lam : token unit
  normalize q, k
  decay const(0.95)
  gain value = wv
  solve additive
  read curvature(lam, centered)
  route value
end
""",
    "dplr_decayed_read": """
recurrence dplr_decayed_read
  input q, k : key
  input v : value
  input g : token log_gate
  input a, b : key_channel
  input bv : value_channel unit
  let ah = a / sqrt(a * a + 1e-6)
  decay scalar(g)
  gain value = bv
  solve dplr(e = -ah, f = ah * sigmoid(b), reads = decayed)
end
""",
    "exact_gain_residual": """
recurrence exact_gain_residual
  input q, k : key
  input v : value
  input beta : token unit
  precond exact(lambda = 0.5) on write_key
  gain beta
  solve delta
  route residual
end
""",
}


@pytest.mark.parametrize("name", sorted(FEATURE_SPECS))
def test_forward_feature_specs(name):
    r = dgps.load(FEATURE_SPECS[name], filename=f"{name}.dgps")
    run_case(r, B=1, T=4, H=2, HV=4, dk=12, dv=20, block_v=8, init=True, seed=1)
    run_case(r, B=1, T=9, H=1, HV=2, dk=16, dv=16, init=True, cu=[0, 4, 9], seed=2)


# --- decode: T = 1 steps, states updated in place ---------------------------------------------------
def _step(r, x: dict[str, torch.Tensor], t: int, packed: bool) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in x.items():
        if r.ir.input(k).is_param:
            out[k] = v
        elif packed:  # [B, T, ...] -> one token of each sequence, packed: [1, B, ...]
            out[k] = v[:, t].unsqueeze(0)
        else:
            out[k] = v[:, t:t + 1]
    return out


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_decode_inplace_steps(rec, path):
    r = rec(path)
    m = kernel(r)
    i = SPECS.index(path)
    packed = i % 3 == 0  # a third of the specs decode a packed batch: cu_seqlens = [0, 1, ..., B]
    B, T, H, HV, dk, dv = 2, 3, 1, 2, 16, 16
    x = r.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=5)
    state = random_states(r, Dims(B, T, H, HV, dk, dv), B, seed=6)
    ref = r.reference(**{k: v.double() for k, v in x.items()}, output_final_state=True,
                      initial_state={k: v.double() for k, v in state.items()})
    ptrs = {k: v.data_ptr() for k, v in state.items()}
    cu = torch.arange(B + 1, dtype=torch.int32) if packed else None
    outs, routes = [], []
    for t in range(T):
        got = m.recurrent_forward(_step(r, x, t, packed), initial_state=state, inplace=True, cu_seqlens=cu,
                                  block_v=8)  # two BV blocks: shared statistics must not race
        assert got.final_state is None  # not asked for; the states were updated in place
        o = got.o.reshape(B, 1, HV, dv)
        outs.append(o)
        if got.route is not None:
            routes.append(got.route.reshape(B, 1, HV, dv))
    assert {k: v.data_ptr() for k, v in state.items()} == ptrs, "inplace must not replace the state tensors"
    dec = dgps.RecurrenceOutput(torch.cat(outs, 1), state, torch.cat(routes, 1) if routes else None)
    check(dec, ref, 1e-5, f"{r.name} decode")


def test_decode_returns_the_updated_states(rec):
    r = rec(next(p for p in SPECS if p.stem == "pgdn"))
    m = kernel(r)
    x = r.random_inputs(1, 1, 1, 16, 16, dtype=torch.float32)
    state = {"S": torch.zeros(1, 1, 16, 16)}
    got = m.recurrent_forward(x, initial_state=state, inplace=True, output_final_state=True)
    assert got.final_state["S"] is state["S"]  # the caller's tensor, updated
    assert set(got.final_state) == {"S", "A"}  # A was absent: created, and returned
    assert state["S"].abs().sum() > 0


# --- rendering ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_render_is_deterministic_fast_and_carries_the_ir(rec, path):
    r = rec(path)
    t0 = time.perf_counter()
    a = render_recurrent(r.ir)
    elapsed = time.perf_counter() - t0
    b = render_recurrent(dgps.load(path).ir)  # a fresh IR (new sympy objects) gives the same bytes
    assert a == b
    assert elapsed < 1.0, f"rendering {r.name} took {elapsed:.2f}s"
    compile(a, f"<recurrent {r.name}>", "exec")
    m = load_recurrent(r.ir)
    assert m.IR == r.ir and m.IR.structure == r.ir.structure
    assert m.STATE_NAMES == r.ir.state_names
    assert f"def {r.name}_recurrent_fwd_kernel(" in a


_SUBPROCESS = """
import hashlib, sys
import dgps
from dgps.codegen.recurrent import render_recurrent
h = hashlib.sha256()
for p in sys.argv[1:]:
    h.update(render_recurrent(dgps.load(p).ir).encode())
print(h.hexdigest())
"""


def test_render_is_identical_across_processes():
    """No hash-seed dependence (sympy's sets, common-subexpression order): a fresh interpreter agrees.
    (That the kernels compile for Hopper is tests/test_aot.py's job.)"""
    import hashlib
    import os
    import subprocess
    import sys

    here = hashlib.sha256()
    for p in SPECS:
        here.update(render_recurrent(dgps.load(p).ir).encode())
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS, *map(str, SPECS)], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == here.hexdigest()


# --- bad input ---------------------------------------------------------------------------------------
def test_errors_are_clear(rec):
    r = rec(next(p for p in SPECS if p.stem == "exact_atk"))
    m = kernel(r)
    with pytest.raises(TensorError, match="dk <= 128"):
        m.recurrent_forward(r.random_inputs(1, 2, 1, 256, 16, dtype=torch.float32))
    with pytest.raises(TensorError, match="dk <= 256"):
        m.recurrent_forward(r.random_inputs(1, 2, 1, 512, 16, dtype=torch.float32))
    x = r.random_inputs(1, 2, 1, 16, 16, dtype=torch.float32)
    with pytest.raises(TensorError, match="not contiguous"):
        m.recurrent_forward(x, initial_state={"S": torch.zeros(1, 1, 16, 32)[..., :16]}, inplace=True)
    with pytest.raises(TensorError, match="shape"):
        m.recurrent_forward(x, initial_state={"S": torch.zeros(1, 1, 16, 8)})
    with pytest.raises(TensorError, match="cu_seqlens"):
        m.recurrent_forward(x, cu_seqlens=torch.tensor([0, 1]))
    with pytest.raises(TensorError, match="floating"):
        m.recurrent_forward({**x, "v": x["v"].to(torch.int32)})


def test_unsupported_ir_is_refused(rec):
    import dataclasses

    r = rec(next(p for p in SPECS if p.stem == "gdn"))
    bad = dataclasses.replace(r.ir, route="teleport")
    with pytest.raises(RecurrentCodegenError, match="route"):
        render_recurrent(bad)
