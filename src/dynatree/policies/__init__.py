"""Drafting policies, one file each, all behind :class:`~dynatree.policies.base.DraftPolicy`."""

from __future__ import annotations

import difflib
from typing import Any

from dynatree.errors import DynaTreeError
from dynatree.policies.autoregressive import Autoregressive
from dynatree.policies.base import DraftPolicy, RoundFeedback
from dynatree.policies.dynatree import DynaTree
from dynatree.policies.dyspec import DySpec
from dynatree.policies.dyspec_threshold import DySpecThreshold
from dynatree.policies.fixed import FixedTree
from dynatree.policies.linear import Linear

STRATEGIES: dict[str, type[DraftPolicy]] = {
    cls.name: cls for cls in (Autoregressive, Linear, FixedTree, DynaTree, DySpec, DySpecThreshold)
}


def make_policy(strategy: str | DraftPolicy, **options: Any) -> DraftPolicy:
    """Build a policy by name with validated options (or pass an instance through)."""
    if isinstance(strategy, DraftPolicy):
        if options:
            raise DynaTreeError("strategy options cannot be combined with a policy instance")
        return strategy
    cls = STRATEGIES.get(strategy)
    if cls is None:
        close = difflib.get_close_matches(str(strategy), STRATEGIES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise DynaTreeError(f"unknown strategy '{strategy}'{hint} (available: {', '.join(STRATEGIES)})")
    return cls.from_options(**options)


__all__ = ["STRATEGIES", "DraftPolicy", "RoundFeedback", "make_policy"]
