"""Linear speculative decoding: a greedy chain of K draft tokens (the papers' "Linear" baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dynatree.core.proposer import LevelDrafter, Levels
from dynatree.core.tree import TreeBuilder
from dynatree.errors import check
from dynatree.policies.base import DraftPolicy


@dataclass(frozen=True)
class LinearConfig:
    """k: draft tokens per round (the papers: K = 5, 6, 7 or 8)."""

    k: int = 5

    def __post_init__(self) -> None:
        check(isinstance(self.k, int) and 1 <= self.k <= 256, "k", "an integer in [1, 256]", self.k)


class Linear(DraftPolicy):
    name: ClassVar[str] = "linear"
    Config = LinearConfig

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        logp = torch.log_softmax(root_logits, -1)
        # (the engine's largest verify call, and the tokens left to generate, may be shorter)
        node, k = 0, min(tree.cap(self.config.k), self.config.k if tree.depth_limit is None else tree.depth_limit)
        for i in range(k):
            tok = int(logp.argmax())
            node = tree.add(node, tok, float(logp[tok]))
            if i + 1 < k:  # the last token's own prediction is never needed
                logp = torch.log_softmax((yield [node])[0], -1)

    def max_depth(self) -> int:
        return self.config.k
