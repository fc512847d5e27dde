"""Writing compiled spec packages to disk, caching them, and importing them.

`dgps.compile(spec)` renders the package for a spec, stores it under DGPS_CACHE_DIR (default
~/.cache/dgps, or $XDG_CACHE_HOME/dgps) keyed by the spec text and the dgps/triton versions, and
imports it. Triton's JIT reads kernel source from files, so packages are always real files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from ..codegen.chunk import render_chunk
from ..codegen.recurrent import render_recurrent
from ..codegen.recurrent_bwd import render_recurrent_backward
from ..compiler.ir import IR
from .api import Recurrence, load


def cache_root() -> Path:
    env = os.environ.get("DGPS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dgps"


def _cache_entry(rec: Recurrence, cache_dir: str | Path | None = None) -> Path:
    """The cache folder of `rec`'s package (default module name), rendered and stored there if absent."""
    from ..codegen.package import cache_key

    target = (Path(cache_dir) if cache_dir is not None else cache_root()) / f"{rec.name}_{cache_key(rec.source)}"
    if not (target / "metadata.json").exists():
        _store(rec, target)
    return target


def _cached_files(rec: Recurrence) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(_cache_entry(rec).iterdir()) if p.is_file()}


def _store(rec: Recurrence, target: Path) -> None:
    """Write the package of `rec` to the cache entry `target`, atomically (a temporary folder, then rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{rec.name}_", dir=target.parent))
    try:
        write_package(rec, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its files are identical
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_package(rec: Recurrence, out_dir: str | Path, module_name: str | None = None, *,
                  cached: bool = False) -> list[Path]:
    """Render and write the package for `rec` into `out_dir` (created; existing files replaced). `cached`:
    take the files from the package cache (DGPS_CACHE_DIR) when it holds them, and fill it when not."""
    from ..codegen.package import render_package

    files = _cached_files(rec) if cached and module_name is None else render_package(rec, module_name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sorted(files.items()):
        path = out / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    for stale in ("chunk.py",):  # a package that no longer has a chunk form must not keep an old one
        if stale not in files and (out / stale).exists():
            (out / stale).unlink()
    return written


def import_package(path: str | Path, module_name: str) -> ModuleType:
    """Import the package directory `path` under `module_name`."""
    path = Path(path)
    if module_name in sys.modules:
        return sys.modules[module_name]
    parent = module_name.rpartition(".")[0]
    if parent and parent not in sys.modules:  # an empty namespace parent, e.g. `dgps_compiled`
        ns = ModuleType(parent)
        ns.__path__ = []
        sys.modules[parent] = ns
    spec = importlib.util.spec_from_file_location(module_name, path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


_SOURCE_MODULES: dict[str, ModuleType] = {}


def load_source_module(source: str, kind: str, name: str, cache_dir: str | Path | None = None) -> ModuleType:
    """Write generated module source to `<cache>/<kind>/` under a content-hashed name and import it.

    Triton's JIT reads kernel source from real files, so rendered kernels are never exec'd from strings.
    """
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    mod_name = f"dgps_{kind}_{re.sub(r'[^0-9a-zA-Z_]', '_', name)}_{key}"
    if mod_name in _SOURCE_MODULES:
        return _SOURCE_MODULES[mod_name]
    root = (Path(cache_dir) if cache_dir is not None else cache_root()) / kind
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{mod_name}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(prefix=f".{mod_name}_", suffix=".py", dir=root)
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    _SOURCE_MODULES[mod_name] = module
    return module


def load_chunk(ir: IR, cache_dir: str | Path | None = None) -> ModuleType:
    """Render, write (Triton's JIT reads kernel source from real files) and import the chunk module of `ir`."""
    return load_source_module(render_chunk(ir), "chunk", ir.name, cache_dir)


def load_recurrent(ir: IR, cache_dir: str | Path | None = None) -> ModuleType:
    """Render, write and import the recurrent (decode) module of `ir`."""
    return load_source_module(render_recurrent(ir), "recurrent", ir.name, cache_dir)


def load_recurrent_backward(ir: IR, cache_dir: str | Path | None = None) -> ModuleType:
    """Render, write and import the recurrent backward module of `ir`."""
    return load_source_module(render_recurrent_backward(ir), "recurrent_bwd", ir.name, cache_dir)


def compile(spec: str | Path | Recurrence, cache_dir: str | Path | None = None) -> ModuleType:  # noqa: A001
    """Compile a spec (path, text or loaded Recurrence) to an imported package, using the cache."""
    rec = spec if isinstance(spec, Recurrence) else load(spec)
    target = _cache_entry(rec, cache_dir)
    return import_package(target, f"dgps_compiled.{target.name}")
