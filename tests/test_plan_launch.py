"""The chunk packages launch exactly the stages of their plan, in the plan's order (forward, training forward
and backward), and the training forward keeps exactly the buffers of the stages the backward plan keeps.

Launches are recorded at the host's one launch point (`_Run.launch`), not run, so this takes no interpreter
time; the buffers handed between calls are then uninitialised, which only the launch lists here see.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import dgps  # noqa: E402
from dgps.codegen.chunk import _kept_buffers, backward_reads_l, supports_chunk, supports_chunk_backward  # noqa: E402
from dgps.compiler.plan import build_backward_plan, build_plan, launch_of  # noqa: E402
from dgps.runtime.compile import load_chunk  # noqa: E402

SPECS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "specs").glob("*.dgps"))
SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"
CHUNK = [s for s in SPECS if supports_chunk(dgps.load(SPEC_DIR / f"{s}.dgps").ir)[0]]

# a backward stage kind -> its kernel
BWD_KERNEL = {"bwd_local_values": "chunk_bwd_local_values_kernel", "bwd_state_pass": "chunk_bwd_state_kernel",
              "bwd_scores": "chunk_bwd_scores_kernel", "bwd_intra": "chunk_bwd_intra_kernel",
              "bwd_grads": "chunk_bwd_grad_kernel",
              "bwd_curvature_query": "chunk_bwd_curvature_query_kernel",
              "bwd_curvature_key": "chunk_bwd_curvature_key_kernel",
              "bwd_curvature_state": "chunk_bwd_curvature_state_kernel",
              "bwd_precond_diag": "chunk_bwd_precond_diag_kernel",
              "bwd_precond_exact": "chunk_bwd_precond_exact_kernel", "bwd_precond_gram": "chunk_bwd_precond_gram_kernel",
              "bwd_inputs": "chunk_bwd_inputs_kernel"}


def _fwd_kernel(host_stage: str) -> str:
    return {"chunk_cumsum": "chunk_cumsum_kernel"}.get(host_stage, f"chunk_{host_stage}_kernel")


def _launched(mod, fn) -> list[str]:  # noqa: ANN001
    names: list[str] = []
    launch = mod._Run.launch
    mod._Run.launch = lambda self, kernels: names.extend(k[1].__name__ for k in kernels)
    try:
        fn()
    finally:
        mod._Run.launch = launch
    return names


@pytest.mark.parametrize("name", CHUNK)
def test_launches_are_the_plan(name: str) -> None:
    rec = dgps.load(SPEC_DIR / f"{name}.dgps")
    ir = rec.ir
    plan = build_plan(ir, 64, 16)
    mod = load_chunk(ir)
    x = rec.random_inputs(B=1, T=130, H=2, dk=16, dv=16, HV=2, dtype=torch.float32, seed=0)
    # a stage with `fused` runs inside another stage's launch (or, "loads", inside every consumer's tile loads)
    stages = list(dict.fromkeys(h for st in plan.stages() if (h := launch_of(st)) is not None))
    want = [_fwd_kernel(h) for h in stages]
    assert _launched(mod, lambda: mod.chunk_forward(x, output_final_state=True)) == want
    # every kernel takes only operands its body uses, and far fewer than the shared parameter list
    for kernel, params in mod._KERNEL_ARGS.items():
        assert 0 < len(params) < 40, (kernel, params)
    if not supports_chunk_backward(ir)[0]:
        return
    bp = build_backward_plan(plan)
    assert bp is not None
    assert set(bp.kept) | set(bp.recomputed) == {k for k in plan.kinds() if k != "output"}
    assert _launched(mod, lambda: mod.chunk_forward_train(x)) == want
    out, kept = mod.chunk_forward_train(x)
    assert list(mod._KEPT_BUFFERS) == [b for k in bp.kept for b in _kept_buffers(ir, k, backward_reads_l(plan))]
    assert len(kept) == len(mod._KEPT_BUFFERS)
    do = torch.randn_like(out.o)
    rerun = [_fwd_kernel(h) for h in dict.fromkeys(launch_of(st) for st in plan.stages() if st.kind in bp.recomputed)]
    bwd = [BWD_KERNEL[k] for k in bp.kinds()]
    assert _launched(mod, lambda: mod.chunk_backward(x, do=do, kept=kept)) == rerun + bwd
    # without what the forward kept, the backward reruns the whole forward plan but the output
    assert _launched(mod, lambda: mod.chunk_backward(x, do=do)) == [k for k in want if k != "chunk_output_kernel"] + bwd
