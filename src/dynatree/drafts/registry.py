"""Which proposer drives which ``draft`` argument, and the one function that opens it.

Proposers are asked in order and the first whose ``accepts`` says yes drives the run, so the more
specific ones come first (a feature-conditioned head is also a module, which the model proposer
would take). A proposer defined outside the package joins with :func:`register` (asked first).
"""

from __future__ import annotations

from typing import Any

from dynatree.core.proposer import Proposer, RunContext
from dynatree.drafts.feature import FeatureProposer
from dynatree.drafts.model import ModelProposer
from dynatree.drafts.hybrid import HybridProposer
from dynatree.drafts.suffix import TextProposer
from dynatree.errors import DynaTreeError
from dynatree.runtime.inputs import check_causal_lm

PROPOSERS: list[type[Proposer]] = [TextProposer, HybridProposer, FeatureProposer, ModelProposer]


def register(proposer: type[Proposer]) -> type[Proposer]:
    """Add a proposer of one's own, asked before the built-in ones (usable as a class decorator).
    Registering a proposer of the same ``name`` again replaces it."""
    if not (isinstance(proposer, type) and issubclass(proposer, Proposer)):
        raise DynaTreeError(f"register takes a Proposer subclass, got {proposer!r}")
    PROPOSERS[:] = [proposer, *(p for p in PROPOSERS if p.name != proposer.name)]
    return proposer


def proposer_for(draft: Any) -> type[Proposer]:
    """The proposer class for ``draft`` (refused with one line when none takes it, or when a model it
    would run is not a causal LM: an encoder-decoder or a masked LM fails deep inside its first
    call, or runs and drafts tokens from both directions)."""
    for proposer in PROPOSERS:
        if proposer.accepts(draft):
            for model in proposer.models(draft):
                check_causal_lm(model, "draft")
            return proposer
    kinds = ", ".join(p.name for p in PROPOSERS)
    raise DynaTreeError(f"no draft source takes a draft of type {type(draft).__name__} (sources: {kinds})")


def open_proposer(draft: Any, context: RunContext) -> Proposer:
    """The run's proposer for ``draft``, opened once with the run's context (its policy, sampler
    and cost profile included): everything the loop then calls."""
    return proposer_for(draft).open(draft, context)
