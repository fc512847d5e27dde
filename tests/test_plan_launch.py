"""The chunk packages launch exactly the stages of their plan, in the plan's order (forward, training forward
and backward), the training forward keeps exactly the buffers of the stages the backward plan keeps, the per-token
buffers are the plan's stored operands and the backward's buffers its backward stages' outputs (their sizes and
dtypes), and no allocated buffer is idle.

Launches are recorded at the host's one launch point (`_Run.launch`), not run, so this takes no interpreter
time; the buffers handed between calls are then uninitialised, which only the launch lists here see.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
from dgps.codegen.buffers import (  # noqa: E402
    BUFFER_OF,
    BWD_BUFFER_OF,
    ELSEWHERE,
    UNTIED_BUFFER_OF,
    kept_buffers,
)
from dgps.codegen.chunk import supports_chunk, supports_chunk_backward  # noqa: E402
from dgps.compiler.plan import build_backward_plan, build_plan, launch_of, rerun_reads_route  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402

SPECS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "specs").glob("*.dgps"))
SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"
CHUNK = [s for s in SPECS if supports_chunk(dgps.load(SPEC_DIR / f"{s}.dgps").ir)[0]]

# a backward stage kind -> its kernel
BWD_KERNEL = {"bwd_local_values": "chunk_bwd_local_values_kernel", "bwd_state_pass": "chunk_bwd_state_kernel",
              "bwd_scores": "chunk_bwd_scores_kernel", "bwd_intra": "chunk_bwd_intra_kernel",
              "bwd_solve": "chunk_bwd_solve_kernel", "bwd_grads": "chunk_bwd_grad_kernel",
              "bwd_curvature_sums": "chunk_curvature_state_kernel",  # the forward's kernel, run again
              "bwd_curvature_query": "chunk_bwd_curvature_query_kernel",
              "bwd_curvature_carry": "chunk_bwd_curvature_carry_kernel",
              "bwd_curvature_key": "chunk_bwd_curvature_key_kernel",
              "bwd_precond_diag": "chunk_bwd_precond_diag_kernel",
              "bwd_precond_exact": "chunk_bwd_precond_exact_kernel", "bwd_precond_gram": "chunk_bwd_precond_gram_kernel",
              "bwd_inputs": "chunk_bwd_inputs_kernel"}


def _fwd_kernel(host_stage: str, guests: set[str]) -> str:
    if host_stage == "state_pass" and "output" in guests:  # the output fused into the state pass: one kernel of both
        return "chunk_state_output_kernel"
    if host_stage == "interaction" and "wy" in guests:  # W and Ũ at the end of the per-channel interaction
        return "chunk_interaction_wy_kernel"
    return {"chunk_cumsum": "chunk_cumsum_kernel"}.get(host_stage, f"chunk_{host_stage}_kernel")


def _want(plan, kinds=None) -> list[str]:  # noqa: ANN001
    """The kernels that compute the plan's stages of `kinds` (default: all), in its order: one per launch; a stage with
    `fused` runs inside another stage's launch (or, "loads", inside every consumer's tile loads)."""
    stages = [st for st in plan.stages() if kinds is None or st.kind in kinds]
    hosts = dict.fromkeys(h for st in stages if (h := launch_of(st)) is not None)
    return [_fwd_kernel(h, {st.kind for st in stages if st.kind != h and launch_of(st) == h}) for h in hosts]


def _want_inference(plan) -> list[str]:  # noqa: ANN001
    """The kernels of an inference call: the plan's, but where its wy stage is `inference_fused` into the state pass
    (compiler/plan.py: wy_in_inference_state_pass), no wy launch and the fused kernel's WY variant."""
    want = _want(plan)
    wy = plan.find("wy")
    if not wy or wy[0].attr("inference_fused") is None:
        return want
    assert wy[0].attr("inference_fused") == "state_pass" and "chunk_state_output_kernel" in want
    return [{"chunk_state_output_kernel": "chunk_state_output_wy_kernel"}.get(k, k) for k in want
            if k != "chunk_wy_kernel"]


