"""The model draft source: runs a draft model level by level over a growing tree, and keeps its KV cache.

A policy decides *which* nodes to expand; the drafter turns "expand these nodes" into ONE draft
forward over all of them, with a tree mask so each node attends to the committed prefix, its own
ancestors and itself only. Draft cache layout during a round::

    [committed tokens already cached | pending committed tokens (end with the root) | expanded nodes in call order]

Only expanded nodes get draft KV rows (leaves are never run through the draft). After the target
decides, :meth:`ModelProposer.commit` keeps the rows of accepted nodes that have them; accepted tokens
without rows, plus the bonus token, become the pending tokens run at the start of the next round.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import torch

from typing import Any

from dynatree.core.kv import KVModel
from dynatree.core.proposer import DraftCall, Drafting, Outcome, Proposer, RunContext, TreeShape, run_drafting
from dynatree.core.sampling import DraftSampler
from dynatree.core.tree import TokenTree, TreeBuilder, committed_tokens
from dynatree.errors import DynaTreeError
from dynatree.policies.base import RoundFeedback
from dynatree.runtime.cache import StaticCachedModel, vocab_size
from dynatree.runtime.engines import cached_model
from dynatree.runtime.streaming import StreamingKV, find_rope


class ModelProposer(Proposer):
    """Level-batched draft forwards with a tree mask, over the draft's :class:`~dynatree.core.kv.KVModel`;
    the tree's shape is its policy's (linear, fixed, DynaTree, DySpec, ...), which calls back
    :meth:`forward` for the levels it expands.

    Drives any causal LM over the target's vocabulary (the registry's fallback for modules)."""

    name = "model"

    @classmethod
    def accepts(cls, draft: Any) -> bool:
        return isinstance(draft, torch.nn.Module)

    @classmethod
    def models(cls, draft: Any) -> list[torch.nn.Module]:
        return [draft]

    @classmethod
    def open(cls, draft: Any, context: RunContext) -> "ModelProposer":
        check_vocab(context.target, draft, context.allow_vocab_mismatch)
        return cls(open_kv(draft, context, cls.draft_engine(context.options)), *shape(context))

    def __init__(self, kv: KVModel, policy: TreeShape | None = None, sampler: DraftSampler | None = None) -> None:
        self.kv = kv
        self.policy = policy  # the tree's shape (None: this drafter is driven by hand, level by level)
        self.sampler = sampler  # the run's draft sampler, for policies that sample children
        self.pending: list[int] = []
        self._prompt: list[int] | None = None  # a prompt not yet cached (prefill waits for the first draft)
        self._root_logits: torch.Tensor | None = None  # the prefill's prediction for the first root's children
        self._builder: TreeBuilder | None = None
        self._calls0 = 0
        self._base = 0  # cache rows belonging to committed tokens (incl. pending) this round
        self._slot: dict[int, int] = {}  # tree node -> cache row, for expanded drafted nodes
        self.catching_up = False
        self.call_rows: list[int] = []  # this round's draft calls, rows each (the prompt's not counted)
        self.window: int | None = None  # the most prompt tokens the draft caches (the last ones); None: all

    @property
    def calls(self) -> int:
        """Draft forwards in the current round."""
        return self.kv.calls - self._calls0

    # ----------------------------------------------------------------------------------- setup
    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Take the prompt; the first round that drafts caches it (:meth:`begin_round`), every
        prompt token, the first round's root (the last) included: the prefill's own last row is the
        draft's prediction for the root's children, so the first round starts without a draft call
        of its own.

        Why wait: a run may never draft (a wide batch whose share is one row per row, a hybrid
        whose text stays confident, a back-off that pauses from the start), and then the draft's
        prefill is all it would have paid for. A round that does draft runs the same calls an
        eager prefill would have (the prompt, then the tokens committed since), so the draft's
        cache and logits do not depend on when it happens.

        With :attr:`window` set the draft caches only the prompt's last ``window`` tokens, at
        positions from 0 (rotary and learned positions alike see a shorter document, not a shifted
        one): a draft whose prefill would cost more than the run can win back drafts from the
        recent text alone. The target still sees everything, so the output does not change."""
        prompt = list(prompt)
        if self.window is not None and len(prompt) > self.window:
            prompt = prompt[-self.window:]
        self._prompt, self._root_logits = prompt, None
        self.pending = []

    # ---------------------------------------------------------------------------- per round
    def propose(self, builder: TreeBuilder) -> None:
        run_drafting(self.drafting(builder))

    def drafting(self, builder: TreeBuilder) -> Drafting:
        """The round's draft calls as steps: the pending committed tokens (in the first round that
        drafts, the prompt before them), then each level the policy grows."""
        if self.policy is None:
            raise DynaTreeError("this drafter has no tree shape (open it with a policy in its RunContext)")
        root_logits = yield from self._begin(builder)
        levels = self.policy.grow(builder, self, root_logits)
        try:
            nodes = next(levels)
            while True:
                logits = yield from self._level_call(nodes)
                nodes = levels.send(logits)
        except StopIteration:
            return

    def observe(self, outcome: Outcome) -> None:
        """Bring the cache in line (:meth:`commit`); the policy learns from a round it drafted
        (history adaptation)."""
        self.commit(outcome.tree, outcome.accepted, outcome.bonus, outcome.features)
        if outcome.drafted and self.policy is not None:
            self.policy.observe(RoundFeedback(drafted=outcome.tree.num_drafted, accepted=len(outcome.accepted),
                                              overhead_ms=outcome.overhead_ms))

    def state(self) -> dict[str, float]:
        return self.policy.state() if self.policy is not None else {}

    def begin_round(self, builder: TreeBuilder) -> torch.Tensor:
        """Run the pending committed tokens; returns the draft logits for the root's children ``[V]``
        (after the prefill nothing is pending: the prefill's logits)."""
        return run_drafting(self._begin(builder))

    def _begin(self, builder: TreeBuilder) -> Generator[DraftCall, torch.Tensor, torch.Tensor]:
        """:meth:`begin_round` as steps."""
        self._builder = builder
        self._slot = {}
        self.catching_up = self._prompt is not None
        if self._prompt is not None:  # (the prefill waited for this first drafting round)
            self._root_logits = yield DraftCall.prompt(self.kv, self._prompt)
            self._prompt = None
        self._calls0 = self.kv.calls
        self.call_rows = []
        start = self.kv.length
        if not self.pending and self._root_logits is not None:
            self._base, logits, self._root_logits = start, self._root_logits, None
            return logits
        p = len(self.pending)
        self.call_rows.append(p)
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        logits = yield DraftCall(self.kv, list(self.pending), torch.arange(start, start + p), causal, start,
                                 last_only=True)
        self._base = start + p
        return logits[-1]

    def forward(self, nodes: Sequence[int]) -> torch.Tensor:
        """One draft call over ``nodes`` (drafted tree nodes); returns their logits ``[len(nodes), V]``.

        Every node's parent must already have been forwarded (or be the root): that is what makes
        the node exist in the first place, so level-by-level expansion satisfies it.
        """
        return run_drafting(self._level_call(nodes))

    def _level_call(self, nodes: Sequence[int]) -> Generator[DraftCall, torch.Tensor, torch.Tensor]:
        """:meth:`forward` as a step: the nodes' cache rows are theirs once the call has run."""
        nodes = list(nodes)
        self.call_rows.append(len(nodes))
        first_row = self.kv.length
        logits = yield DraftCall(self.kv, *self._level(nodes), self._base)
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

    def commit(self, tree: TokenTree, accepted: Sequence[int], bonus: int, features: torch.Tensor | None = None) -> None:
        """Keep the rows of accepted drafted nodes (path order); queue the rest for the next round.

        A round in which the draft was never called (another source decided the tree) queues
        every committed token: they are run at the start of the next round that calls the draft."""
        b = self._builder
        if b is None:
            self.pending += committed_tokens(tree, list(accepted), bonus)
            return
        rows: list[int] = []
        for node in accepted:
            if node not in self._slot:
                break
            rows.append(self._slot[node])
        self.kv.compact(self._base, rows)
        self.pending = [b.tokens[n] for n in accepted[len(rows) :]] + [int(bonus)]
        self._builder = None


