"""The spec fuzzer: a hypothesis strategy over the DGPS space, and `dgps fuzz`.

`specs()` draws random *valid* specs: every slot option, random elementwise expressions from a safe
grammar (bounded maps of free inputs, so gates stay in range), random input roles and head groupings.
`fuzz()` compiles each drawn spec, runs its kernels (forward, decode and the generated backward)
against the reference derived from the same spec (the Triton interpreter on CPU, or the GPU), and on
a failure lets hypothesis shrink the spec to a minimal one, written to a file with the inputs' seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

# --- the spec strategy --------------------------------------------------------------------------------


@dataclass
class _Builder:
    """Accumulates declarations while the slots are drawn; renders the spec text."""

    inputs: dict[str, str] = field(default_factory=dict)  # name -> "role domain [key_head]"
    params: dict[str, str] = field(default_factory=dict)
    lets: list[tuple[str, str]] = field(default_factory=list)
    slots: list[str] = field(default_factory=list)

    def input(self, name: str, decl: str) -> str:
        self.inputs.setdefault(name, decl)
        return name

    def param(self, name: str, decl: str) -> str:
        self.params.setdefault(name, decl)
        return name

    def render(self, name: str) -> str:
        lines = [f"recurrence {name}", "  input q, k : key", "  input v : value"]
        lines += [f"  input {n} : {d}" for n, d in self.inputs.items()]
        lines += [f"  param {n} : {d}" for n, d in self.params.items()]
        lines += [f"  let {n} = {e}" for n, e in self.lets]
        lines += [f"  {s}" for s in self.slots]
        return "\n".join([*lines, "end", ""])


_SQUASH = ("tanh", "sigmoid", "softsign")


@st.composite
def _free_expr(draw: st.DrawFn, b: _Builder, side: str, depth: int = 2) -> str:
    """A bounded-range expression of free inputs/params on one side (token, key, value)."""
    role = {"token": "token", "key": "key_channel", "value": "value_channel"}[side]
    kind = draw(st.sampled_from(["input", "param", "squash", "affine", "reduce"] if depth > 0 else ["input", "param"]))
    if kind == "reduce":
        # channel reductions: a bounded token-level sum of a key- or value-side expression, or a unit vector
        if side == "token":
            over = draw(st.sampled_from(["key", "value"]))
            return f"tanh(0.25 * sum({draw(_free_expr(b, over, depth - 1))}))"
        return f"l2norm({draw(_free_expr(b, side, depth - 1))}, 0.01)"
    if kind == "input":
        return b.input(f"x{side[0]}{draw(st.integers(0, 1))}", f"{role} free")
    if kind == "param":
        prole = {"token": "head", "key": "key_channel", "value": "value_channel"}[side]
        return b.param(f"p{side[0]}{draw(st.integers(0, 1))}", f"{prole} free")
    inner = draw(_free_expr(b, side, depth - 1))
    if kind == "squash":
        return f"{draw(st.sampled_from(_SQUASH))}({inner})"
    other = draw(_free_expr(b, side, depth - 1))
    c = draw(st.sampled_from(["0.5", "2", "0.25"]))
    op = draw(st.sampled_from(["+", "-", "*"]))
    if op == "*":
        return f"{c} * tanh({inner}) * tanh({other})"
    return f"{c} * ({inner} {op} {other})"


@st.composite
def _log_gate(draw: st.DrawFn, b: _Builder, side: str) -> str:
    """A provably non-positive log-gate expression."""
    role = "token" if side == "token" else "key_channel"
    # a constant gate reads no input (the plan's gate operand has no dims); the checker asks a vector decay for a
    # key-channel expression, so only the per-token side draws one
    form = draw(st.sampled_from(["input", "logsigmoid", "neg_softplus", "mamba"] + (["constant"] if side == "token" else [])))
    if form == "input":
        return b.input(f"g{side[0]}", f"{role} log_gate")
    if form == "constant":
        return f"logsigmoid({draw(st.sampled_from(['0.5', '-1', '2']))})"
    x = draw(_free_expr(b, side))
    if form == "logsigmoid":
        return f"logsigmoid({x})"
    if form == "neg_softplus":
        return f"-softplus({x})"
    a_log = b.param("A_log", "head free")
    return f"-exp(0.5 * tanh({a_log})) * softplus({x})"


@st.composite
def _unit(draw: st.DrawFn, b: _Builder, side: str = "token", key_head: bool = False) -> str:
    role = {"token": "token", "key": "key_channel", "value": "value_channel"}[side]
    form = draw(st.sampled_from(["input", "expr"] + (["constant"] if side == "token" else [])))
    if form == "input":
        return b.input(f"u{side[0]}{'k' if key_head else ''}", f"{role} unit" + (" key_head" if key_head else ""))
    if form == "constant":  # a per-token gain, rate or λ that reads no input (gain 0.5)
        return draw(st.sampled_from(["0.5", "1", "0.25"]))
    return f"sigmoid({draw(_free_expr(b, side))})"


@st.composite
def specs(draw: st.DrawFn, chunkable_only: bool = False) -> str:
    """A random valid spec (text). `chunkable_only` keeps to tied solves without the exact preconditioner."""
    b = _Builder()
    decay = draw(st.sampled_from(["none", "scalar", "vector", "const"]))
    if decay == "scalar":
        b.slots.append(f"decay scalar({draw(_log_gate(b, 'token'))})")
    elif decay == "vector":
        b.slots.append(f"decay vector({draw(_log_gate(b, 'key'))})")
    elif decay == "const":
        b.slots.append(f"decay const(1 - 2 ** ({draw(st.sampled_from(['-3', '-5']))} - head_index))")
    solves = ["additive", "delta", "erase_write"] if chunkable_only else ["additive", "delta", "erase_write", "dplr"]
    solve = draw(st.sampled_from(solves))
    if solve == "erase_write":
        b.slots.append(f"gain key = {draw(_unit(b, 'key'))}, value = {draw(_unit(b, 'value'))}")
    elif solve == "delta" and draw(st.booleans()):
        # Longhorn's write gain β / (1 + β‖k‖²): a reduction over the (possibly unnormalised) key
        beta = draw(_unit(b))
        b.slots.append(f"gain {beta} / (1 + {beta} * sum(k * k))")
    elif draw(st.booleans()):
        b.slots.append(f"gain {draw(_unit(b))}")
    precond = "none"
    if solve != "dplr":
        options = ["none", "diag"] if chunkable_only else ["none", "diag", "exact"]
        precond = draw(st.sampled_from(options))
    placement = "write_key"
    if precond == "diag":
        key_head = draw(st.booleans())
        gp = b.input("gP" + ("k" if key_head else ""), "token log_gate" + (" key_head" if key_head else ""))
        bp = draw(_unit(b, "token", key_head))
        x = draw(st.sampled_from(["1.5", "2"]))
        # the map's offset (PDN's μ): none, a per-head param or a per-key-channel one — the backward forms a param's
        # share of the map's chain rule per token (a sum over key channels, or a key tile) and sums it over tokens
        shift = draw(st.sampled_from(["", "head", "key_channel"]))
        mu = ""
        if shift:
            decl = "head key_head free" if shift == "head" and key_head else f"{shift} free"
            mu = f" - {b.param('pmu' if shift == 'head' else 'pmuk', decl)}"
        # the statistic: k ⊙ k, or scaled per channel by a key-side unit (another key input whose share the backward
        # forms next to k's)
        stat = draw(st.sampled_from(["k * k", "scaled"]))
        if stat == "scaled":
            stat = f"k * k * {draw(_unit(b, 'key'))}"
        b.slots.append(f"precond diag({stat}, decay = {gp}, gain = {bp}) -> exp(-log({x}) * softsign(log(A + 1e-6)"
                       f"{mu})) on write_key")
    elif precond == "exact":
        placement = "query" if solve == "additive" and draw(st.booleans()) else "write_key"
        b.slots.append(f"precond exact(lambda = {draw(st.sampled_from(['1.0', '0.5']))}) on {placement}")
    if solve == "dplr":
        kk = b.input("kappa", "key_channel free")
        b.lets.append(("khat", f"l2norm({kk})"))  # RWKV-7's unit removal key: the state stays bounded
        reads = draw(st.sampled_from(["decayed", "undecayed"]))
        # f = k is the tied form (its write-back key is the write key: the delta family's machinery)
        f = draw(st.sampled_from(["untied", "tied"]))
        f = "k" if f == "tied" else f"khat * {draw(_unit(b, 'key'))}"
        b.slots.append(f"solve dplr(e = -khat, f = {f}, reads = {reads})")
    else:
        b.slots.append(f"solve {solve}")
    curvature = solve != "dplr" and not (precond == "exact" and placement == "query") and draw(st.booleans())
    if curvature:
        lam = _unit(b)
        b.slots.append(f"read curvature({draw(lam)}, {draw(st.sampled_from(['centered', 'uncentered']))})")
    routes = ["none", "value"] + (["residual"] if solve in ("delta", "erase_write") else [])
    route = draw(st.sampled_from(routes))
    if route != "none":
        b.slots.append(f"route {route}")
    # a curvature read's statistics are defined on L2-normalised keys (the checker requires `normalize k`)
    norm = draw(st.sampled_from(["q, k", "k"] if curvature else ["", "q, k", "k"]))
    if norm:
        eps = draw(st.sampled_from(["", ", eps = 0.001"]))
        b.slots.insert(0, f"normalize {norm}{eps}")
    scale = draw(st.sampled_from(["", "1.0", "0.5"]))  # the read's scale (dk ** -0.5 when left out)
    if scale:
        b.slots.append(f"scale {scale}")
    text = b.render("fuzzed")
    return text


# --- the fuzz driver ------------------------------------------------------------------------------------


def spec_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def repeat_command(path: str | Path, seed: int, layout: dict[str, object] | None, T: int) -> str:
    """The `dgps verify` command that runs a failing draw's checks again (the fuzzer's B = 1, H = 1)."""
    lay = layout or {}
    args = [f"--T {T}", "--B 1", "--H 1", f"--seed {seed}"] + [f"--{k} {lay[k]}" for k in ("HV", "dk", "dv") if k in lay]
    return f"dgps verify {path} " + " ".join(args) + (" --varlen" if lay.get("varlen") else "")


def write_failure(text: str, seed: int, error: str, out_dir: str | Path, layout: dict[str, object] | None = None,
                  T: int = 20) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fuzz-failure-{spec_id(text)}.dgps"
    comment = "\n".join(f"# {line}" for line in error.strip().splitlines()[:20])
    shape = f" at {', '.join(f'{k}={v}' for k, v in layout.items())}" if layout else ""
    path.write_text(f"# dgps fuzz: minimal failing spec; inputs drawn with random_inputs(seed={seed}){shape}\n"
                    f"# to repeat it: {repeat_command(path, seed, layout, T)}\n{comment}\n{text}")
    return path


@dataclass
class FuzzResult:
    count: int = 0
    failure_path: Path | None = None
    failure_text: str = ""
    failure_error: str = ""
    failures_seen: int = 0
    repeat: str = ""  # the `dgps verify` command that repeats the failure


def _layouts(dk: int, dv: int) -> st.SearchStrategy[dict[str, object]]:
    """The head layout and channel widths the kernels see: `dk` × `dv` first (what shrinking returns to), then widths
    that are not a multiple of 16 (padded channel tiles; dk = 72: two key blocks of 64, the second mostly padding),
    one or two value heads per key head, packed sequences."""
    return st.fixed_dictionaries({"dk": st.sampled_from([dk, 8, 24, 72]), "dv": st.sampled_from([dv, 8, 20]),
                                  "HV": st.sampled_from([2, 1]), "varlen": st.booleans()})


def fuzz(count: int = 50, seed: int = 0, out_dir: str | Path = ".", *, device: str = "cpu", T: int = 20,
         dk: int = 16, dv: int = 16, chunkable_only: bool = False, gradients: bool = True,
         log=print) -> FuzzResult:  # noqa: ANN001
    """Draw `count` specs; compile each and check its kernels against its reference (see runtime/verify).

    On a failure hypothesis shrinks the spec (and the input seed); the minimal failing spec is written
    to `out_dir` and returned. Kernels run where `device` says: the Triton interpreter needs
    TRITON_INTERPRET=1 set before triton is first imported (the CLI does this).
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from .api import load
    from .bounds import checked_bounds
    from .compile import compile as compile_spec
    from .verify import format_rows, verify, verify_gradients

    result = FuzzResult()
    last_failure: dict[str, object] = {}

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False)
    @given(specs(chunkable_only=chunkable_only), st.integers(0, 2**16), _layouts(dk, dv))
    def check(text: str, input_seed: int, layout: dict[str, object]) -> None:
        try:
            _check_one(text, input_seed, layout)
        except Exception as e:
            last_failure.update(text=text, seed=input_seed, layout=layout,
                                error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            raise

    def _check_one(text: str, input_seed: int, layout: dict[str, object]) -> None:
        rec = load(text)
        pkg = compile_spec(rec)
        # one sequence (packed ones where the layout draws varlen), the gradients' check as the forward's, so that
        # `dgps verify` with the same arguments repeats a failure whole. Under the interpreter every load and store
        # of every kernel is also checked against the tensor its pointer came from (runtime/bounds.py)
        with checked_bounds() if device == "cpu" else contextlib.nullcontext():
            rows = verify(rec, pkg, B=1, T=T, H=1, seed=input_seed, device=device, **layout)  # type: ignore[arg-type]
            if gradients:
                grad_layout = {k: v for k, v in layout.items() if k != "varlen"}
                rows += verify_gradients(rec, pkg, B=1, T=T, H=1, seed=input_seed, device=device,
                                         **grad_layout)  # type: ignore[arg-type]
        bad = [r for r in rows if not r.ok]
        if not last_failure:
            result.count += 1
            log(f"[{result.count}/{count}] {spec_id(text)} {rec.ir.structure.decay:<6} {rec.ir.solve.spelled:<11} "
                f"precond={rec.ir.precond.kind:<5} read={rec.ir.read.kind:<9} route={rec.ir.route:<8} "
                f"forward={pkg.METADATA['forward']:<9} backward={pkg.METADATA['backward']:<9} "
                f"dk={layout['dk']:<2} dv={layout['dv']:<2} HV={layout['HV']}{' varlen' if layout['varlen'] else '       '} "
                f"{'ok' if not bad else 'FAIL'}")
        if bad:
            result.failures_seen += 1
            raise AssertionError(format_rows(rows))

    try:
        check()
    except Exception as e:  # noqa: BLE001 - any failure of a drawn spec is the fuzzer's finding
        if not last_failure:  # the failure happened outside the kernels' comparison (e.g. a crash)
            last_failure.update(text="", seed=-1, error=f"{type(e).__name__}: {e}")
        result.failure_text = str(last_failure.get("text", ""))
        result.failure_error = str(last_failure.get("error", "")) or f"{type(e).__name__}: {e}"
        if result.failure_text:
            result.failure_path = write_failure(result.failure_text, int(last_failure["seed"]),  # type: ignore[arg-type]
                                                result.failure_error, out_dir,
                                                last_failure.get("layout"), T)  # type: ignore[arg-type]
            result.repeat = repeat_command(result.failure_path, int(last_failure["seed"]),  # type: ignore[arg-type]
                                           last_failure.get("layout"), T)  # type: ignore[arg-type]
    return result
