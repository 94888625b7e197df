"""Conversation templates filled from a source: which templates a source can fill, and the
conversation a filled template gives.

A template is a named skeleton of user, assistant, user, ... turns with ``str.format`` fields
(``{passage}``, ``{code}``, ``{term}``) and the fields it requires without showing them; a source
(a passage, a function, a math problem) is a dict of fields, None where it has no good value. The
instruct bench sets (:mod:`dynatree.bench.instruct_text`) and the instruct training data
(:mod:`dynatree.training.instruct_text`) each define their own templates, under their own names and
split; both fill them with these two functions.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping
from typing import Any, Protocol

Messages = tuple[tuple[str, str], ...]  # (role, content), ending with the template's last turn


class Template(Protocol):
    """What filling needs of a template: its turns and the fields it requires without showing them."""

    @property
    def turns(self) -> tuple[str, ...]: ...

    @property
    def requires(self) -> tuple[str, ...]: ...


@functools.lru_cache(maxsize=None)
def _fields_shown(turns: tuple[str, ...]) -> frozenset[str]:
    return frozenset(f for turn in turns for _, f, _, _ in string.Formatter().parse(turn) if f)


def fits(template: Template, fields: Mapping[str, Any]) -> bool:
    """Whether ``fields`` has a value (not None) for every field the template shows or requires."""
    return all(fields.get(name) is not None for name in _fields_shown(template.turns) | set(template.requires))


def render(template: Template, fields: Mapping[str, Any]) -> Messages:
    """The template's turns filled from ``fields``, as user and assistant turns in turn."""
    roles = ("user", "assistant")
    return tuple((roles[i % 2], turn.format(**fields)) for i, turn in enumerate(template.turns))
