"""Which draft source drives which ``draft`` argument: the one list a new source is added to.

Sources are asked in order and the first whose ``accepts`` says yes drives the run, so the more
specific ones come first (a feature-conditioned head is also a module, which the model source
would take).
"""

from __future__ import annotations

from typing import Any

from dynatree.core.draft_source import DraftSource
from dynatree.drafts.feature import FeatureDrafter
from dynatree.drafts.model import Drafter
from dynatree.drafts.suffix import HybridDraft, SuffixDraft
from dynatree.errors import DynaTreeError

SOURCES: list[type[DraftSource]] = [SuffixDraft, HybridDraft, FeatureDrafter, Drafter]


def source_for(draft: Any) -> type[DraftSource]:
    """The source class for ``draft`` (refused with one line when none takes it)."""
    for source in SOURCES:
        if source.accepts(draft):
            return source
    kinds = ", ".join(s.name for s in SOURCES)
    raise DynaTreeError(f"no draft source takes a draft of type {type(draft).__name__} (sources: {kinds})")
