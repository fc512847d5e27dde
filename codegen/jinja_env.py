"""The code generators' one jinja2 environment: templates from codegen/templates/, an undefined name an error rather
than an empty string, and for the kernel templates block tags that leave no blank lines behind (`trim`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parent / "templates"


@cache  # one Environment per setting: jinja compiles each template once
def template_env(trim: bool = True, filters: tuple[tuple[str, Callable[[str], str]], ...] = ()) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=trim,
        lstrip_blocks=trim,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(dict(filters))
    return env
