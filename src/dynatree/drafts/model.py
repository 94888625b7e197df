"""The drafter: runs the draft model level by level over a growing tree, and keeps its KV cache.

A policy decides *which* nodes to expand; the drafter turns "expand these nodes" into ONE draft
forward over all of them, with a tree mask so each node attends to the committed prefix, its own
ancestors and itself only. Draft cache layout during a round::

    [committed tokens already cached | pending committed tokens (end with the root) | expanded nodes in call order]

Only expanded nodes get draft KV rows (leaves are never run through the draft). After the target
decides, :meth:`Drafter.commit` keeps the rows of accepted nodes that have them; accepted tokens
without rows, plus the bonus token, become the pending tokens run at the start of the next round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynatree.runtime.cache import KVModel
from dynatree.core.tree import TreeBuilder


class Drafter:
    """Level-batched draft forwards with a tree mask, over the draft's :class:`~dynatree.runtime.cache.KVModel`."""

    #: Whether the engine must hand over the target's features (final hidden states) of the
    #: prompt and of every round's root and accepted nodes (:class:`FeatureDrafter`).
    wants_features = False

    def __init__(self, kv: KVModel) -> None:
        self.kv = kv
        self.pending: list[int] = []
        self._builder: TreeBuilder | None = None
        self._calls0 = 0
        self._base = 0  # cache rows belonging to committed tokens (incl. pending) this round
        self._slot: dict[int, int] = {}  # tree node -> cache row, for expanded drafted nodes

    @property
    def calls(self) -> int:
        """Draft forwards in the current round."""
        return self.kv.calls - self._calls0

    # ----------------------------------------------------------------------------------- setup
    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Cache all prompt tokens but the last; the last becomes the first round's root."""
        prompt = list(prompt)
        self.kv.prefill(prompt[:-1])
        self.pending = [prompt[-1]]

    # ---------------------------------------------------------------------------- per round
    def begin_round(self, builder: TreeBuilder) -> torch.Tensor:
        """Run the pending committed tokens; returns the draft logits for the root's children ``[V]``."""
        self._builder = builder
        self._slot = {}
        self._calls0 = self.kv.calls
        start = self.kv.length
        p = len(self.pending)
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        logits = self.kv.forward(self.pending, torch.arange(start, start + p), causal, start, last_only=True)
        self._base = start + p
        return logits[-1]

    def forward(self, nodes: Sequence[int]) -> torch.Tensor:
        """One draft call over ``nodes`` (drafted tree nodes); returns their logits ``[len(nodes), V]``.

        Every node's parent must already have been forwarded (or be the root): that is what makes
        the node exist in the first place, so level-by-level expansion satisfies it.
        """
        nodes = list(nodes)
        first_row = self.kv.length
        logits = self.kv.forward(*self._level(nodes), self._base)
        for r, node in enumerate(nodes):
            self._slot[node] = first_row + r
        return logits

    def _level(self, nodes: list[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """(tokens, positions, visible) of one draft call over ``nodes``: each node sees the
        expanded nodes among its ancestors (and itself), at position base - 1 + depth."""
        b = self._builder
        assert b is not None, "begin_round must be called first"
        cached = list(self._slot)  # expanded nodes, in cache-row order
        col = {node: j for j, node in enumerate(cached)}
        q = len(nodes)
        visible = torch.zeros(q, len(cached) + q, dtype=torch.bool)
        for r, node in enumerate(nodes):
            visible[r, len(cached) + r] = True
            a = b.parent[node]
            while a > 0:
                visible[r, col[a]] = True
                a = b.parent[a]
        positions = torch.tensor([b.depth[n] for n in nodes]) + (self._base - 1)
        return [b.tokens[n] for n in nodes], positions, visible

    def commit(self, accepted: Sequence[int], bonus: int, features: torch.Tensor | None = None) -> None:
        """Keep the rows of accepted drafted nodes (path order); queue the rest for the next round."""
        b = self._builder
        assert b is not None
        rows: list[int] = []
        for node in accepted:
            if node not in self._slot:
                break
            rows.append(self._slot[node])
        self.kv.compact(self._base, rows)
        self.pending = [b.tokens[n] for n in accepted[len(rows) :]] + [int(bonus)]
        self._builder = None


class FeatureDrafter(Drafter):
    """The drafter of a feature-conditioned draft (:mod:`dynatree.drafts.feature_head`).

    Every draft row of token j is computed from token j's embedding and the feature of its parent:

    * committed tokens use the *target's* features (from the prefill and the verify passes), so
      the cache holds only rows computed from exact features;
    * tree nodes use the draft's own *predicted* feature of their parent (the root's comes from
      the pending tokens' call), kept per node for the next level.

    Unlike :class:`Drafter`, :meth:`commit` keeps none of the tree's rows: accepted nodes were
    drafted from predicted features, so they are run again next round with the target's (one
    draft call over the accepted tokens + bonus, which is the call the round starts with anyway).
    """

    wants_features = True

    def __init__(self, kv: KVModel) -> None:
        super().__init__(kv)
        self.pending_features: torch.Tensor | None = None  # [len(pending), H]: each pending token's parent's
        self._pred: dict[int, torch.Tensor] = {}  # tree node -> predicted feature (root: 0)

    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        """``features``: the target's final hidden states of ``prompt[:-1]`` (its prefill)."""
        prompt = list(prompt)
        assert features is not None and len(features) == len(prompt) - 1, "the target's prompt features are needed"
        # token j reads token j-1's feature; the first token has no parent (zeros, as in training)
        parents = torch.cat([features.new_zeros(1, features.shape[-1]), features])
        if len(prompt) > 1:
            p = len(prompt) - 1
            start = self.kv.length
            self._call(prompt[:-1], torch.arange(start, start + p), torch.ones(p, p, dtype=torch.bool).tril(), start,
                       parents[:-1])
        self.pending, self.pending_features = [prompt[-1]], parents[-1:]

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

    def commit(self, accepted: Sequence[int], bonus: int, features: torch.Tensor | None = None) -> None:
        """``features``: the target's features of the root and the accepted nodes (path order),
        i.e. of the parents of the accepted nodes and of the bonus token."""
        b = self._builder
        assert b is not None and features is not None and len(features) == len(accepted) + 1
        self.kv.compact(self._base, [])
        self.pending = [b.tokens[n] for n in accepted] + [int(bonus)]
        self.pending_features = features
        self._builder, self._pred = None, {}

    def _call(self, tokens: Sequence[int], positions: torch.Tensor, visible: torch.Tensor, since: int,
              features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(full-vocabulary logits ``[q, V]``, predicted features ``[q, H]``) of one draft call."""
        out = self.kv.call(tokens, positions, visible, since, features=features.view(1, len(tokens), -1))
        return out.logits[0, :, : self.kv.vocab_size].float(), out.hidden_states[-1][0]
