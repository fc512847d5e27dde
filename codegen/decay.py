"""The decay hook: one object per decay kind, which every chunk template calls where the decay enters.

A template says *where* the decay acts (a row factor on a tile, the factor to the chunk's end, the carry of a
state, a pair factor of a c×c matrix); the hook says *how* for its kind — a per-token scalar broadcast over
channels, a per-channel vector, or nothing. Without a decay every factor is 1: a factor method gives "" (no
factor), `times` leaves its operand as it is and a statement the decay alone needs (`rescale`, `chunk_gates`,
`only`) gives OMIT, a line that rendering drops (codegen/chunk.py: render_chunk). So a template writes the decayed
form once and no decay-kind `{% if %}` surrounds it; it branches on `per_channel` / `per_token` only where the
algorithm differs (vector decay's sub-chunk reference points, scalar decay's c×c mask).

Every exponent is ≤ 0 by construction (b is a chunk-local inclusive cumsum of log-gates ≤ 0, in log2 units).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .address import partial_row, row_offset
from .jinja_env import OMIT


def _lines(stmts: list[str], indent: int) -> str:
    """Statements as one template line's text: the template indents the first, `indent` spaces the rest."""
    return ("\n" + " " * indent).join(stmts) if stmts else OMIT


@dataclass(frozen=True)
class Decay:
    """No decay: every factor is 1 ("" from a factor method; `times` and `rescale` leave their operand as it is)."""

    kind: str = "none"
    # whether the backward forms the log-gate's gradient (compiler/plan.py: gate_gradient): a gate that reads no input
    # (RetNet's constant per head) has none to form
    gate_gradient: bool = True

    @property
    def decays(self) -> bool:
        return self.kind != "none"

    @property
    def grads(self) -> bool:
        """A decay whose log-gate's gradient the backward forms."""
        return self.decays and self.gate_gradient

    @property
    def per_channel(self) -> bool:
        """One log-gate per key channel (factors are tiles; c×c factors need sub-chunk references)."""
        return self.kind == "vector"

    @property
    def per_token(self) -> bool:
        """One log-gate per token and head (factors are vectors broadcast over the channels)."""
        return self.kind == "scalar"

    # -- where the decay acts: each factor as an expression ("" without a decay) ------------------------------------
    def rows(self, g: str) -> str:
        """e^{b_t} broadcast over a [R, channels] tile."""
        return ""

    def to_end(self, gl: str, g: str) -> str:
        """e^{b_c − b_t} (token t to the chunk's end) broadcast over a [R, channels] tile."""
        return ""

    def state(self, gl: str) -> str:
        """e^{b_c} broadcast over a [BK, BV] state tile."""
        return ""

    def pair(self, gi: str, gj: str, transposed: bool = False) -> str:
        """e^{b_i − b_j} of a c×c matrix (per-token decay only: per-channel pairs need sub-chunk references)."""
        return ""

    # -- applying a factor --------------------------------------------------------------------------------------------
    def times(self, x: str, factor: str) -> str:
        """`x` scaled by `factor` (a factor method's expression, or a variable a decay statement bound)."""
        return f"{x} * {factor}" if self.decays and factor else x

    def rescale(self, var: str, factor: str) -> str:
        """The statement `var = var * factor`; OMIT without a decay."""
        return f"{var} = {var} * {factor}" if self.decays and factor else OMIT

    def either(self, decayed: str, plain: str) -> str:
        """Code whose decayed form is not the plain one times a factor (the plain one without a decay)."""
        return decayed if self.decays else plain

    def only(self, stmt: str) -> str:
        """A statement (or several) that only a decay needs; OMIT without one."""
        return stmt if self.decays else OMIT

    def for_gradient(self, stmt: str) -> str:
        """A statement only the log-gate's gradient needs; OMIT where the backward forms none."""
        return stmt if self.grads else OMIT

    def mention(self, words: str, otherwise: str = "") -> str:
        """Words of a comment that describe the decay's part; `otherwise` without one."""
        return words if self.decays else otherwise

    # -- the chunk's gates -------------------------------------------------------------------------------------------
    @property
    def side(self) -> str | None:
        """The gate tile's channel side for the spec's expression emitter: "key" per channel, None per token."""
        return "key" if self.per_channel else None

    def store(self, var: str, rows: str, mask: str, keys: str = "k") -> str:
        """Store `var` as the chunk cumsum b at `rows` (the chunk_cumsum stage; per channel over o_<keys>); OMIT without
        a decay."""
        return OMIT

    def load(self, var: str, rows: str, mask: str, keys: str = "k") -> str:
        """`var` = the chunk cumsum b at `rows` ([R] per token, [R, BK] per channel over the key channels o_<keys>,
        masked by m_<keys>); OMIT without a decay."""
        return OMIT

    def load_last(self, var: str = "b_gl", last: str = "last", keys: str = "k") -> str:
        """`var` = b at the chunk's last token ([] or [BK] over o_<keys>); OMIT without a decay."""
        return OMIT

    def last_row(self) -> str:
        """`last` = the chunk's last row (where b_c is read); OMIT without a decay."""
        return "last = t0 + tl.minimum(eos - t0, BT) - 1" if self.decays else OMIT

    def chunk_gates(self, rows: str, mask: str, indent: int, *, g: str = "b_g", factors: bool = False) -> str:
        """The chunk's last row `last`, b at `rows` (`g`) and at `last` (b_gl); with `factors` also b_eb = e^{b_t} and
        b_ecb = e^{b_c − b_t} as tile factors. OMIT without a decay."""
        if not self.decays:
            return OMIT
        stmts = [self.last_row(), self.load(g, rows, mask), self.load_last()]
        if factors:
            stmts += [f"b_eb = {self.rows(g)}", f"b_ecb = {self.to_end('b_gl', g)}"]
        return _lines(stmts, indent)

    # -- the log-gate's gradient in bwd_grads (docs/chunk_forms.md §8): db_t = q̂ ⊙ dq̂ + e ⊙ de − a ⊙ da + end terms,
    #    then dg = the reverse cumsum of db within the chunk. The kernel's names: b_db (db), b_a (write key), b_das (the
    #    state's share of da), b_dhc (Σ_v H ⊙ dH), b_gl (b_c), b_ecb (e^{b_c − b_t}), last (the chunk's last row).
    def gate_share(self, op: str, tile: str) -> str:
        """db op= the share of a [BT, BK] product tile (op "+" or "-"); OMIT without a decay."""
        return OMIT

    def end_share(self, indent: int) -> str:
        """The state's share of da scaled to the chunk's end (b_das) and b_end, the end-of-chunk term of db:
        Σ_j a_j ⊙ da^state_j + e^{b_c} Σ_v H ⊙ dH; OMIT without a decay."""
        return OMIT

    def store_gate_grad(self, rows: str, indent: int, direct: str | None = None) -> str:
        """b_end added at the chunk's last row, then dg = the reverse cumsum of db stored to ag_buf (or, `direct`
        naming the gate's input, as that input's gradient dx_<direct> in its dtype: compiler/plan.py
        direct_gate_input); OMIT without a decay."""
        return OMIT


