"""The flat keywords :func:`dynatree.generate` took in dynatree 0.1, refused since 0.2.

``generate(..., temperature=0.8, engine="static", eos_token_id=[], stop_strings="\\n")`` is
``generate(..., sampling=SamplingConfig(temperature=0.8), options=EngineOptions(engine="static"),
stopping=StoppingConfig(eos_token_id=(), stop_strings=("\\n",)))``: each group is validated where
it is built, and a misspelt keyword can no longer pass as an option of the strategy. 0.1 accepted
the old spellings with a ``DeprecationWarning``; 0.2 refuses them in one line that names the group
to use, before any model runs (a flat keyword left to the strategy's options would be refused as
"unknown option of dynatree", which does not say where it went).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import Any

from dynatree.core.sampling import SamplingConfig
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig

SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingConfig))
ENGINE = tuple(f.name for f in dataclasses.fields(EngineOptions))
STOPPING = tuple(f.name for f in dataclasses.fields(StoppingConfig))
REMOVED_IN = "dynatree 0.2"


def refuse(keywords: dict[str, Any]) -> None:
    """One line for flat keywords among ``keywords`` (generate's leftover keywords, which are
    otherwise the strategy's own options): which group each belongs in."""
    hints = []
    for names, kind, arg in ((SAMPLING, SamplingConfig, "sampling"), (ENGINE, EngineOptions, "options"),
                             (STOPPING, StoppingConfig, "stopping")):
        mine = [n for n in names if n in keywords]
        if mine:
            hints.append((mine, f"{arg}={kind.__name__}({', '.join(f'{n}=...' for n in mine)})"))
    if hints:
        flat = ", ".join(f"{n}=" for mine, _ in hints for n in mine)
        raise DynaTreeError(f"generate(): {flat} {'was' if len(hints) == 1 and ', ' not in flat else 'were'} "
                            f"removed in {REMOVED_IN}; pass {' and '.join(h for _, h in hints)} instead")


def suggest(unknown: Iterable[str], known: Iterable[str]) -> str:
    """``"did you mean sampling=SamplingConfig(temperature=...) for temprature=?"`` for keywords
    close to one of ``known``
    (generate's own parameters and the groups' fields), else ``""``."""
    known = list(known)
    pairs = [(name, difflib.get_close_matches(name, known, n=1, cutoff=0.75)) for name in unknown]
    found = [f"{_spelling(close[0])} for {name}=" for name, close in pairs if close]
    return f"did you mean {', '.join(found)}?" if found else ""


def _spelling(name: str) -> str:
    """How ``name`` is passed to generate: its own keyword, or inside its settings group."""
    for names, kind, arg in ((SAMPLING, SamplingConfig, "sampling"), (ENGINE, EngineOptions, "options"),
                             (STOPPING, StoppingConfig, "stopping")):
        if name in names:
            return f"{arg}={kind.__name__}({name}=...)"
    return f"{name}="


__all__ = ["ENGINE", "SAMPLING", "STOPPING", "refuse", "suggest"]
