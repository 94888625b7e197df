"""Code structure that keeps the package easy to extend: no import cycles, a CLI that loads fast.

Both checks are static or subprocess-based, never timed: "fast" is "imports neither torch nor
transformers", which is what made ``dynatree --help`` take seconds.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def module_imports(root: Path, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its code, function-level imports
    included (a loop through a function body is still a loop); ``if TYPE_CHECKING:`` blocks only
    with ``type_checking`` (they never run, but a type named across layers is a dependency a reader
    follows all the same)."""
    names = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        names[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        for node in (list(ast.walk(tree)) if type_checking else _runtime_nodes(tree)):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
                    if target in names and target != name:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in names and a.name != name}
    for name in graph:  # importing a.b.c runs a/b/__init__.py first: that import is an edge too
        graph[name] |= {parent for target in list(graph[name]) for parent in _parents(target)
                        if parent in names and parent != name and not name.startswith(parent + ".")}
    return graph


def _parents(module: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``module``: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


#: The layers, lowest first: a module may import its own layer and the layers below, never above.
#: The decoding loop (``loop``) thus sees neither model loading, training, text corpora, the
#: integrations nor the command line.
LAYERS = [
    ("surface", ["dynatree.errors", "dynatree.catalog", "dynatree.options", "dynatree.tuning"]),
    ("core", ["dynatree.core"]),
    ("runtime", ["dynatree.runtime"]),
    ("policies", ["dynatree.policies"]),
    ("drafts", ["dynatree.drafts"]),
    ("loop", ["dynatree.loop"]),
    ("loading and text", ["dynatree.loading", "dynatree.text"]),
    ("training", ["dynatree.training"]),
    ("integrations and bench", ["dynatree.integrations", "dynatree.hf", "dynatree.bench"]),
    ("cli", ["dynatree.cli", "dynatree.__main__"]),
    ("package", ["dynatree"]),
]


def layer_of(module: str) -> int:
    """Index into :data:`LAYERS` of the longest prefix naming ``module``."""
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank < 0:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")
    return rank


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
                  for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m))


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_in_the_package() -> None:
    graph = module_imports(SRC / "dynatree")
    assert len(graph) > 30 and graph["dynatree.cli"]  # the scan really read the package
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


def test_no_import_cycle_nor_upward_import_counting_type_checking_imports() -> None:
    graph = module_imports(SRC / "dynatree", type_checking=True)
    assert "dynatree.options" in graph["dynatree.core.proposer"]  # (a TYPE_CHECKING-only edge is read)
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])
    assert layer_violations(graph) == []


def test_every_import_goes_down_the_layers() -> None:
    graph = module_imports(SRC / "dynatree")
    assert "dynatree.runtime.cache" in graph["dynatree.loop.generate"]  # function-level and module-level edges read
    assert layer_violations(graph) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"dynatree.loop.generate": {"dynatree.loading.models"}, "dynatree.loading.models": set(),
             "dynatree.core.tree": set()}
    assert layer_violations(graph) == ["dynatree.loop.generate (loop) imports dynatree.loading.models (loading and text)"]
    assert layer_violations({"dynatree.loading.models": {"dynatree.core.tree"}, "dynatree.core.tree": set()}) == []


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("import typing\nfrom ..a import thing\n")
    assert cycle(module_imports(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n")
    assert cycle(module_imports(pkg)) is None
    # a loop through a function-level import is a loop all the same
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import thing\n")
    assert cycle(module_imports(pkg)) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    # a loop through a package's __init__: importing pkg.sub.b runs pkg/sub/__init__.py first
    (pkg / "sub" / "b.py").write_text("x = 1\n")
    (pkg / "a.py").write_text("from .sub.b import x\n")
    (pkg / "sub" / "__init__.py").write_text("from ..a import x\n")
    assert cycle(module_imports(pkg)) == ["pkg.a", "pkg.sub", "pkg.a"]


@pytest.mark.parametrize("module", ["dynatree.cli", "dynatree", "dynatree.options", "dynatree.catalog", "dynatree.tuning"])
def test_the_cli_loads_without_torch_or_transformers(module: str) -> None:
    code = (f"import sys, {module}; heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert out.stdout.strip() == "", f"importing {module} pulled in {out.stdout.strip()}"


def test_the_cli_reads_its_names_and_defaults_from_the_catalog() -> None:
    """`dynatree list` shows every preset and prompt set with its description; the CLI's draft
    temperature default is the library's (one constant, not a copy)."""
    import typer.main
    from typer.testing import CliRunner

    from dynatree.catalog import PRESETS, PROMPT_SETS
    from dynatree.cli import app
    from dynatree.core.sampling import SamplingConfig

    result = CliRunner().invoke(app, ["list"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for name, entry in (*PRESETS.items(), *PROMPT_SETS.items()):
        assert name in result.output and entry.description in result.output, name
    params = {p.name: p for p in typer.main.get_command(app).commands["generate"].params}
    assert params["draft_temperature"].default == SamplingConfig().draft_temperature
    assert params["target"].default in PRESETS


def test_the_public_names_load_and_are_the_library_s_own() -> None:
    """What the docs call public (policy objects of one's own, the text source) is importable
    from the package itself, and every name in ``__all__`` resolves."""
    import dynatree
    from dynatree.core.tree import TreeBuilder
    from dynatree.policies import DraftPolicy

    assert dynatree.DraftPolicy is DraftPolicy and dynatree.TreeBuilder is TreeBuilder
    for name in dynatree.__all__:
        assert getattr(dynatree, name) is not None, name


FRAME_READS = ("_getframe", "currentframe", "f_locals", "f_back", "inspect.stack")


def frame_reads(root: Path) -> list[str]:
    """``file:line name`` for every attribute or call in ``root``'s code that reads a stack frame
    (a caller's locals are state the caller never handed over)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in FRAME_READS or (name == "stack" and isinstance(node, ast.Attribute)
                                       and isinstance(node.value, ast.Name) and node.value.id == "inspect"):
                found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return found


def test_the_package_reads_no_stack_frame() -> None:
    assert frame_reads(SRC) == []


def test_the_frame_check_finds_a_frame_read(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import sys\n\ndef caller():\n    return sys._getframe(1).f_locals\n")
    assert frame_reads(tmp_path) == ["m.py:4 f_locals", "m.py:4 _getframe"]
