"""The code generators' one jinja2 environment: templates from codegen/templates/, an undefined name an error rather
than an empty string, and for the kernel templates block tags that leave no blank lines behind (`trim`); and OMIT, the
line a hook macro renders where its structure has nothing to say, which `drop_omitted` removes after rendering."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).resolve().parent / "templates"
OMIT = "#<omit>"  # a line that a template hook leaves out: `drop_omitted` removes every line holding only this


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


def drop_omitted(src: str, where: str) -> str:
    """`src` without the lines a hook left out (OMIT alone on a line); OMIT inside a line of code is a template bug."""
    src = re.sub(rf"^[ \t]*{re.escape(OMIT)}\n", "", src, flags=re.M)
    if OMIT in src:
        raise AssertionError(f"{where}: a hook's OMIT inside a line of generated code")
    return src