@pytest.mark.parametrize("name", CHUNK)
def test_launches_are_the_plan(name: str, launch_list: Callable) -> None:
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    ir = rec.ir
    plan = build_plan(ir, 64, 16)
    mod = load_chunk(ir)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.float32, seed=0)
    want = _want(plan)
    bufs: dict = {}
    inference = _want_inference(plan)
    assert launch_list(mod, lambda: mod.chunk_forward(x, output_final_state=True), bufs) == inference
    # with the output in the state pass's launch, H_n and U stay in registers: the host allocates neither
    fused = plan.stage("output").attr("fused") == "state_pass"
    assert (bufs["h_buf"].numel() == 1 and bufs["vn_buf"].numel() == 1) == fused
    # nor W and Ũ, where an inference call forms the wy stage inside that launch too
    if plan.find("wy"):
        assert (bufs["w_buf"].numel() == 1 and bufs["u_buf"].numel() == 1) == (inference != want)
    # every kernel takes only operands its body uses, and far fewer than the shared parameter list
    for kernel, params in mod._KERNEL_ARGS.items():
        assert 0 < len(params) < 40, (kernel, params)
    if not supports_chunk_backward(ir)[0]:
        return
    bp = build_backward_plan(plan)
    assert bp is not None
    # every forward stage but the output is kept, rerun, or formed again by a backward stage where it is read; the
    # output is kept exactly where the plan stores its scores for the reverse state pass (compiler/plan.py: scores_kept)
    again = {m.kind for m in bp.memory if m.reformed_by}
    keeps_scores = plan.stage("output").attr("stores_scores") is not None
    assert set(bp.kept) | set(bp.recomputed) | again == {k for k in plan.kinds() if k != "output" or keeps_scores}
    assert ("output" in bp.kept) == keeps_scores == ("bwd_local_values" not in bp.kinds() and
                                                      "output.Sc" in bp.reads())
    assert all(bp.kinds().index(m.reformed_by) > 0 for m in bp.memory if m.reformed_by)
    assert launch_list(mod, lambda: mod.chunk_forward_train(x)) == want
    out, kept = mod.chunk_forward_train(x)
    assert list(mod._KEPT_BUFFERS) == kept_buffers(plan, bp.kept)
    assert len(kept) == len(mod._KEPT_BUFFERS)
    do = torch.randn_like(out.o)
    # the rerun of the state pass (without the output) stores H_n and U for the backward stages (a stage evaluated on
    # its consumers' loads, recomputed there, launches nothing)
    rerun = rerun_kept = _want(plan, bp.recomputed)
    assert "chunk_state_pass_kernel" in rerun
    bwd = [BWD_KERNEL[k] for k in bp.kinds()]
    if rerun_reads_route(plan):
        # given the forward's route, the rerun of the state pass reads R from it; the forward kept no Ũ, so without
        # the route wy runs again first
        assert "u_buf" not in mod._KEPT_BUFFERS and mod.ROUTE_FEEDS_RERUN
        assert launch_list(mod, lambda: mod.chunk_backward(x, do=do, kept=kept, route=out.route)) == rerun + bwd
        out, kept = mod.chunk_forward_train(x)
        rerun = _want(plan, bp.recomputed + ("wy",))
    bbufs: dict = {}
    assert launch_list(mod, lambda: mod.chunk_backward(x, do=do, kept=kept), bbufs) == rerun + bwd
    # the rerun stores U exactly where the plan's state pass outputs it (the additive family's U = β Z is formed on
    # its consumers' loads)
    assert ("vn_buf" in bbufs and bbufs["vn_buf"].numel() > 1) == ("U" in plan.stage("state_pass").output_names)
    # the route is an output beside o: the forward stores it, the rerun (no output stage) does not
    if ir.route != "none":
        assert bufs["r_buf"].numel() > 1 and bbufs["r_buf"].numel() == 1
    # without what the forward kept, the backward reruns the whole forward plan but the output (with it, in a launch
    # of its own after the state pass, where the backward reads its scores)
    rerun_all = _want(plan, tuple(set(plan.kinds()) - {"output"}))
    if keeps_scores:
        rerun_all += ["chunk_output_kernel"]
    assert launch_list(mod, lambda: mod.chunk_backward(x, do=do)) == rerun_all + bwd
    # keep_states (FLA's disable_recompute): the training forward runs the state pass in a launch of its own, which
    # stores H_n and U, and keeps both; the backward then reruns what it reruns otherwise but the state pass
    unfused = [k for w in want for k in (["chunk_state_pass_kernel", "chunk_output_kernel"]
                                         if w == "chunk_state_output_kernel" else [w])]
    sbufs: dict = {}
    assert launch_list(mod, lambda: mod.chunk_forward_train(x, keep_states=True), sbufs) == unfused
    stores_u = "U" in plan.stage("state_pass").output_names
    assert set(mod._KEPT_STATES) == ({"h_buf", "vn_buf"} if stores_u else {"h_buf"})
    _, kept_s = mod.chunk_forward_train(x, keep_states=True)
    assert len(kept_s) == len(mod._KEPT_BUFFERS) + len(mod._KEPT_STATES)
    assert [t.shape for t in kept_s[len(mod._KEPT_BUFFERS):]] == [sbufs[n].shape for n in mod._KEPT_STATES]
    kept_states = kept_s[len(mod._KEPT_BUFFERS):]
    sbbufs: dict = {}
    assert launch_list(mod, lambda: mod.chunk_backward(x, do=do, kept=kept_s), sbbufs) == \
        [k for k in rerun_kept if k != "chunk_state_pass_kernel"] + bwd
    # the backward reads the forward's own
    assert all(sbbufs[n] is t for n, t in zip(mod._KEPT_STATES, kept_states, strict=True))