@dataclass(frozen=True)
class ScalarDecay(Decay):
    """One log-gate per token and head: factors are [R] vectors broadcast over the channels."""

    kind: str = "scalar"

    def load(self, var: str, rows: str, mask: str, keys: str = "k") -> str:
        return f"{var} = tl.load(g_buf + {row_offset(rows, 'HV', 'i_hv')}, mask={mask}, other=0.)"

    def load_last(self, var: str = "b_gl", last: str = "last", keys: str = "k") -> str:
        return f"{var} = tl.load(g_buf + {last} * HV + i_hv)"

    def store(self, var: str, rows: str, mask: str, keys: str = "k") -> str:
        return f"tl.store(g_buf + {row_offset(rows, 'HV', 'i_hv')}, {var}, mask={mask})"

    def rows(self, g: str) -> str:
        return f"tl.exp2({g})[:, None]"

    def to_end(self, gl: str, g: str) -> str:
        return f"tl.exp2(tl.minimum({gl} - {g}, 0.))[:, None]"

    def state(self, gl: str) -> str:
        return f"tl.exp2({gl})"

    def pair(self, gi: str, gj: str, transposed: bool = False) -> str:
        """e^{b_i − b_j} of a c×c matrix, i the later token (≤ 1 where i ≥ j; callers mask the rest): i indexes
        the rows, or with `transposed` the columns."""
        if transposed:
            return f"tl.exp2(tl.minimum({gi}[None, :] - {gj}[:, None], 0.))"
        return f"tl.exp2(tl.minimum({gi}[:, None] - {gj}[None, :], 0.))"

    def gate_share(self, op: str, tile: str) -> str:
        # one log-gate per token: this key block's share of the sum over the key channels
        return f"b_db {op}= tl.sum(tl.where(m_rk, {tile}, 0.), 1)" if self.gate_gradient else OMIT

    def end_share(self, indent: int) -> str:
        if not self.gate_gradient:
            return "b_das = b_das * b_ecb"
        return _lines(["b_das = b_das * b_ecb", self.gate_share("-", "b_a * b_das"),
                       "b_end = tl.sum(tl.sum(b_a * b_das, 1), 0) + tl.exp2(b_gl) * tl.sum(b_dhc, 0)"], indent)

    def store_gate_grad(self, rows: str, indent: int, direct: str | None = None) -> str:
        # one partial sum per key block (i_k), which bwd_inputs adds in a fixed order
        assert direct is None, "a scalar gate's gradient sums over key blocks: bwd_inputs stores it"
        if not self.gate_gradient:
            return OMIT
        return _lines(["b_db = tl.where(rows == last, b_db + b_end, b_db)",
                       "b_db = tl.where(m_r, b_db, 0.)",
                       "b_dg = tl.sum(b_db, 0) - tl.cumsum(b_db, 0) + b_db",
                       f"tl.store(ag_buf + {partial_row('i_hv', 'i_k', 'NKG')} + o_t, b_dg, mask=m_r)"], indent)


