"""The scripts under benchmarks/ still import what they name from dynatree.

They are not run by the suite (they time real models), so a module move inside the package would
otherwise leave them failing with an ImportError until someone re-runs a benchmark. Every
``from dynatree... import name`` in them must resolve (importing the package module, not running
the script)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").rglob("*.py"))


def dynatree_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every ``from dynatree... import name`` and ``import dynatree...``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dynatree":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "dynatree"]
    return found


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) > 10 and any(dynatree_imports(p) for p in SCRIPTS)


def unresolved(path: Path) -> list[str]:
    """The dynatree imports of ``path`` that fail."""
    missing = []
    for module, name in dynatree_imports(path):
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            missing.append(f"{module}: {error}")
            continue
        if name is not None and not hasattr(loaded, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"from {module} import {name}")
    return missing


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dynatree_import_resolves(path: Path):
    assert not unresolved(path)


def test_control_a_moved_name_is_caught(tmp_path: Path):
    script = tmp_path / "old.py"
    script.write_text("import dynatree.nowhere\nfrom dynatree.drafts.distilled import load_distilled_draft\n")
    assert unresolved(script) == ["dynatree.nowhere: No module named 'dynatree.nowhere'",
                                  "from dynatree.drafts.distilled import load_distilled_draft"]