# the host buffers of forward stages the backward reruns (the kept ones: codegen.buffers.kept_buffers)
_RERUN_BUFFERS = {"decay_keys": ("kg_buf", "qg_buf", "wg_buf"), "state_pass": ("h_buf", "vn_buf")}


@pytest.mark.parametrize("name", [s for s in CHUNK if build_plan(dgps.load(SPEC_DIR / f"{s}.dgps").ir, 64, 16)
                                  .stage("output").attr("unfused_when")])
def test_fused_output_per_call(name: str, monkeypatch: pytest.MonkeyPatch, launch_list: Callable) -> None:
    """The plan's output fused into the state pass for some calls only (`unfused_when`): the interpreter keeps the
    fused form; few sequences × value heads on a GPU, or FUSE_OUTPUT forced off, launch the state pass then the output,
    and only then does the host allocate H_n (and U, which the delta families' state pass forms). The backward reruns
    the state pass alone either way."""
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    plan = build_plan(rec.ir, 64, 16)
    mod = load_chunk(rec.ir)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.float32, seed=0)
    fused = _want(plan)
    assert "chunk_state_output_kernel" in fused
    unfused = [k for f in fused for k in (["chunk_state_pass_kernel", "chunk_output_kernel"]
                                           if f == "chunk_state_output_kernel" else [f])]
    inference = _want_inference(plan)  # the wy stage inside the fused launch too, where the plan says so
    gpu = torch.device("cuda")
    assert mod._fuse_output(4 * 16, 128, gpu) and not mod._fuse_output(16, 128, gpu)  # B = 4 / B = 1 at H = 16
    assert mod._fuse_output(1, 16, torch.device("cpu"))  # the interpreter: the plan's fused form
    for force, want in ((None, fused), (False, unfused), (True, fused)):
        monkeypatch.setattr(mod, "FUSE_OUTPUT", force)
        bufs: dict = {}
        assert launch_list(mod, lambda: mod.chunk_forward(x, output_final_state=True), bufs) == \
            (inference if want == fused else unfused)
        assert (bufs["h_buf"].numel() > 1) == (want == unfused)
        # U only where the state pass forms it (the additive family's is β Z, formed on the output's loads)
        assert (bufs["vn_buf"].numel() > 1) == (want == unfused and plan.family != "additive")
        # W and Ũ: written by the wy launch where one runs (the unfused pair reads them)
        if plan.find("wy"):
            assert (bufs["w_buf"].numel() > 1) == (want == unfused or inference == fused)
        if supports_chunk_backward(rec.ir)[0]:
            assert launch_list(mod, lambda: mod.chunk_forward_train(x)) == want


