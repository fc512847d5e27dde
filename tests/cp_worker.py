"""One rank of tests/test_context_parallel.py: a gloo group on the CPU, the kernels under Triton's interpreter.

    python tests/cp_worker.py RANK WORLD PORT OUT_DIR CASE [CASE ...]     CASE = spec:LAYOUT:h0|zero
    LAYOUT = rows | packed | packed_b | packed_c (the global offsets below); with the suffix _zz, the same tokens in
    FLA's zigzag slices (2W equal parts, rank r holding parts r and 2W - 1 - r: cp_layout="zigzag")

For each case, rank 0 runs the unsharded call (forward and backward) and saves it; every rank then runs its
slice with cp_group and compares o, the route, the final states and every gradient (its slice's inputs; the
params' and initial states' summed over the ranks, as data-parallel training would) with the unsharded ones.
Writes OUT_DIR/rank{RANK}.json: {case: max relative error per tensor}, and OUT_DIR/counts_rank{RANK}.json: {case:
{"forward": {stage: launches}, "backward": {...}, "continued": bool, "later": bool}} of the CP call (recorded at the
chunk module's one launch point, `_Run.launch`, and launched as usual; continued: the slice's first segment continues
a sequence from the previous rank; later: the next rank continues this one's last).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402, F401 - TRITON_INTERPRET and the interpreter speed-up, before triton is imported
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dgps.runtime.api import random_inputs  # noqa: E402
from dgps.runtime.cp import slice_layout  # noqa: E402
from dgps.runtime.reference import random_states  # noqa: E402
from dgps.runtime.tensors import Dims  # noqa: E402

H, DK, DV = 2, 16, 16
# packed: the global offsets per world size; a sequence crosses every rank boundary of interest
PACKED = {2: (0, 20, 70, 96), 4: (0, 10, 80, 96)}  # 4 ranks: sequence 1 passes through ranks 1 and 2
# 4 ranks of 24 tokens. b: ranks 1 and 2 continue a sequence, start one inside and pass it on (a transition of width
# dv: M = 0, h0 of the last segment), rank 3 passes sequence 2 through to its end; c: rank 1 continues sequence 0 to
# its end at the boundary (nothing goes out), rank 2 continues nothing
OFFSETS = {"packed": PACKED, "packed_b": {4: (0, 30, 60, 96)}, "packed_c": {4: (0, 48, 96)}}
ROWS_B, ROWS_T = 2, 64


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def _tokens(rank: int, world: int, T: int, zigzag: bool) -> torch.Tensor:
    """The global token indices of a rank's slice: contiguous, or zigzag's parts rank and 2·world − 1 − rank."""
    if not zigzag:
        step = T // world
        return torch.arange(rank * step, (rank + 1) * step)
    P = T // (2 * world)
    back = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * P, (rank + 1) * P), torch.arange(back * P, (back + 1) * P)])


def _losses(out, dos: dict[str, torch.Tensor]) -> torch.Tensor:  # noqa: ANN001
    loss = (out.o * dos["o"]).sum()
    if out.route is not None:
        loss = loss + (out.route * dos["route"]).sum()
    for n, s in (out.final_state or {}).items():
        loss = loss + (s * dos["final_" + n]).sum()
    return loss


COUNTS: dict[str, dict[str, dict[str, int]]] = {}


class _Count:
    """Count the launches of `mod._Run.launch` per stage name, into the phase `self.phase`."""

    def __init__(self, mod) -> None:  # noqa: ANN001
        self.mod, self.phase, self.counts = mod, "forward", {"forward": {}, "backward": {}}

    def __enter__(self) -> _Count:
        self.orig = orig = self.mod._Run.launch
        count = self

        def launch(run, kernels):  # noqa: ANN001, ANN202
            for k in kernels:
                c = count.counts[count.phase]
                c[k[0]] = c.get(k[0], 0) + 1
            return orig(run, kernels)

        self.mod._Run.launch = launch
        return self

    def __exit__(self, *exc: object) -> None:
        self.mod._Run.launch = self.orig


def run_case(case: str, rank: int, world: int, out_dir: Path) -> dict[str, float]:
    spec, layout, h0_kind = case.split(":")
    zigzag = layout.endswith("_zz")
    layout = layout.removesuffix("_zz")
    pkg = importlib.import_module(f"dgps.generated.{spec}")
    ir = pkg.IR
    packed = layout.startswith("packed")
    offsets = OFFSETS[layout][world] if packed else None
    B, T = (1, offsets[-1]) if offsets else (ROWS_B, ROWS_T)
    cu = torch.tensor(offsets, dtype=torch.int32) if offsets else None
    N = len(offsets) - 1 if offsets else B
    x = random_inputs(ir, B, T, H, DK, DV, dtype=torch.float32, seed=11)
    for d in ir.inputs:  # weak decay: a slice's transition product M stays O(1), so an error in it shows
        if d.domain == "log_gate" and not d.is_param:
            x[d.name] = x[d.name] * 0.05
    params = {d.name for d in ir.inputs if d.is_param}
    dims = Dims(B, T, H, H, DK, DV)
    h0 = random_states(ir, dims, N, seed=5) if h0_kind == "h0" else {}
    gen = torch.Generator().manual_seed(3)
    dos = {"o": torch.randn(B, T, H, DV, generator=gen), "route": torch.randn(B, T, H, DV, generator=gen)}
    for n, s in random_states(ir, dims, N, seed=9).items():
        dos["final_" + n] = torch.randn(s.shape, generator=gen)
    ref_path = out_dir / f"{case.replace(':', '_')}.pt"
    if rank == 0:  # the unsharded call
        xs = {n: t.clone().requires_grad_() for n, t in x.items()}
        hs = {n: s.clone().requires_grad_() for n, s in h0.items()}
        out = pkg.forward(**xs, initial_state=hs or None, output_final_state=True, cu_seqlens=cu)
        _losses(out, dos).backward()
        torch.save({"o": out.o.detach(), "route": None if out.route is None else out.route.detach(),
                    "final": {n: s.detach() for n, s in out.final_state.items()},
                    "dx": {n: t.grad for n, t in xs.items()}, "dh": {n: s.grad for n, s in hs.items()}}, ref_path)
    dist.barrier()
    ref = torch.load(ref_path)
    step = T // world
    idx = _tokens(rank, world, T, zigzag)
    xs = {n: (t.clone() if n in params else t[:, idx].clone()).requires_grad_() for n, t in x.items()}
    hs = {n: s.clone().requires_grad_() for n, s in h0.items()}
    sl = {"o": dos["o"][:, idx], "route": dos["route"][:, idx], **{k: v for k, v in dos.items() if k.startswith("final_")}}
    with _Count(pkg.chunk) as count:
        out = pkg.forward(**xs, initial_state=hs or None, output_final_state=True, cu_seqlens=cu,
                          cp_group=dist.group.WORLD, cp_layout="zigzag" if zigzag else "contiguous")
        count.phase = "backward"
        _losses(out, sl).backward()
    # the slice's layout, for the expected counts: its first segment continues a sequence; the next rank continues
    # this rank's last one (else a pass of the backward has a zero adjoint and is skipped). A zigzag call runs the
    # contiguous slices (runtime/cp.py: relayout), so its counts are theirs
    lays = [slice_layout(offsets, B, r * step, (r + 1) * step, T) for r in range(world)]
    COUNTS[case] = {**count.counts, "continued": lays[rank].carry_in,
                    "later": rank + 1 < world and lays[rank + 1].carry_in}
    errs = {"o": _max_rel(out.o, ref["o"][:, idx])}
    if out.route is not None:
        errs["route"] = _max_rel(out.route, ref["route"][:, idx])
    for n, s in out.final_state.items():  # rows filled where each sequence ends: their sum is the unsharded state
        total = s.detach().clone()
        dist.all_reduce(total)
        errs["final_" + n] = _max_rel(total, ref["final"][n])
    for n, t in xs.items():
        g = t.grad if t.grad is not None else torch.zeros_like(t)
        if n in params:
            g = g.clone()
            dist.all_reduce(g)
            errs["d" + n] = _max_rel(g, ref["dx"][n])
        else:
            errs["d" + n] = _max_rel(g, ref["dx"][n][:, idx])
    for n, s in hs.items():
        g = s.grad.clone() if s.grad is not None else torch.zeros_like(s)
        dist.all_reduce(g)
        if ref["dh"][n] is not None and float(ref["dh"][n].abs().max()) > 0:
            errs["dh0_" + n] = _max_rel(g, ref["dh"][n])
    return errs


def run_fla_case(case: str, rank: int, world: int, out_dir: Path) -> dict[str, float]:
    """fla_compat with FLA's cp_context: a stand-in with build_cp_context's fields (contiguous layout), or (LAYOUT
    packed_zz) the zigzag context FLA's own get_cp_cu_seqlens builds for this rank."""
    from types import SimpleNamespace

    import dgps.fla_compat as fc
    from dgps.runtime.cp import slice_layout

    if case.split(":")[1] == "packed_zz":
        return _run_fla_zigzag(case, rank, world)
    fn = {"fla_gdn": fc.chunk_gated_delta_rule, "fla_kda": fc.chunk_kda}[case.split(":")[0]]
    T = PACKED[world][-1]
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, T, H, DK, generator=gen) for _ in range(2))
    v = torch.randn(1, T, H, DV, generator=gen)
    g = 0.05 * torch.nn.functional.logsigmoid(torch.randn(1, T, H, *((DK,) if "kda" in case else ()), generator=gen))
    beta = torch.rand(1, T, H, generator=gen)
    cu = torch.tensor(PACKED[world], dtype=torch.int32)
    xs = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
    o_full, _ = fn(*xs, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    do = torch.randn(o_full.shape, generator=gen)
    (o_full * do).sum().backward()
    step = T // world
    lo, hi = rank * step, (rank + 1) * step
    lay = slice_layout(PACKED[world], 1, lo, hi, T)
    local = torch.tensor(lay.local_cu, dtype=torch.int32)
    ctx = SimpleNamespace(group=dist.group.WORLD, cu_seqlens=local, cu_seqlens_cpu=local, layout="contiguous",
                          is_first_rank=not lay.carry_in, is_last_rank=lay.ends[-1])
    ys = [t[:, lo:hi].detach().clone().requires_grad_() for t in (q, k, v, g, beta)]
    o, _ = fn(*ys, use_qk_l2norm_in_kernel=True, cu_seqlens=local, cp_context=ctx)
    (o * do[:, lo:hi]).sum().backward()
    errs = {"o": _max_rel(o, o_full[:, lo:hi])}
    for n, x, y in zip("qkvgb", xs, ys, strict=True):
        errs["d" + n] = _max_rel(y.grad, x.grad[:, lo:hi])
    return errs


def _run_fla_zigzag(case: str, rank: int, world: int) -> dict[str, float]:
    """fla_compat's GDN / KDA with the zigzag cp_context of FLA's get_cp_cu_seqlens (fla-core, a test dependency),
    the slice in FLA's order (parts rank and 2W - 1 - rank), against the unsharded call."""
    from fla.ops.cp.context import get_cp_cu_seqlens

    import dgps.fla_compat as fc

    fn = {"fla_gdn": fc.chunk_gated_delta_rule, "fla_kda": fc.chunk_kda}[case.split(":")[0]]
    T = PACKED[world][-1]
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, T, H, DK, generator=gen) for _ in range(2))
    v = torch.randn(1, T, H, DV, generator=gen)
    g = 0.05 * torch.nn.functional.logsigmoid(torch.randn(1, T, H, *((DK,) if "kda" in case else ()), generator=gen))
    beta = torch.rand(1, T, H, generator=gen)
    cu = torch.tensor(PACKED[world], dtype=torch.int32)
    xs = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
    o_full, _ = fn(*xs, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    do = torch.randn(o_full.shape, generator=gen)
    (o_full * do).sum().backward()
    ctx = get_cp_cu_seqlens(cu.long(), world_size=world, rank=rank, layout="zigzag")
    ctx.group = dist.group.WORLD
    idx = _tokens(rank, world, T, True)
    ys = [t[:, idx].detach().clone().requires_grad_() for t in (q, k, v, g, beta)]
    o, _ = fn(*ys, use_qk_l2norm_in_kernel=True, cu_seqlens=ctx.cu_seqlens, cp_context=ctx)
    (o * do[:, idx]).sum().backward()
    errs = {"o": _max_rel(o, o_full[:, idx])}
    for n, x, y in zip("qkvgb", xs, ys, strict=True):
        errs["d" + n] = _max_rel(y.grad, x.grad[:, idx])
    return errs


# DGPSLayer cases (run_layer_case), LAYOUT: rows (B = 2 rows of 64, equal slices), uneven (the same rows cut into
# slices shorter than the convolution's halo: a halo spans two earlier ranks), packed (B = 1, 96 tokens, equal slices,
# the offsets below: sequences start one token before a boundary, so a halo holds another sequence's tokens)
LAYER_PACKED = {2: (0, 20, 47, 96), 4: (0, 23, 47, 73, 96)}
LAYER_UNEVEN = {2: (61, 3), 4: (30, 2, 1, 31)}


def run_layer_case(case: str, rank: int, world: int, out_dir: Path) -> dict[str, float]:
    """DGPSLayer(cp_group=...) on slices of the tokens against the unsharded layer: the output, the hidden states'
    gradient (the halo's share goes back to the rank that owns the tokens), every parameter's gradient and, with
    initial conv caches (INIT `conv`), the new caches. INIT: zero (no short convolution), conv0 (short convolutions
    from zero caches), conv (short convolutions from given caches, use_cache)."""
    from dgps.runtime.layers import DGPSLayer

    spec_name, layout, init = case.split(":")
    zigzag = layout.endswith("_zz")
    layout = layout.removesuffix("_zz")
    spec = Path(__file__).resolve().parents[1] / "specs" / f"{spec_name.removeprefix('layer_')}.dgps"
    torch.manual_seed(0)
    kw = dict(hidden_size=32, num_heads=H, head_k_dim=DK, head_v_dim=DV, use_short_conv=init != "zero")
    layer = DGPSLayer(spec, **kw)
    gen = torch.Generator().manual_seed(2)
    packed = layout == "packed"
    B, T = (1, 96) if packed else (ROWS_B, ROWS_T)
    cu = torch.tensor(LAYER_PACKED[world], dtype=torch.int32) if packed else None
    lengths = LAYER_UNEVEN[world] if layout == "uneven" else (T // world,) * world
    hidden = torch.randn(B, T, 32, generator=gen).requires_grad_()
    past, use_cache = None, init == "conv"
    if use_cache:
        n_seq = len(LAYER_PACKED[world]) - 1 if packed else B
        past = {"conv": {n: torch.randn(n_seq, c.channels, c.kernel_size - 1, generator=gen)
                         for n, c in (("q", layer.q_conv1d), ("k", layer.k_conv1d), ("v", layer.v_conv1d))}}
    y_full, state_full, extras_full = layer(hidden, cu_seqlens=cu, past_state=past, use_cache=use_cache)
    dy = torch.randn(y_full.shape, generator=gen)
    (y_full * dy).sum().backward()
    ref = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    dhidden = hidden.grad.clone()
    # the same layer in float64 through the sequential reference: a gate parameter's gradient is a sum over every token
    # of a cancelling log-gate adjoint (dA_log ~ 0.1 from terms ~1), so fp32 summation order alone moves it by ~3e-5
    # of its size; the CP call is held to the unsharded call's own distance from float64 there
    exact = DGPSLayer(spec, backend="reference", **kw).double()
    exact.load_state_dict(layer.state_dict())
    past64 = None if past is None else {"conv": {n: c.double() for n, c in past["conv"].items()}}
    y64, _, _ = exact(hidden.detach().double(), cu_seqlens=cu, past_state=past64)
    (y64 * dy.double()).sum().backward()
    ref64 = {n: p.grad for n, p in exact.named_parameters() if p.grad is not None}
    layer.zero_grad()
    layer.cp_group, layer.cp_layout = dist.group.WORLD, "zigzag" if zigzag else "contiguous"
    lo = sum(lengths[:rank])
    idx = _tokens(rank, world, T, True) if zigzag else torch.arange(lo, lo + lengths[rank])
    mine = hidden.detach()[:, idx].clone().requires_grad_()
    y, state, extras = layer(mine, cu_seqlens=cu, past_state=past, use_cache=use_cache)
    (y * dy[:, idx]).sum().backward()
    errs = {"y": _max_rel(y, y_full[:, idx])}
    for n, t in extras.items():  # the route (and CLER's r) in the slice's order too
        errs[n] = _max_rel(t, extras_full[n][:, idx])
    # the hidden states' gradient: a rank's tokens in a later rank's halo get their share from that rank
    errs["dhidden"] = _max_rel(mine.grad, dhidden[:, idx])
    for n, p in layer.named_parameters():
        if n in ref:
            g = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(g)
            # how much farther from float64 the CP gradient is than the unsharded one (0 when no farther)
            errs["d" + n] = max(0.0, _max_rel(g, ref64[n]) - _max_rel(ref[n], ref64[n]))
    if use_cache:  # each sequence's new cache comes from the rank where it ends (zero elsewhere)
        for n, c in state["conv"].items():
            c = c.detach().clone()
            dist.all_reduce(c)
            errs["conv_" + n] = _max_rel(c, state_full["conv"][n])
    return errs


def main() -> None:
    rank, world, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = {}
    for case in sys.argv[5:]:
        try:
            run = run_fla_case if case.startswith("fla_") else run_layer_case if case.startswith("layer_") else run_case
            results[case] = run(case, rank, world, out_dir)
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            import traceback

            results[case] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
            raise
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    (out_dir / f"counts_rank{rank}.json").write_text(json.dumps(COUNTS))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: gloo's threads at exit aborted a rank once ("terminate called ...")


if __name__ == "__main__":
    main()
