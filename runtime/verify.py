"""Differential verification of a compiled spec against the reference derived from the same spec.

Runs the forward kernels and the decode kernel on random inputs from `random_inputs` and compares
every output (o, each final state, the route) with the float64 reference by relative norm
‖kernel − ref‖ / ‖ref‖. Output buffers are never trusted: the kernels' wrappers allocate them, and a
NaN anywhere fails the check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from .api import Recurrence
from .reference import RecurrenceOutput, initial_states, reference, state_shapes
from .tensors import check_inputs

# Relative-norm tolerances by input dtype: fp32 arithmetic lands far under these; bf16 operands near 1e-3..1e-2.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 1e-2, torch.float64: 1e-10}


@dataclass(frozen=True)
class Row:
    path: str
    output: str
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance  # NaN compares False


def rel_error(x: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """‖x − ref‖ / ‖ref‖, or over ‖scale‖ where given (the magnitude of what a sum cancelled, elementwise ≥ |ref|)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    if x.shape != ref.shape:
        return float("inf")
    denom = (scale.detach().double().cpu() if scale is not None else ref).norm().item()
    num = (x - ref).norm().item()
    if denom == 0.0:
        return num
    return num / denom


def compare(path: str, got: RecurrenceOutput, ref: RecurrenceOutput, tol: float) -> list[Row]:
    rows = [Row(path, "o", rel_error(got.o, ref.o), tol)]
    if ref.final_state is not None:
        for name, r in ref.final_state.items():
            g = (got.final_state or {}).get(name)
            rows.append(Row(path, f"state {name}", rel_error(g, r) if g is not None else float("inf"), tol))
    if ref.route is not None:
        rows.append(Row(path, "route", rel_error(got.route, ref.route) if got.route is not None else float("inf"), tol))
    return rows


