"""The flat keywords :func:`dynatree.generate` took before its typed groups, kept for one release.

``generate(..., temperature=0.8, engine="static", eos_token_id=[], stop_strings="\\n")`` is now
``generate(..., sampling=SamplingConfig(temperature=0.8), options=EngineOptions(engine="static"),
stopping=StoppingConfig(eos_token_id=(), stop_strings=("\\n",)))``: each group is validated where
it is built, and a misspelt keyword can no longer pass as an option of the strategy. The old
spellings (and ``max_new_tokens`` / ``eos_token_id`` given by position) still work, with one
:class:`DeprecationWarning` per call that names the group to use; they go in dynatree 0.2.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dynatree.core.sampling import SamplingConfig
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig

SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingConfig))
ENGINE = tuple(f.name for f in dataclasses.fields(EngineOptions))
STOPPING = tuple(f.name for f in dataclasses.fields(StoppingConfig))
POSITIONAL = ("max_new_tokens", "eos_token_id")  # generate's 5th and 6th positional parameters, once
REMOVED_IN = "dynatree 0.2"


@dataclass(frozen=True)
class Groups:
    """A call's settings once the flat keywords are folded into their groups."""

    max_new_tokens: int
    sampling: SamplingConfig
    options: EngineOptions
    stopping: StoppingConfig
    strategy_options: dict[str, Any]


def group(positional: tuple[Any, ...], keywords: dict[str, Any], *, max_new_tokens: int,
          sampling: SamplingConfig | None, options: EngineOptions | None,
          stopping: StoppingConfig | None) -> Groups:
    """Fold deprecated positional values and flat keywords into the typed groups (warning once).

    What is left of ``keywords`` is the strategy's own options (``k=5`` for linear). A value given
    both flat and in its group is refused rather than one silently winning."""
    if len(positional) > len(POSITIONAL):
        raise DynaTreeError(f"generate() takes at most 4 positional arguments (target, draft, input_ids, strategy), "
                            f"got {4 + len(positional)}")
    keywords = dict(keywords)
    used: list[str] = []
    for name, value in zip(POSITIONAL, positional):
        if name == "max_new_tokens":
            if max_new_tokens != 128:
                raise DynaTreeError("max_new_tokens given both by position and as a keyword")
            max_new_tokens = value
        elif name in keywords:
            raise DynaTreeError(f"{name} given both by position and as a keyword")
        else:
            keywords[name] = value
        used.append(f"{name} by position")
    flat = {name: keywords.pop(name) for name in (*SAMPLING, *ENGINE, *STOPPING) if name in keywords}
    hints = []
    for names, given, kind, arg in ((SAMPLING, sampling, SamplingConfig, "sampling"),
                                    (ENGINE, options, EngineOptions, "options"),
                                    (STOPPING, stopping, StoppingConfig, "stopping")):
        mine = {n: flat[n] for n in names if n in flat}
        if not mine:
            continue
        used += [f"{n}=" for n in mine if f"{n} by position" not in used]
        hints.append(f"{arg}={kind.__name__}({', '.join(f'{n}=...' for n in mine)})")
        if kind is EngineOptions:  # (settings given twice but equal are fine, as before)
            options = EngineOptions.merge(options, **mine)
        elif given is not None:
            raise DynaTreeError(f"{', '.join(mine)} given both as keyword(s) and in {arg}=: pass them in {arg}= only")
        elif kind is SamplingConfig:
            sampling = SamplingConfig(**mine)
        else:
            stopping = StoppingConfig(**mine)
    if used:
        fixes = hints + (["max_new_tokens= by keyword"] if "max_new_tokens by position" in used else [])
        warnings.warn(f"generate(): {', '.join(used)} {'is' if len(used) == 1 else 'are'} deprecated and stop "
                      f"working in {REMOVED_IN}; pass {' and '.join(fixes)} instead", DeprecationWarning, stacklevel=3)
    return Groups(max_new_tokens, sampling or SamplingConfig(), options or EngineOptions(),
                  stopping or StoppingConfig(), keywords)


def suggest(unknown: Iterable[str], known: Iterable[str]) -> str:
    """``"did you mean temperature= for temprature=?"`` for keywords close to one of ``known``
    (generate's own parameters and the flat keywords), else ``""``."""
    known = list(known)
    pairs = [(name, difflib.get_close_matches(name, known, n=1, cutoff=0.75)) for name in unknown]
    found = [f"{close[0]}= for {name}=" for name, close in pairs if close]
    return f"did you mean {', '.join(found)}?" if found else ""


__all__ = ["ENGINE", "SAMPLING", "STOPPING", "Groups", "group", "suggest"]
