"""The feature-conditioned draft source (EAGLE idea): a draft head that reads the target's features.

The head itself (a :class:`torch.nn.Module`) is :mod:`dynatree.drafts.feature_head`; this module
is how the loop drives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from dynatree.core.proposer import Drafting, Proposer, RunContext
from dynatree.core.kv import KVModel
from dynatree.core.tree import TokenTree, TreeBuilder, committed_tokens
from dynatree.drafts.feature_head import uses_target_features
from dynatree.drafts.model import ModelProposer, check_vocab, open_kv, shape
from dynatree.errors import DynaTreeError

if TYPE_CHECKING:
    from dynatree.options import EngineOptions


class FeatureProposer(ModelProposer):
    """The drafter of a feature-conditioned draft (:mod:`dynatree.drafts.feature_head`).

    Every draft row of token j is computed from token j's embedding and the feature of its parent:

    * committed tokens use the *target's* features (from the prefill and the verify passes), so
      the cache holds only rows computed from exact features;
    * tree nodes use the draft's own *predicted* feature of their parent (the root's comes from
      the pending tokens' call), kept per node for the next level.

    Unlike :class:`ModelProposer`, :meth:`commit` keeps none of the tree's rows: accepted nodes were
    drafted from predicted features, so they are run again next round with the target's (one
    draft call over the accepted tokens + bonus, which is the call the round starts with anyway).
    """

    name = "feature"
    wants_features = True

    @classmethod
    def accepts(cls, draft: Any) -> bool:
        return uses_target_features(draft)

    @classmethod
    def draft_engine(cls, options: "EngineOptions") -> str:
        # Its calls take the target's features as an extra input: eager hf engine (it is one small
        # layer, so the static engine's fixed shapes would buy it little).
        return "hf"

    @classmethod
    def open(cls, draft: Any, context: RunContext) -> "FeatureProposer":
        if context.streaming is not None:
            raise DynaTreeError("kv_window is not supported with a feature-conditioned draft (its features would "
                                "have to be evicted with the cache); use an independent draft")
        if not context.target_kv.supports_lazy_head():
            raise DynaTreeError(f"a feature-conditioned draft reads the target's final hidden states, but "
                                f"{type(context.target).__name__}'s logits are not head(hidden states) exactly")
        layers = tuple(draft.feature_layers)
        if layers:
            n = int(context.target.config.num_hidden_layers)
            if max(layers) >= n:
                raise DynaTreeError(f"this feature draft reads layers {list(layers)} of its target, which has {n}")
            if context.target_kv.engine != "hf":
                raise DynaTreeError(f"a feature draft that reads fused layers ({list(layers)}) needs the target on "
                                    f"the hf engine (the {context.target_kv.engine!r} engine returns only the "
                                    "final hidden states); use engine='hf' (--engine hf)")
        check_vocab(context.target, draft, context.allow_vocab_mismatch)
        return cls(open_kv(draft, context, cls.draft_engine(context.options)), layers, *shape(context))

    def __init__(self, kv: KVModel, feature_layers: tuple[int, ...] = (), policy: Any = None, sampler: Any = None) -> None:
        super().__init__(kv, policy, sampler)
        self.feature_layers = feature_layers
        self.pending_features: torch.Tensor | None = None  # [len(pending), H]: each pending token's parent's
        self._pred: dict[int, torch.Tensor] = {}  # tree node -> predicted feature (root: 0)

    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        """``features``: the target's features of ``prompt[:-1]`` (its prefill)."""
        prompt = list(prompt)
        assert features is not None and len(features) == len(prompt) - 1, "the target's prompt features are needed"
        features = self._read(features)
        # token j reads token j-1's feature; the first token has no parent (zeros, as in training)
        parents = torch.cat([features.new_zeros(1, features.shape[-1]), features])
        if len(prompt) > 1:
            p = len(prompt) - 1
            start = self.kv.length
            self._call(prompt[:-1], torch.arange(start, start + p), torch.ones(p, p, dtype=torch.bool).tril(), start,
                       parents[:-1])
        self.pending, self.pending_features = [prompt[-1]], parents[-1:]

    def propose(self, builder: TreeBuilder) -> None:
        if self.policy is None:
            raise DynaTreeError("this drafter has no tree shape (open it with a policy in its RunContext)")
        self.policy.build(builder, self, self.begin_round(builder))

    def drafting(self, builder: TreeBuilder) -> Drafting:
        """Proposes at once: its calls carry the target's features, which a batch's shared draft
        cache does not take (batches refuse a feature draft)."""
        return Proposer.drafting(self, builder)

    def begin_round(self, builder: TreeBuilder) -> torch.Tensor:
        self._builder = builder
        self._slot, self._pred = {}, {}
        self._calls0 = self.kv.calls
        start = self.kv.length
        p = len(self.pending)
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        logits, hidden = self._call(self.pending, torch.arange(start, start + p), causal, start, self.pending_features)
        self._base = start + p
        self._pred[0] = hidden[-1]
        return logits[-1]

    def forward(self, nodes: Sequence[int]) -> torch.Tensor:
        nodes = list(nodes)
        tokens, positions, visible = self._level(nodes)
        parents = torch.stack([self._pred[self._builder.parent[n]] for n in nodes])
        first_row = self.kv.length
        logits, hidden = self._call(tokens, positions, visible, self._base, parents)
        for r, node in enumerate(nodes):
            self._slot[node] = first_row + r
            self._pred[node] = hidden[r]
        return logits

    def commit(self, tree: TokenTree, accepted: Sequence[int], bonus: int, features: torch.Tensor | None = None) -> None:
        """``features``: the target's features of the root and the accepted nodes (path order),
        i.e. of the parents of the accepted nodes and of the bonus token."""
        assert features is not None and len(features) == len(accepted) + 1
        features = self._read(features)
        tokens = committed_tokens(tree, list(accepted), bonus)
        if self._builder is None:  # the draft sat this round out: its tokens wait with their features
            self.pending += tokens
            self.pending_features = torch.cat([self.pending_features, features])
            return
        self.kv.compact(self._base, [])
        self.pending = tokens
        self.pending_features = features
        self._builder, self._pred = None, {}

    def _read(self, target_features: torch.Tensor) -> torch.Tensor:
        """The target's features as the head reads them (fused to its width when it reads layers)."""
        return self.kv.model.parent_features(target_features)

    def _call(self, tokens: Sequence[int], positions: torch.Tensor, visible: torch.Tensor, since: int,
              features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(full-vocabulary logits ``[q, V]``, predicted features ``[q, H]``) of one draft call."""
        out = self.kv.call(tokens, positions, visible, since, features=features.view(1, len(tokens), -1))
        return out.logits[0, :, : self.kv.vocab_size].float(), out.hidden_states[-1][0]
