"""FLA-compatible entry points (`from dgps.fla_compat import chunk_gated_delta_rule`); see dgps.runtime.fla_compat."""
# ruff: noqa: F405 - the names come from the star import below

from .runtime.fla_compat import *  # noqa: F403

__all__ = [
    "chunk_delta_rule",
    "chunk_dplr_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_gdn",
    "chunk_gdn2",
    "chunk_gla",
    "chunk_kda",
    "chunk_precond_gated_delta_rule",
    "chunk_precond_kda",
    "chunk_simple_gla",
]
