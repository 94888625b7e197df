"""Python source as text to build requests from: where the standard library lives, and the
functions of a module cut out of its syntax tree with what a code request may ask of them.

The instruct bench sets (:mod:`dynatree.bench.instruct`) and the instruct training data
(:mod:`dynatree.training.instruct`) both draw code requests from the standard library's own
functions. They read the library differently (the bench its top-level modules, the training data
its packages too) and keep functions of different sizes and rename locals differently, so each
passes its own limits and rename table: each is pinned by what it produced (the recorded prompt
sets, the shipped drafts' data).
"""

from __future__ import annotations

import ast
import sysconfig
import textwrap
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def stdlib_root() -> Path:
    """The folder of the running Python's standard library (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Function:
    """A function or method cut out of a module: its node, its class (None: a module-level
    function), its source and a local variable a rename request may ask for (``old`` to ``new``;
    both None when it has none)."""

    node: FunctionNode
    cls: str | None
    code: str  # decorators included, dedented, trailing white space removed
    old: str | None
    new: str | None

    def fields(self) -> dict[str, Any]:
        """The template fields every code request has; a field is None when it has no value."""
        return {
            "code": self.code, "name": self.node.name, "kind": "method" if self.cls else "function",
            "cls": self.cls, "old": self.old, "new": self.new,
            "comments": True if ("#" in self.code or ast.get_docstring(self.node)) else None,
        }


def _function_nodes(tree: ast.Module) -> list[tuple[FunctionNode, str | None]]:
    """Module-level functions and the methods of module-level classes, in source order."""
    found: list[tuple[FunctionNode, str | None]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node, None))
        elif isinstance(node, ast.ClassDef):
            found += [(n, node.name) for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found


def _rename(node: FunctionNode, renames: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The function's most used local (not a parameter, not ``_private``) and a clearer name for it:
    from ``renames``, else ``<name>_value``; (None, None) when it has no local or the new name is
    already in use."""
    params = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
    stored = Counter(n.id for n in names if isinstance(n.ctx, ast.Store))
    used = Counter(n.id for n in names)
    local = sorted((x for x in stored if x not in params and not x.startswith("_")), key=lambda x: (-used[x], x))
    old = local[0] if local else None
    new = (renames.get(old) or f"{old}_value") if old else None
    if new is not None and new in used:
        return None, None
    return old, new


def functions(source: str, tree: ast.Module, min_chars: int, max_chars: int, max_lines: int,
              renames: Mapping[str, str]) -> list[Function]:
    """The functions and methods of a module (``tree`` parsed from ``source``) whose source is a
    copyable size -- ``min_chars`` to ``max_chars`` characters and at most ``max_lines`` lines --
    in source order, each with a local to rename by ``renames``."""
    lines = source.splitlines()
    out = []
    for node, cls in _function_nodes(tree):
        start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        code = textwrap.dedent("\n".join(lines[start - 1:node.end_lineno])).rstrip()
        if not (min_chars <= len(code) <= max_chars) or code.count("\n") + 1 > max_lines:
            continue
        out.append(Function(node, cls, code, *_rename(node, renames)))
    return out