def shape(context: RunContext) -> tuple[TreeShape | None, DraftSampler | None]:
    """The context's policy, set up for this run (its per-generation history reset; the measured
    verify-cost profile handed over when it sizes its trees by it), and the run's sampler."""
    policy = context.policy
    if policy is not None:
        policy.reset()
        if policy.wants_cost_model():
            profile = context.cost_profile()
            if profile is not None:
                policy.use_cost_model(profile)
    return policy, context.sampler


def open_kv(draft: torch.nn.Module, context: RunContext, engine: str) -> KVModel:
    """The draft's model+cache for one generation: room for the committed tokens plus several
    levels of expanded nodes; wrapped for KV eviction when the run evicts. In a batch, the row's
    part of the batch's shared draft cache (``context.draft_kv``)."""
    if context.draft_kv is not None:
        return context.draft_kv(draft)
    kv: KVModel = cached_model(draft, context.vocab, engine, draft_rows(context.rows),
                               context.options.cache_options(context.target_kv.device.type), pool=context.options.pool)
    if context.streaming is not None:
        kv = StreamingKV(kv, context.streaming, find_rope(draft))
    return kv


def draft_rows(rows: int) -> int:
    """A draft cache's capacity for runs of ``rows`` committed tokens: several levels of expanded
    nodes of the largest tree bucket on top."""
    return rows + 4 * StaticCachedModel.BUCKETS[-1]


def check_vocab(target: torch.nn.Module, draft: torch.nn.Module, allow: bool) -> None:
    vt, vd = vocab_size(target), vocab_size(draft)
    if vt != vd and not allow:
        raise DynaTreeError(
            f"draft vocabulary ({vd} tokens) differs from the target's ({vt}); the models must share a "
            "tokenizer (pass allow_vocab_mismatch=True / --allow-vocab-mismatch if you know the ids agree)"
        )