@dataclass(frozen=True)
class VectorDecay(Decay):
    """One log-gate per key channel: factors are [R, BK] tiles (c×c factors need sub-chunk references)."""

    kind: str = "vector"

    def load(self, var: str, rows: str, mask: str, keys: str = "k") -> str:
        return (f"{var} = tl.load(g_buf + {row_offset(rows, 'HV', 'i_hv', 'DK', f'o_{keys}')}, "
                f"mask={mask}[:, None] & m_{keys}[None, :], other=0.)")

    def load_last(self, var: str = "b_gl", last: str = "last", keys: str = "k") -> str:
        return f"{var} = tl.load(g_buf + ({last} * HV + i_hv) * DK + o_{keys}, mask=m_{keys}, other=0.)"

    def store(self, var: str, rows: str, mask: str, keys: str = "k") -> str:
        return (f"tl.store(g_buf + {row_offset(rows, 'HV', 'i_hv', 'DK', f'o_{keys}')}, {var}, "
                f"mask={mask}[:, None] & m_{keys}[None, :])")

    def rows(self, g: str) -> str:
        return f"tl.exp2({g})"

    def load_prev(self, var: str, rows: str, mask: str) -> str:
        """`var` = b_{t−1} at `rows`, the exclusive cumsum (0 at the chunk's first token t0): row t − 1 of b's
        buffer, so that e^{b_{t−1} − b_j} is exactly 1 at j = t − 1 (b_t − g_t would not be)."""
        return (f"{var} = tl.load(g_buf + (({rows} - 1)[:, None] * HV + i_hv) * DK + o_k[None, :], "
                f"mask=({mask} & ({rows} > t0))[:, None] & m_k[None, :], other=0.)")

    def to_end(self, gl: str, g: str) -> str:
        return f"tl.exp2(tl.minimum({gl}[None, :] - {g}, 0.))"

    def state(self, gl: str) -> str:
        return f"tl.exp2({gl})[:, None]"

    def gate_share(self, op: str, tile: str) -> str:
        return f"b_db {op}= {tile}"

    def end_share(self, indent: int) -> str:
        # a's own share (b_db −= a ⊙ da^state, a tile per channel) is taken in store_gate_grad, after da's store
        # (taken here instead, gdn2's bwd_grads spills 8 B: compile report, sm_90, dk = 128)
        return _lines(["b_das = b_das * b_ecb", "b_end = tl.sum(b_a * b_das, 0) + tl.exp2(b_gl) * b_dhc"], indent)

    def store_gate_grad(self, rows: str, indent: int, direct: str | None = None) -> str:
        return _lines([self.gate_share("-", "b_a * b_das"),
                       "b_db = tl.where(rows[:, None] == last, b_db + b_end[None, :], b_db)",
                       "b_db = tl.where(m_rk, b_db, 0.)",
                       "b_dg = tl.sum(b_db, 0)[None, :] - tl.cumsum(b_db, 0) + b_db",
                       # addressed as ag_buf's store, not as codegen/chunk.py's _grad_store (t0 + o_t rows): that form
                       # cost clvr_kda's bwd_grads 16 B of spill (compile report, sm_90, dk = 128)
                       f"tl.store(dx_{direct} + {row_offset(rows, 'HV', 'i_hv', 'DK', 'o_k')}, "
                       f"_cast_for(b_dg, dx_{direct}, DT_ID), mask=m_rk)" if direct else
                       f"tl.store(ag_buf + {row_offset(rows, 'HV', 'i_hv', 'DK', 'o_k')}, b_dg, mask=m_rk)"], indent)


DECAY_HOOKS: dict[str, Decay] = {"none": Decay(), "scalar": ScalarDecay(), "vector": VectorDecay()}


def decay_hook(kind: str, gate_gradient: bool = True) -> Decay:
    """The hook of an IR decay kind ("const" decays like "scalar": one number per token); `gate_gradient`: whether
    the backward forms the log-gate's gradient (per-token decays only: a per-channel one always does)."""
    hook = DECAY_HOOKS["scalar" if kind == "const" else kind]
    return hook if gate_gradient or hook.per_channel else replace(hook, gate_gradient=False)
