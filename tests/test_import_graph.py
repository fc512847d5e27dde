"""Data flows one way through the pipeline: dsl → compiler → codegen → runtime. No module of a pipeline
package imports a later package (at module level or inside a function), and checking a spec imports no torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("dsl", "compiler", "codegen", "runtime")


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, pipeline package) of every dgps import in `path`, wherever it appears."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 2 and node.module:  # from ..X import ...
                target = node.module.split(".")[0]
            elif node.level == 1:  # from .X import ... (same package)
                target = package
            elif node.level == 0 and node.module and node.module.startswith("dgps."):
                target = node.module.split(".")[1]
            else:
                continue
            out.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dgps."):
                    out.append((node.lineno, a.name.split(".")[1]))
    return out


@pytest.mark.parametrize("package", ORDER)
def test_no_pipeline_package_imports_a_later_one(package: str) -> None:
    rank = {p: i for i, p in enumerate(ORDER)}
    bad = []
    for path in sorted((ROOT / package).glob("*.py")):
        for line, target in _imports(path, package):
            if target in rank and rank[target] > rank[package]:
                bad.append(f"{package}/{path.name}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_checking_a_spec_imports_no_torch() -> None:
    code = ("import sys; from dgps.cli import main; rc = main(['check', '-q', 'specs/gdn.dgps']); "
            "assert rc == 0; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