@pytest.mark.parametrize("name", CHUNK)
def test_memory_model_matches_the_kernels(name: str) -> None:
    """The plan's memory model against the generated module: the bytes the training forward keeps are the plan's
    kept_bytes (dk = dv = 128, per token and head), and the last backward phase reading each forward stage's buffers
    is the one the model prices them by (LAST_READ_PHASE: at the peak or later, or only in the state passes)."""
    from dgps.compiler.plan import PEAK_PHASE, PHASE_OF

    ir = dgps.load(SPEC_DIR / f"{name}.dgps").ir
    if not supports_chunk_backward(ir)[0]:
        return
    plan = build_plan(ir, 64, 16)
    bp = build_backward_plan(plan)
    mod = load_chunk(ir)
    T = 64 * 64
    kept = mod.kept_like(1, T, 1, 1, 128, 128, torch.bfloat16, "cpu")
    nbytes = sum(t.numel() * t.element_size() for t in kept) / T
    assert abs(nbytes - bp.kept_bytes) <= 0.02 * bp.kept_bytes + 1, (nbytes, bp.kept_bytes)  # An's chunk-count bound
    phase = {kernel: PHASE_OF[kind] for kind, kernel in BWD_KERNEL.items()}
    order = [k[1].__name__ for k in mod._bwd_kernels()]
    for m in bp.memory:
        bufs = kept_buffers(plan, (m.kind,)) if not m.recompute else _RERUN_BUFFERS.get(m.kind, ())
        readers = [phase[k] for k in order for b in bufs if b in mod._KERNEL_ARGS[k]]
        if readers:
            assert (max(readers) >= PEAK_PHASE) == (m.last_read >= PEAK_PHASE), (m.kind, bufs, readers)


@pytest.mark.parametrize("name", ["ccq_gdn", "ccq_gla_uncentered"])
def test_curvature_carries_live_only_around_their_readers(name: str) -> None:
    """The curvature sums' per-chunk tiles (C_n, their adjoint's carry D_n: dk² fp32 per chunk and key head) exist
    only between the pass that stores them and the chunk-parallel pass that reads them: the training forward hands
    neither to the backward, and the backward allocates each right before its reverse-ordered producer
    (bwd_curvature_sums, bwd_curvature_carry), after the chunk gradients, and drops it after its reader."""
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.float32, seed=0)
    out, kept = mod.chunk_forward_train(x)
    assert "cn_buf" not in mod._KEPT_BUFFERS and "dn_buf" not in mod._KEPT_BUFFERS
    live: list[tuple[list[str], set[str]]] = []
    launch = mod._Run.launch

    def record(self, kernels):  # noqa: ANN001, ANN202
        live.append(([k[1].__name__ for k in kernels],
                     {n for n in ("cn_buf", "dn_buf") if n in self.bufs and self.bufs[n].numel() > 1}))

    mod._Run.launch = record
    try:
        mod.chunk_backward(x, do=torch.randn_like(out.o), kept=kept)
    finally:
        mod._Run.launch = launch
    where = {n: [k for names, bufs in live if n in bufs for k in names] for n in ("cn_buf", "dn_buf")}
    assert where["cn_buf"] == ["chunk_curvature_state_kernel", "chunk_bwd_curvature_query_kernel"]
    assert where["dn_buf"] == ["chunk_bwd_curvature_carry_kernel", "chunk_bwd_curvature_key_kernel"]


TEST_SPECS = ["dplr_gained", "dplr_decayed", "gain_constant", "reductions_everything"]


@pytest.mark.parametrize("name", CHUNK + TEST_SPECS)
def test_every_allocated_buffer_is_a_launched_kernels_operand(name: str, launch_list: Callable) -> None:
    """The host allocates no buffer (more than the one-element placeholder of an unused operand) that no launched
    kernel takes, forward or backward with its rerun: an allocation with no stage of the plan behind it is memory
    for nothing, and a sign that the host and the plan disagree. An inference forward writes no intermediate that
    none of its other kernels reads (ccq_gdn's q̂ remainder did: only the backward reads it)."""
    path = SPEC_DIR / f"{name}.dgps"
    rec = dgps.load(path if path.exists() else Path(__file__).resolve().parent / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.float32, seed=0)
    calls = {"forward": lambda: mod.chunk_forward(x, output_final_state=True)}
    if supports_chunk_backward(rec.ir)[0]:
        calls["backward"] = lambda: mod.chunk_backward(x, do=torch.randn(1, 130, 2, 16))
    for label, call in calls.items():
        bufs: dict = {}
        kernels = launch_list(mod, call, bufs)
        taken = set().union(*(mod._KERNEL_ARGS[k] for k in kernels))
        idle = sorted(n for n, t in bufs.items() if torch.is_tensor(t) and t.numel() > 1 and n not in taken)
        assert not idle, f"{name} {label}: allocated, taken by no launched kernel: {idle}"
        if label == "forward":  # an inference call: every intermediate written is read by another kernel, or
            # read back by its producer's own launch where the plan says so (a fused stage's `reads_back`)
            plan = build_plan(rec.ir, 64, 16)
            back = {BUFFER_OF[(p.kind, o)] for c in plan.stages() for o in (c.attr("reads_back") or ())
                    for p in plan.stages() if o in p.output_names}
            once = sorted(n for n, t in bufs.items() if torch.is_tensor(t) and t.numel() > 1 and n.endswith("_buf")
                          and n not in ("o_buf", "r_buf") and n not in back
                          and sum(n in mod._KERNEL_ARGS[k] for k in kernels) < 2)
            assert not once, f"{name}: written by the inference forward, read by no other of its kernels: {once}"


