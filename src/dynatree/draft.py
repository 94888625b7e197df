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

from .cache import cache_length, compact, new_cache
from .tree import TreeBuilder, attention_mask


class Drafter:
    """Level-batched draft forwards with a tree mask, over an unmodified HF causal LM."""

    def __init__(self, model: torch.nn.Module, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = new_cache(model)
        self.pending: list[int] = []
        self.calls = 0
        self._builder: TreeBuilder | None = None
        self._base = 0  # cache rows belonging to committed tokens (incl. pending) this round
        self._slot: dict[int, int] = {}  # tree node -> cache row, for expanded drafted nodes

    # ----------------------------------------------------------------------------------- setup
    def prefill(self, prompt: Sequence[int]) -> None:
        """Cache all prompt tokens but the last; the last becomes the first round's root."""
        prompt = list(prompt)
        if len(prompt) > 1:
            self._forward(torch.tensor([prompt[:-1]], device=self.device), None, None, keep_last=True)
        self.pending = [prompt[-1]]

    # ---------------------------------------------------------------------------- per round
    def begin_round(self, builder: TreeBuilder) -> torch.Tensor:
        """Run the pending committed tokens; returns the draft logits for the root's children ``[V]``."""
        self._builder = builder
        self._slot = {}
        self.calls = 0
        start = cache_length(self.cache)
        p = len(self.pending)
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        mask = attention_mask(causal, start, self.dtype, self.device)
        pos = torch.arange(start, start + p, device=self.device).view(1, -1)
        logits = self._forward(torch.tensor([self.pending], device=self.device), mask, pos, keep_last=True)
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
        anc = torch.zeros(q, len(cached) + q, dtype=torch.bool)
        for r, node in enumerate(nodes):
            anc[r, len(cached) + r] = True
            a = b.parent[node]
            while a > 0:
                anc[r, col[a]] = True
                a = b.parent[a]
        mask = attention_mask(anc, self._base, self.dtype, self.device)
        depth = torch.tensor([b.depth[n] for n in nodes], device=self.device)
        pos = (depth + (self._base - 1)).view(1, -1)
        tokens = torch.tensor([[b.tokens[n] for n in nodes]], device=self.device)
        first_row = cache_length(self.cache)
        logits = self._forward(tokens, mask, pos, keep_last=False)
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
        compact(self.cache, self._base, rows)
        self.pending = [b.tokens[n] for n in accepted[len(rows) :]] + [int(bonus)]
        self._builder = None

    # ------------------------------------------------------------------------------ helpers
    def _forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None,
        pos: torch.Tensor | None,
        keep_last: bool,
    ) -> torch.Tensor:
        self.calls += 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1 if keep_last else 0,
        )
        return out.logits[0, :, : self.vocab_size].float()
