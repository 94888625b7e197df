"""Drafting policies, one file each, all behind :class:`~dynatree.policies.base.DraftPolicy`."""

from __future__ import annotations

import difflib
from typing import Any

from dynatree.errors import DynaTreeError
from dynatree.options import parse_value
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
    """Build a policy by name with validated options (or pass an instance through).

    ``strategy`` may carry its options in the spec syntax of the bench and the CLI:
    ``"linear:k=5"``, ``"fixed:depth=8:branch=3"`` (values parsed as ``-o`` values are); keyword
    options given too must not repeat one of them."""
    if isinstance(strategy, DraftPolicy):
        if options:
            raise DynaTreeError("strategy options cannot be combined with a policy instance")
        return strategy
    if isinstance(strategy, str) and ":" in strategy:
        strategy, inline = parse_inline(strategy)
        twice = sorted(set(inline) & set(options))
        if twice:
            raise DynaTreeError(f"option(s) {', '.join(twice)} given both in the strategy string and as keywords")
        options = {**inline, **options}
    cls = STRATEGIES.get(strategy)
    if cls is None:
        close = difflib.get_close_matches(str(strategy), STRATEGIES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise DynaTreeError(f"unknown strategy '{strategy}'{hint} (available: {', '.join(STRATEGIES)})")
    return cls.from_options(**options)


def parse_inline(spec: str) -> tuple[str, dict[str, Any]]:
    """``"fixed:depth=8:branch=3"`` -> ``("fixed", {"depth": 8, "branch": 3})``."""
    name, *items = [p.strip() for p in spec.split(":")]
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not raw.strip():
            raise DynaTreeError(f"strategy option '{item}' in '{spec}' must look like name=value")
        if key in options:
            raise DynaTreeError(f"option '{key}' given twice in '{spec}'")
        options[key] = parse_value(raw.strip())
    return name, options


__all__ = ["STRATEGIES", "DraftPolicy", "RoundFeedback", "make_policy", "parse_inline"]