@pytest.mark.parametrize("name", CHUNK + TEST_SPECS)
def test_token_buffers_are_the_plans_stored_operands(name: str) -> None:
    """The host's per-token buffers are exactly the forward plan's stored operands (compiler/plan.py: stored, with
    the backward's reads), each sized by its operand's shape and of its dtype ("in": the input dtype)."""
    from dgps.compiler.ir import kernel_ir
    from dgps.compiler.plan import stored

    path = SPEC_DIR / f"{name}.dgps"
    ir = kernel_ir(dgps.load(path if path.exists() else Path(__file__).resolve().parent / f"{name}.dgps").ir)
    plan = build_plan(ir, 64, 16)
    bp = build_backward_plan(plan)
    read = bp.reads() if bp is not None else set()
    buffer_of = {**BUFFER_OF, **(UNTIED_BUFFER_OF if plan.family == "untied" else {})}
    TT, N, H, HV, DK, DV = 7 * 64 + 5, 3, 2, 4, 48, 40
    HP = H if any(o.dims[2] == "H" for st in plan.find("precond_diag") for o in st.outputs) else HV
    size = {"B": 1, "T": TT, "H": H, "HV": HV, "dk": DK, "dv": DV, "C": 64}
    want = {}
    for st in plan.stages():
        if st.kind == "chunk_cumsum":  # the gate cumsum (its first output: b, or b_ where the spec names an input b)
            if stored(plan, st, st.outputs[0], read):
                o = st.outputs[0]
                want["g_buf"] = (TT * HV * (DK if o.dims[-1] == "dk" else 1), torch.float32)
            continue
        for o in st.outputs:
            if not stored(plan, st, o, read) or (st.kind, o.name) in ELSEWHERE:
                continue
            buf = buffer_of[(st.kind, o.name)]
            dims = list(o.dims)
            if dims[1] == "NT" and dims[-2:] == ["C", "C"]:
                dims = ["T", *dims[2:-1]]  # a c×c matrix is stored by token rows
            numel = 1
            for d in dims:
                numel *= (triton_cdiv(TT, 64) + N) if d == "NT" else size[d]
            want[buf] = (numel, torch.float32 if o.dtype == "fp32" else torch.bfloat16)
    mod = load_chunk(ir)
    have = mod._token_buffers(TT, N, H, HV, HP, DK, DV, torch.bfloat16, True)
    assert have == want, (sorted(set(have) ^ set(want)), {k: (have.get(k), want.get(k)) for k in set(have) | set(want)
                                                           if have.get(k) != want.get(k)})


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _spec_path(name: str) -> Path:
    path = SPEC_DIR / f"{name}.dgps"
    return path if path.exists() else Path(__file__).resolve().parent / f"{name}.dgps"


# the specs with a chunked backward (the others keep the recurrent backward, which allocates no plan buffers)
CHUNK_BWD = [s for s in CHUNK + TEST_SPECS if supports_chunk_backward(dgps.load(_spec_path(s)).ir)[0]]


