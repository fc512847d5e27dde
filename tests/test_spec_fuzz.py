"""Hypothesis over the spec space: random valid specs check, print, and their references are consistent."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dgps
from dgps.runtime.fuzz import specs

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _split(rec: dgps.Recurrence, x: dict[str, torch.Tensor], a: int, b: int) -> dict[str, torch.Tensor]:
    return {k: (v if rec.ir.input(k).is_param else v[:, a:b]) for k, v in x.items()}


@FUZZ
@given(specs())
def test_random_specs_check_and_print(text: str) -> None:
    rec = dgps.load(text)
    assert rec.show("ast").startswith("Spec fuzzed")
    assert "structure:" in rec.show("ir")


@FUZZ
@given(specs(), st.integers(0, 2**16), st.integers(1, 8))
def test_random_specs_continue_exactly_from_final_states(text: str, seed: int, cut: int) -> None:
    rec = dgps.load(text)
    x = rec.random_inputs(2, 9, 1, 4, 3, HV=2, seed=seed)
    full = rec.reference(**x, output_final_state=True)
    first = rec.reference(**_split(rec, x, 0, cut), output_final_state=True)
    rest = rec.reference(**_split(rec, x, cut, 9), output_final_state=True, initial_state=first.final_state)
    assert torch.isfinite(full.o).all()
    torch.testing.assert_close(torch.cat([first.o, rest.o], 1), full.o, rtol=1e-10, atol=1e-10)
    for name, s in full.final_state.items():
        torch.testing.assert_close(rest.final_state[name], s, rtol=1e-10, atol=1e-10)
