"""The decay hook (codegen/decay.py): without a decay every factor is 1 — no factor expression, operands left as
they are, and OMIT for the statements only a decay needs, which rendering drops; with one, each kind's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

import dgps
from dgps.codegen.chunk import render_chunk, supports_chunk
from dgps.codegen.decay import OMIT, decay_hook

SPECS = sorted((Path(__file__).resolve().parents[1] / "specs").glob("*.dgps"))


def test_no_decay_is_the_identity() -> None:
    none = decay_hook("none")
    assert not none.decays
    assert [none.rows("b_g"), none.to_end("b_gl", "b_g"), none.state("b_gl"), none.pair("b_g", "b_g")] == [""] * 4
    assert none.times("b_u", none.to_end("b_gl", "b_g")) == "b_u"
    assert none.times("b_e", "b_eb") == "b_e"  # a variable only a decay statement binds
    assert none.either("(scale * b_eb)", "scale") == "scale"
    assert none.mention(" ⊙ Γ") == "" and none.mention(" ⊙ Γ", "as is") == "as is"
    statements = [none.rescale("b_h0", "b_gl"), none.only("b_db += b_dbl"), none.load("b_g", "rows", "m_r"),
                  none.load_last(), none.last_row(), none.store("b_g", "rows", "m_r"),
                  none.chunk_gates("rows", "m_r", 8, factors=True), none.gate_share("-", "b_e * b_dews"),
                  none.end_share(4), none.store_gate_grad("rows", 4)]
    assert statements == [OMIT] * len(statements)


@pytest.mark.parametrize("kind", ["scalar", "const", "vector"])
def test_a_decay_applies_its_factors(kind: str) -> None:
    hook = decay_hook(kind)
    assert hook.decays and hook.per_token == (kind != "vector") and hook.per_channel == (kind == "vector")
    assert hook.times("b_u", hook.to_end("b_gl", "b_g")) == f"b_u * {hook.to_end('b_gl', 'b_g')}"
    assert hook.rescale("b_h0", hook.state("b_gl")) == f"b_h0 = b_h0 * {hook.state('b_gl')}"
    gates = hook.chunk_gates("rows", "m_r", 8, factors=True).split("\n" + " " * 8)
    assert gates[0].startswith("last = ") and gates[1].startswith("b_g = tl.load(g_buf")
    assert gates[3:] == [f"b_eb = {hook.rows('b_g')}", f"b_ecb = {hook.to_end('b_gl', 'b_g')}"]
    # the per-token form sums a product tile over its key channels; the per-channel form keeps the tile
    share = hook.gate_share("-", "b_e * b_dews")
    assert ("tl.sum(" in share) == (kind != "vector")


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_rendering_drops_every_omitted_line(path: Path) -> None:
    ir = dgps.load(path).ir
    if supports_chunk(ir)[0]:
        assert OMIT not in render_chunk(ir)
