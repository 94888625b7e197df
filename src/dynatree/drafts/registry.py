"""Which draft source drives which ``draft`` argument: the one list a new source is added to.

Sources are asked in order and the first whose ``accepts`` says yes drives the run, so the more
specific ones come first (a feature-conditioned head is also a module, which the model source
would take). A source defined outside the package joins with :func:`register` (asked first).
"""

from __future__ import annotations

from typing import Any

from dynatree.core.draft_source import DraftSource
from dynatree.drafts.feature import FeatureDrafter
from dynatree.drafts.model import Drafter
from dynatree.drafts.suffix import HybridDraft, SuffixDraft
from dynatree.errors import DynaTreeError
from dynatree.runtime.inputs import check_causal_lm

SOURCES: list[type[DraftSource]] = [SuffixDraft, HybridDraft, FeatureDrafter, Drafter]


def register(source: type[DraftSource]) -> type[DraftSource]:
    """Add a draft source of one's own, asked before the built-in ones (usable as a class
    decorator). Registering a source of the same ``name`` again replaces it."""
    if not (isinstance(source, type) and issubclass(source, DraftSource)):
        raise DynaTreeError(f"register takes a DraftSource subclass, got {source!r}")
    SOURCES[:] = [source, *(s for s in SOURCES if s.name != source.name)]
    return source


def source_for(draft: Any) -> type[DraftSource]:
    """The source class for ``draft`` (refused with one line when none takes it, or when a model it
    would run is not a causal LM: an encoder-decoder or a masked LM fails deep inside its first
    call, or runs and drafts tokens from both directions)."""
    for source in SOURCES:
        if source.accepts(draft):
            for model in source.models(draft):
                check_causal_lm(model, "draft")
            return source
    kinds = ", ".join(s.name for s in SOURCES)
    raise DynaTreeError(f"no draft source takes a draft of type {type(draft).__name__} (sources: {kinds})")
