"""Autoregressive baseline: an empty tree, so each round verifies the root alone.

It runs through the same engine, caches and timers as every speculative strategy, which makes the
speedups in a benchmark a like-for-like comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dynatree.core.proposer import LevelDrafter, Levels
from dynatree.core.tree import TreeBuilder
from dynatree.policies.base import DraftPolicy


@dataclass(frozen=True)
class AutoregressiveConfig:
    """No options."""


class Autoregressive(DraftPolicy):
    name: ClassVar[str] = "autoregressive"
    Config = AutoregressiveConfig
    uses_draft: ClassVar[bool] = False

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        return
        yield

    def max_depth(self) -> int:
        return 0
