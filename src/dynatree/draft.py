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

from .cache import CachedModel
from .tree import TreeBuilder


class Drafter:
    """Level-batched draft forwards with a tree mask, over the draft's :class:`CachedModel`."""

    def __init__(self, kv: CachedModel) -> None:
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
    def prefill(self, prompt: Sequence[int]) -> None:
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
        b = self._builder
        assert b is not None, "begin_round must be called first"
        nodes = list(nodes)
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
        first_row = self.kv.length
        logits = self.kv.forward([b.tokens[n] for n in nodes], positions, visible, self._base)
        for r, node in enumerate(nodes):
            self._slot[node] = first_row + r
        return logits

    def commit(self, accepted: Sequence[int], bonus: int) -> None:
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
