"""The decay hook: one object per decay kind, which every chunk template calls where the decay enters.

A template says *where* the decay acts (a row factor on a tile, the factor to the chunk's end, the carry of a
state, a pair factor of a c×c matrix); the hook says *how* for its kind — a per-token scalar broadcast over
channels, a per-channel vector, or nothing. Templates branch on `decay_hook.decays` (is there a decay at all)
and, where the algorithm differs (vector decay's sub-chunk reference points, scalar decay's c×c mask), on
`per_channel` / `per_token`; the per-kind arithmetic lives here, once.

Every exponent is ≤ 0 by construction (b is a chunk-local inclusive cumsum of log-gates ≤ 0, in log2 units).
"""

from __future__ import annotations

from dataclasses import dataclass

from .address import row_offset


@dataclass(frozen=True)
class Decay:
    """No decay: every factor is 1 (callers skip the multiplication: `decays` is False)."""

    kind: str = "none"

    @property
    def decays(self) -> bool:
        return self.kind != "none"

    @property
    def per_channel(self) -> bool:
        """One log-gate per key channel (factors are tiles; c×c factors need sub-chunk references)."""
        return self.kind == "vector"

    @property
    def per_token(self) -> bool:
        """One log-gate per token and head (factors are vectors broadcast over the channels)."""
        return self.kind == "scalar"

    def load(self, var: str, rows: str, mask: str) -> str:
        """`var` = the chunk cumsum b at `rows` ([R] per token, [R, BK] per channel)."""
        raise NotImplementedError(f"no gate cumsum without a decay ({self.kind})")

    def load_last(self, var: str = "b_gl", last: str = "last") -> str:
        """`var` = b at the chunk's last token ([] or [BK])."""
        raise NotImplementedError(f"no gate cumsum without a decay ({self.kind})")

    def rows(self, g: str) -> str:
        """e^{b_t} broadcast over a [R, channels] tile."""
        raise NotImplementedError(self.kind)

    def to_end(self, gl: str, g: str) -> str:
        """e^{b_c − b_t} (token t to the chunk's end) broadcast over a [R, channels] tile."""
        raise NotImplementedError(self.kind)

    def state(self, gl: str) -> str:
        """e^{b_c} broadcast over a [BK, BV] state tile."""
        raise NotImplementedError(self.kind)


@dataclass(frozen=True)
class ScalarDecay(Decay):
    """One log-gate per token and head: factors are [R] vectors broadcast over the channels."""

    kind: str = "scalar"

    def load(self, var: str, rows: str, mask: str) -> str:
        return f"{var} = tl.load(g_buf + {row_offset(rows, 'HV', 'i_hv')}, mask={mask}, other=0.)"

    def load_last(self, var: str = "b_gl", last: str = "last") -> str:
        return f"{var} = tl.load(g_buf + {last} * HV + i_hv)"

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


@dataclass(frozen=True)
class VectorDecay(Decay):
    """One log-gate per key channel: factors are [R, BK] tiles (c×c factors need sub-chunk references)."""

    kind: str = "vector"

    def load(self, var: str, rows: str, mask: str) -> str:
        return (f"{var} = tl.load(g_buf + {row_offset(rows, 'HV', 'i_hv', 'DK', 'o_k')}, "
                f"mask={mask}[:, None] & m_k[None, :], other=0.)")

    def load_last(self, var: str = "b_gl", last: str = "last") -> str:
        return f"{var} = tl.load(g_buf + ({last} * HV + i_hv) * DK + o_k, mask=m_k, other=0.)"

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


DECAY_HOOKS: dict[str, Decay] = {"none": Decay(), "scalar": ScalarDecay(), "vector": VectorDecay()}


def decay_hook(kind: str) -> Decay:
    """The hook of an IR decay kind ("const" decays like "scalar": one number per token)."""
    return DECAY_HOOKS["scalar" if kind == "const" else kind]
