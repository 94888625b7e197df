"""The draft-source interface: where a round's candidate tokens come from.

A *draft source* grows the round's token tree under the root; the loop verifies whatever tree it
grew and tells it what was committed. A draft model, a feature-conditioned head and the text
itself (a suffix index over the prompt and the output so far) are implementations
(:mod:`dynatree.drafts`); the loop holds one and never asks which kind it is. A new source is one
file implementing this class plus one line in :mod:`dynatree.drafts.registry`.

A source that runs a model also offers :meth:`begin_round` / :meth:`forward`, the level-batched
draft calls the drafting policies (:mod:`dynatree.policies`) build their trees from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from dynatree.core.kv import KVModel
from dynatree.core.tree import TokenTree, TreeBuilder
from dynatree.errors import DynaTreeError

if TYPE_CHECKING:
    from dynatree.core.costmodel import CostProfile
    from dynatree.options import EngineOptions
    from dynatree.policies.base import DraftPolicy


@dataclass(frozen=True)
class SourceContext:
    """What a source may need to open for one generation (all decided by the loop beforehand)."""

    target: torch.nn.Module
    target_kv: KVModel
    vocab: int  # the target's logits width
    options: "EngineOptions"  # resolved engine options
    rows: int  # prompt + max_new_tokens: the most committed tokens a cache must hold
    streaming: Any = None  # a StreamingConfig when KV eviction is on, else None
    allow_vocab_mismatch: bool = False


class DraftSource(ABC):
    """Grows each round's tree; keeps whatever per-generation state it needs (a KV cache, an index)."""

    #: the registry name (``dynatree.drafts.registry``), shown in errors and statistics
    name: ClassVar[str]
    #: whether the loop must hand over the target's final hidden states of the prompt (``prefill``)
    #: and of every round's root and accepted nodes (``commit``)
    wants_features: ClassVar[bool] = False
    #: with :attr:`wants_features`: the target's decoder layers whose outputs make the features,
    #: concatenated (EAGLE-3's fused layers); empty = the target's final hidden states
    feature_layers: tuple[int, ...] = ()

    # ------------------------------------------------------------------------- registration
    @classmethod
    @abstractmethod
    def accepts(cls, draft: Any) -> bool:
        """Whether this source drives ``draft`` (the object passed to ``generate(..., draft, ...)``)."""

    @classmethod
    def models(cls, draft: Any) -> list[torch.nn.Module]:
        """The modules this source runs (position limits, eval mode, tensor parallelism)."""
        return []

    @classmethod
    def max_depth(cls, draft: Any) -> int:
        """The deepest tree this source grows by itself (beyond the policy's), for position checks."""
        return 0

    @classmethod
    def draft_engine(cls, options: "EngineOptions") -> str:
        """The engine its model runs on under resolved ``options`` (what ``precompile`` builds)."""
        return options.engine

    @classmethod
    @abstractmethod
    def open(cls, draft: Any, context: SourceContext) -> "DraftSource":
        """A fresh source for one generation; refuses (DynaTreeError) what it cannot serve."""

    # ------------------------------------------------------------------------------ the loop
    @property
    def calls(self) -> int:
        """Draft model forwards in the current round (0 for a model-free source)."""
        return 0

    @abstractmethod
    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Take the prompt in (``features``: the target's of ``prompt[:-1]`` if :attr:`wants_features`)."""

    @abstractmethod
    def draft(self, builder: TreeBuilder, policy: "DraftPolicy") -> None:
        """Grow this round's tree under ``builder``'s root (node 0)."""

    @abstractmethod
    def commit(self, tree: TokenTree, accepted: Sequence[int], bonus: int, features: torch.Tensor | None = None) -> None:
        """The target committed ``tree``'s ``accepted`` nodes (path order) and then ``bonus``."""

    def wants_cost_model(self) -> bool:
        """Whether the source sizes its trees by the target's verify cost: the loop then hands it
        the measured profile (:meth:`use_cost_model`) when the cost model is on. Default: no."""
        return False

    def use_cost_model(self, profile: "CostProfile | None") -> None:
        """Receive the target's measured verify-cost profile (None: none was measured)."""

    def finish(self, length: int | None = None) -> None:
        """The generation ended: a source that learns across requests (the text source's
        cross-request cache) takes it in here. The request's text is the first ``length`` tokens of
        what was prefilled and committed (None: all of them): a last round can commit tokens past
        the stop token or the length limit, which the output does not keep."""

    # ------------------------------------------------- level calls, for sources with a model
    def begin_round(self, builder: TreeBuilder) -> torch.Tensor:
        """Start a round; returns the draft's logits for the root's children ``[V]``."""
        raise DynaTreeError(f"the {self.name} draft source has no draft model to call")

    def forward(self, nodes: Sequence[int]) -> torch.Tensor:
        """One draft call over tree ``nodes``; returns their logits ``[len(nodes), V]``."""
        raise DynaTreeError(f"the {self.name} draft source has no draft model to call")