@pytest.mark.parametrize("name", CHUNK_BWD)
def test_backward_buffers_are_the_backward_plans_outputs(name: str, launch_list: Callable) -> None:
    """The backward's own buffers (the host's `make` table, which _launch_backward allocates from) are exactly the
    backward plan's stage outputs: one buffer per output (two where a later stage adds its share into an earlier
    one's), sized by the output's shape (a partial sum: one row of tokens per block of the stage's key channels) and of
    its dtype ("in": the input dtype), each named by a launched kernel; plus one gradient per input and the
    curvature sums' rerun."""
    from dgps.compiler.ir import kernel_ir

    rec = dgps.load(_spec_path(name))
    ir = kernel_ir(rec.ir)
    bp = build_backward_plan(build_plan(ir, 64, 16))
    mod = load_chunk(rec.ir)
    B, T, H, HV, DK, DV = 2, 150, 2, 4, 48, 40
    x = rec.random_inputs(B=B, T=T, H=H, dk=DK, dv=DV, HV=HV, dtype=torch.float32, seed=0)
    x = {k: v.to(torch.bfloat16) for k, v in x.items()}
    seen = {}
    launch_backward = mod._launch_backward

    def record(run, kernels, make, results, alloc, hooks=None):  # noqa: ANN001, ANN202
        seen.update(make=dict(make), run=run, used={a for k in kernels for a in mod._args_of(k)})
        return launch_backward(run, kernels, make, results, alloc, hooks)

    mod._launch_backward = record
    try:
        launch_list(mod, lambda: mod.chunk_backward(x, do=torch.randn(B, T, HV, DV).to(torch.bfloat16)))
    finally:
        mod._launch_backward = launch_backward
    make, run = seen["make"], seen["run"]
    TT, NT, N = B * T, run.NT, B
    blocks = {"bwd_grads": run.nkg, "bwd_curvature_query": run.nkc, "bwd_precond_diag": run.nkp}
    size = {"B": 1, "T": TT, "N": N, "NT": NT, "H": H, "HV": HV, "dk": DK, "dv": DV, "C": 64}
    want: dict = {}
    for st in bp.stages:
        for o in st.outputs:
            if o.name.startswith("grad_") or st.kind == "bwd_curvature_sums":
                continue
            buf = BWD_BUFFER_OF.get((st.kind, o.name)) or f"apre_{o.name.removeprefix('dpre_')}_buf"
            dims = list(o.dims)
            if dims[1] == "NT" and dims[-2:] == ["C", "C"]:
                dims = ["T", *dims[2:-1]]  # a c×c matrix is stored by token rows
            numel = blocks[st.kind] if o.name in st.attr("partial_sums", ()) else 1
            for d in dims:
                numel *= size[d]
            entry = (numel, torch.float32 if o.dtype == "fp32" else torch.bfloat16)
            assert want.setdefault(buf, entry) == entry, (name, buf, st.kind, o.name)
    if "bwd_curvature_sums" in bp.kinds():
        want.update(mod._curvature_sums(NT, N, H, DK))
    have = {n: v for n, v in make.items() if not n.startswith("dx_")}
    assert have == want, {k: (have.get(k), want.get(k)) for k in set(have) | set(want) if have.get(k) != want.get(k)}
    assert sorted(n for n in make if n.startswith("dx_")) == sorted(f"dx_{n}" for n in mod._INPUTS)  # kernel inputs
    idle = sorted(set(make) - seen["used"])
    assert not idle, f"{name}: in the backward's table, named by no launched kernel: {idle}"


@pytest.mark.parametrize("name", [s for s in CHUNK if supports_chunk_backward(dgps.load(SPEC_DIR / f"{s}.dgps").ir)[0]])
def test_a_backward_warms_all_its_lists_before_its_first_launch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold first backward hands the rerun's launch list and every segment's to one `warm` (one parallel compile,
    runtime/warmup.py) before launching any: each list launched afterwards is one that call built, with the
    constants it launches with. Without that, each of gdn's six one-kernel lists compiled in turn (run 132's 7.5 s
    backward). Under CP (hooks) nothing is warmed ahead."""
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    # bf16: a placeholder the run holds (fp32) differs from the buffer its segment allocates (the input dtype)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.bfloat16, seed=0)
    out, kept = mod.chunk_forward_train(x)
    do = torch.randn_like(out.o)
    monkeypatch.setenv("DGPS_PARALLEL_COMPILE", "threads")
    mod._LAUNCH_LISTS.clear()
    events: list[tuple[str, list]] = []
    warm = mod._Run.warm

    jobs: set[tuple] = set()

    def record_warm(self, lists, stand_ins=None):  # noqa: ANN001, ANN202
        # a later segment's buffer is a stand-in of its dtype: no allocation of its size before its segment
        assert all(t.numel() == 16 for t in (stand_ins or {}).values())
        events.append(("warm", [self._list_key(k) for k in lists]))
        built, _ = self.jobs(lists, stand_ins)
        jobs.update(_specialisation(*job) for job in built)

    def record_launch(self, kernels):  # noqa: ANN001, ANN202
        events.append(("launch", [self._list_key(kernels)]))
        assert self._list_key(kernels) in mod._LAUNCH_LISTS  # built by the warm, not here
        key = self._list_key(kernels)
        want = self._launch_list(kernels)
        assert [(k, g, c) for k, g, c, _ in mod._LAUNCH_LISTS[key]] == [(k, g, c) for k, g, c, _ in want]
        assert set(_launched_specialisations(mod, self, kernels)) <= jobs  # compiled ahead as launched

    monkeypatch.setattr(mod._Run, "warm", record_warm)
    monkeypatch.setattr(mod._Run, "launch", record_launch)
    mod.chunk_backward(x, do=do, kept=kept)
    kinds = [e[0] for e in events]
    assert kinds[0] == "warm" and "warm" not in kinds[1:] and kinds.count("launch") >= 2
    warmed = set(events[0][1])
    assert all(e[1][0] in warmed for e in events[1:])
    # DGPS_PARALLEL_COMPILE=0: each list is built at its launch (no warm ahead)
    monkeypatch.setenv("DGPS_PARALLEL_COMPILE", "0")
    mod._LAUNCH_LISTS.clear()
    events.clear()
    monkeypatch.setattr(mod._Run, "launch", lambda self, kernels: events.append(("launch", [])) or
                        warm(self, [kernels]))
    mod.chunk_backward(x, do=do, kept=mod.chunk_forward_train(x)[1])
    assert [e[0] for e in events if e[0] == "warm"] == []


def _specialisation(kernel, grid, kwargs: dict) -> tuple:  # noqa: ANN001
    """What Triton compiles a launch for: the kernel, its constants, each tensor's dtype and 16-byte alignment."""
    return (kernel.__name__, tuple(grid), tuple(sorted(
        (n, (str(v.dtype), v.data_ptr() % 16 == 0) if isinstance(v, torch.Tensor) else v) for n, v in kwargs.items())))