def verify(rec: Recurrence, package: ModuleType, *, B: int = 2, T: int = 33, H: int = 2, dk: int = 32,
           dv: int = 32, HV: int | None = None, dtype: torch.dtype = torch.float32, seed: int = 0,
           varlen: bool = False, with_initial_state: bool = True, device: str = "cpu",
           progress: Callable[[str], None] = lambda _: None) -> list[Row]:
    """Run forward and decode against the float64 reference; one Row per compared output. `progress` is
    told what runs next (the CLI prints it: under the interpreter each step takes seconds)."""
    tol = TOLERANCE[dtype]
    inputs = rec.random_inputs(1 if varlen else B, T, H, dk, dv, HV, dtype=dtype, seed=seed, device=device)
    _, dims = check_inputs(rec.ir, inputs)
    cu = None
    if varlen:
        cuts = torch.randint(1, T, (2,), generator=torch.Generator().manual_seed(seed)).tolist() if T > 2 else []
        cu = torch.tensor(sorted({0, T, *cuts}), dtype=torch.int32)
    N = len(cu) - 1 if cu is not None else B
    init: dict[str, torch.Tensor] = {}
    if with_initial_state:
        gen = torch.Generator().manual_seed(seed + 1)
        shapes = state_shapes(rec.ir, dims, N)
        init["S"] = 0.1 * torch.randn(shapes["S"], generator=gen)
        if "A" in shapes:
            init["A"] = torch.rand(shapes["A"], generator=gen)
    # The reference runs in float64 on exactly the rounded inputs the kernels see.
    progress("float64 reference")
    ref = rec.reference(**{k: v.double().cpu() for k, v in inputs.items()}, initial_state=init or None,
                        output_final_state=True, cu_seqlens=cu)
    dev_init = {k: v.to(device) for k, v in init.items()}
    cu_dev = cu.to(device) if cu is not None else None
    progress(f"forward kernels ({package.METADATA['forward']})")
    got = package.forward(**inputs, initial_state=dict(dev_init) or None, output_final_state=True, cu_seqlens=cu_dev)
    rows = compare(f"forward ({package.METADATA['forward']})", got, ref, tol)
    if not varlen:  # decode: feed the sequence a few tokens at a time; the states update in place
        progress("decode kernel (recurrent, in place)")
        state = {k: v.float().contiguous() for k, v in initial_states(
            rec.ir, dims, N, dev_init or None, torch.float32, torch.device(device)).items()}
        outs, routes = [], []
        step = max(1, T // 4)
        for a in range(0, T, step):
            part = {k: (v[:, a:a + step] if not rec.ir.input(k).is_param else v) for k, v in inputs.items()}
            out = package.decode(**part, state=state)
            outs.append(out.o)
            if out.route is not None:
                routes.append(out.route)
        dec = RecurrenceOutput(torch.cat(outs, 1), state, torch.cat(routes, 1) if routes else None)
        rows += compare("decode (recurrent, in place)", dec, ref, tol)
    return rows


def format_rows(rows: list[Row]) -> str:
    w = max(len(r.path) for r in rows)
    lines = [f"{'path':<{w}}  {'output':<10} {'rel error':>10} {'tolerance':>10}  result"]
    for r in rows:
        lines.append(f"{r.path:<{w}}  {r.output:<10} {r.error:>10.3e} {r.tolerance:>10.1e}  {'ok' if r.ok else 'FAIL'}")
    return "\n".join(lines)


def verify_gradients(rec: Recurrence, package: ModuleType, *, B: int = 2, T: int = 20, H: int = 1, dk: int = 16,
                     dv: int = 16, HV: int | None = None, seed: int = 0, device: str = "cpu",
                     progress: Callable[[str], None] = lambda _: None) -> list[Row]:
    """Gradients of a random linear loss on o, the final states and the route, through the package's
    autograd (the generated chunked or recurrent backward kernels), against float64 autograd through the reference."""
    progress(f"backward kernels ({package.METADATA.get('backward', 'recurrent')}) and float64 autograd")
    inputs = rec.random_inputs(B, T, H, dk, dv, HV, dtype=torch.float32, seed=seed, device=device)
    _, dims = check_inputs(rec.ir, inputs)
    gen = torch.Generator().manual_seed(seed + 7)
    init = {"S": 0.1 * torch.randn(state_shapes(rec.ir, dims, B)["S"], generator=gen)}
    xs = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
    s0 = init["S"].clone().to(device).requires_grad_(True)
    got = package.forward(**xs, initial_state={"S": s0}, output_final_state=True)
    xr = {k: v.detach().double().cpu().requires_grad_(True) for k, v in inputs.items()}
    r0 = init["S"].double().requires_grad_(True)  # a new leaf: .double() copies the float32 tensor
    # each token's share of a param's gradient (build_env's probes): a param's gradient is a sum over every token,
    # whose shares can cancel to a small total; its error is measured against the size of the shares
    width = {"key": dims.dk, "value": dims.dv, None: 1}
    probes = {d.name: torch.zeros(B, T, dims.HV, width[d.vector], dtype=torch.float64, requires_grad=True)
              for d in rec.ir.inputs if d.is_param}
    ref = reference(rec.ir, xr, initial_state={"S": r0}, output_final_state=True, param_probes=probes)
    weights = [torch.randn(ref.o.shape, generator=gen, dtype=torch.float64),
               torch.randn(ref.final_state["S"].shape, generator=gen, dtype=torch.float64)]
    outs_g, outs_r = [got.o, got.final_state["S"]], [ref.o, ref.final_state["S"]]
    if ref.route is not None:
        weights.append(torch.randn(ref.route.shape, generator=gen, dtype=torch.float64))
        outs_g.append(got.route)
        outs_r.append(ref.route)
    torch.autograd.backward(outs_g, [w.to(device=device, dtype=o.dtype) for w, o in zip(weights, outs_g, strict=True)])
    torch.autograd.backward(outs_r, weights)
    def grad(t: torch.Tensor) -> torch.Tensor:
        # No .grad means the loss does not depend on t: e.g. `x - x` in a gate, which sympy folds to 0.
        return t.grad if t.grad is not None else torch.zeros_like(t)

    path = f"backward ({package.METADATA.get('backward', 'recurrent')})"
    rows = []
    for name in xs:
        if name in probes:  # ‖kernel − ref‖ over Σ_tokens |share| (≥ ‖ref‖; equal where the shares do not cancel)
            shares = grad(probes[name]).abs().sum((0, 1))
            d = rec.ir.input(name)
            if d.heads == "key":  # the value heads of a key head's group share its param
                shares = shares.reshape(dims.H, dims.G, -1).sum(1)
            err = rel_error(grad(xs[name]), grad(xr[name]), scale=shares.reshape(xr[name].shape))
            rows.append(Row(path, f"d{name}", err, 1e-4))
        else:
            rows.append(Row(path, f"d{name}", rel_error(grad(xs[name]), grad(xr[name])), 1e-4))
    rows.append(Row(path, "d state S", rel_error(grad(s0), grad(r0)), 1e-4))
    return rows