def _launched_specialisations(mod, run, kernels) -> list[tuple]:  # noqa: ANN001
    """The specialisations of a list's launches with the tensors `run` holds at that launch."""
    tensors = run._tensors()
    return [_specialisation(k, g, dict(c, **{n: tensors[n] for n in t}))
            for k, g, c, t in mod._LAUNCH_LISTS[run._list_key(kernels)]]


@pytest.mark.parametrize("keep_states", [False, True])
@pytest.mark.parametrize("name", [s for s in CHUNK if supports_chunk_backward(dgps.load(SPEC_DIR / f"{s}.dgps").ir)[0]])
def test_a_cold_training_forward_compiles_its_backward_too(name: str, keep_states: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step's first forward hands its own launch list, the backward's rerun and every backward segment to
    one parallel compile (_warm_step): the backward that follows, called as the package calls it, builds no list of
    its own and launches only lists that compile covered."""
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    mod = load_chunk(rec.ir)
    # bf16: a placeholder the run holds (fp32) differs from the buffer its segment allocates (the input dtype)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.bfloat16, seed=0)
    monkeypatch.setenv("DGPS_PARALLEL_COMPILE", "threads")
    mod._LAUNCH_LISTS.clear()
    compiled: list[list] = []
    jobs: set[tuple] = set()
    at_once = mod._compile_at_once

    def record_compile(parts, interpret):  # noqa: ANN001, ANN202
        compiled.append([k for _, ks in parts for k in ks])
        jobs.update(_specialisation(*job) for js, _ in parts for job in js)
        return at_once(parts, interpret)

    launched: list = []

    def record_launch(self, kernels):  # noqa: ANN001, ANN202
        launched.append(self._list_key(kernels))
        # compiled ahead exactly as launched: a stand-in of another dtype than the buffer its segment allocates
        # would compile a kernel no launch uses, and leave the launch to compile its own
        assert set(_launched_specialisations(mod, self, kernels)) <= jobs

    monkeypatch.setattr(mod, "_compile_at_once", record_compile)
    monkeypatch.setattr(mod._Run, "launch", record_launch)
    out, kept = mod.chunk_forward_train(x, keep_states=keep_states)
    assert len(compiled) == 1 and launched == [compiled[0][0]]  # the forward's own list first, then the backward's
    do = torch.randn(*x["v"].shape[:3], 16, dtype=torch.bfloat16)
    route = out.route if mod.ROUTE_FEEDS_RERUN and not keep_states else None
    mod.chunk_backward(x, do=do, kept=kept or None, route=route)
    assert all(keys == [] for keys in compiled[1:])  # the backward's warm found every list built
    assert len(launched) >= 2 and set(launched) <= set(compiled[0])
