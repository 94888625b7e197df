"""The draft model and the text in one verified tree: no shipped engine merges the two per step.

Where the text is confident (its proposal's expected accepted length reaches
``TextDraft.confident``) the model is not called at all; elsewhere the model proposer grows its
tree (its policy decides the shape) and the text's proposal is merged into it under one root,
sharing the nodes the two agree on, cut by the same verify-cost rule as the text alone
(:func:`trim_merged`). Text nodes are never attached below a node whose children were *sampled*
(DySpec), which verification reads as all drawn from one distribution.

Where the text is unsure the model drafts only while it earns its calls (:class:`ModelGate`): a
round's model part costs its draft calls plus the verify rows it added, priced by the measured cost
curves of the draft (one call of a few rows) and the target (a verify of so many rows), in
one-row target steps (:func:`model_cost`). A draft a third of the target's size costs about a
third of a step a call; the embedded pair's 2-layer draft about a fifth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from dynatree import tuning
from dynatree.core.costmodel import CostProfile, choose_budget
from dynatree.core.proposer import Drafting, Outcome, Proposer, RunContext, run_drafting
from dynatree.core.tree import TreeBuilder, committed_tokens
from dynatree.drafts.feature import FeatureProposer
from dynatree.drafts.model import ModelProposer
from dynatree.drafts.model_gate import ModelGate
from dynatree.drafts.suffix import StepAcceptance, TextDraft, gains, text_cost, trim
from dynatree.drafts.suffix_index import Proposal


class HybridProposer(Proposer):
    """A draft model and the text in one tree (see the module docstring)."""

    name = "hybrid"

    @classmethod
    def accepts(cls, draft: Any) -> bool:
        return isinstance(draft, TextDraft) and draft.model is not None

    @classmethod
    def models(cls, draft: Any) -> list[torch.nn.Module]:
        return [draft.model]

    @classmethod
    def max_depth(cls, draft: Any) -> int:
        return draft.max_spec

    @classmethod
    def wants_cost_model(cls, draft: Any) -> bool:
        return draft.trim

    @classmethod
    def open(cls, draft: Any, context: RunContext) -> "HybridProposer":
        model = FeatureProposer if FeatureProposer.accepts(draft.model) else ModelProposer  # the model part's own proposer
        part = model.open(draft.model, context)
        return cls(draft, part, text_cost(draft, context), gate_costs(draft, part, context), context.max_new_tokens)

    def __init__(self, config: TextDraft, model: ModelProposer, cost: CostProfile | None = None,
                 gate_cost: tuple[CostProfile, CostProfile] | None = None, max_new_tokens: int = 0) -> None:
        self.config, self.model = config, model
        self.max_new_tokens = max_new_tokens  # (with gate_cost: what the draft's prompt window is weighed against)
        self.cost = cost if config.trim else None  # None: the text's nodes are kept whole
        self.gate_cost = gate_cost  # (the target's, the draft's) measured costs; None: min_gain a call
        self.wants_features = model.wants_features  # type: ignore[misc]
        self.feature_layers = model.feature_layers
        self.text = config.index()
        self.acceptance = StepAcceptance()
        self._proposal: Proposal | None = None  # this round's whole text proposal, for the calibration
        self._merged: Proposal | None = None  # the text nodes that joined the model's tree this round
        self._called = False  # whether the model drafted this round
        self.gate = ModelGate(min_gain=config.model_min_gain)

    @property
    def calls(self) -> int:
        return self.model.calls if self._called else 0

    @property
    def catching_up(self) -> bool:  # type: ignore[override]
        return self._called and self.model.catching_up

    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        self.text.start(list(prompt))
        if self.gate_cost is not None and self.max_new_tokens:
            self.model.window = prompt_window(*self.gate_cost, len(prompt), self.max_new_tokens)
        self.model.prefill(prompt, features)

    def propose(self, builder: TreeBuilder) -> None:
        run_drafting(self.drafting(builder))

    def drafting(self, builder: TreeBuilder) -> Drafting:
        proposal = self._proposal = self.text.propose(builder.cap(self.config.budget))
        # The raw score decides whether the model sits out, not the calibrated one: on a CPU the
        # cut then turns a confident-looking but refused text into a plain step, where the
        # calibrated score called the model instead (chat, 128 tokens, real pair: model rounds
        # 35 -> 84 of ~85, modeled verify cost per token 0.99 -> 1.13, the model's calls not counted).
        # Where the text is unsure, the model still drafts only while it earns its calls (ModelGate).
        self._called = proposal.score < self.config.confident and self.gate.should_call()
        rate = self.acceptance.rate
        if self._called:  # the text is unsure: the model drafts, the text joins in
            yield from self.model.drafting(builder)
            # the engine's largest verify call (the static engine's largest bucket) caps the merge
            if self.cost is not None:
                proposal = trim_merged(builder, proposal, self.cost, builder.max_rows, rate)
            merge(builder, proposal, builder.max_rows)
            self._merged = proposal
        else:
            if self.cost is not None:
                proposal = trim(proposal, self.cost, rate=rate)
            proposal.add_to(builder)

    def observe(self, outcome: Outcome) -> None:
        tokens = committed_tokens(outcome.tree, list(outcome.accepted), outcome.bonus)
        if self._proposal is not None and self.cost is not None:
            self.acceptance.learn(self._proposal, tokens)  # (the committed tokens are the target's, whoever drafted)
        if self._called and self._merged is not None:  # what the model added beyond the text's nodes
            cost = None
            if self.gate_cost is not None:
                text_rows = 1 + min(len(self._merged.tokens), outcome.tree.num_drafted)
                cost = model_cost(*self.gate_cost, self.model.call_rows, outcome.tree.size, text_rows)
            self.gate.observe(max(0, len(outcome.accepted) - self._merged.matched(tokens)), cost)
        self._proposal = self._merged = None
        self.text.commit(tokens)
        self.model.observe(outcome)

    def finish(self, length: int | None = None) -> None:
        self.text.finish(length=length)
        self.model.finish(length)

    def state(self) -> dict[str, float]:
        return self.model.state()


def model_cost(target: CostProfile, draft: CostProfile, call_rows: Sequence[int], rows: int, text_rows: int) -> float:
    """What a round's model part cost, in one-row target steps: its draft calls, each priced by its
    rows on the draft's curve (the first, over the tokens committed since the model last ran, can be
    long after a pause: the curve's slope past its last size prices it), and the verify rows the
    model added to the text's (``rows`` against ``text_rows``, root included)."""
    step = target.cost(1)
    return (sum(draft.cost(r) for r in call_rows) + max(target.cost(rows) - target.cost(text_rows), 0.0)) / step


def prompt_window(target: CostProfile, draft: CostProfile, prompt: int, new_tokens: int,
                  share: float = tuning.DRAFT_PREFILL_SHARE, least: int = tuning.DRAFT_MIN_WINDOW) -> int | None:
    """How many of the prompt's last tokens the draft model caches: all of them (None) while that
    costs at most ``share`` of plain decoding's run (the target's prefill of ``prompt`` tokens and
    ``new_tokens`` one-row steps, on the measured curves), else the most that fit in it, at least
    ``least``.

    Why: the draft's prefill is paid before its first proposal can say whether it agrees with the
    target. A large draft of a long prompt costs a share of the run no back-off can win back when
    it never agrees (a third of the target's prefill for a draft a third of its size). The text
    draft still reads the whole prompt; the model drafts from its recent part."""
    budget = share * (target.cost(prompt) + new_tokens * target.cost(1))
    if draft.cost(prompt) <= budget:
        return None
    lo, hi = least, prompt  # (the draft's curve rises with rows: the largest window within budget)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if draft.cost(mid) <= budget else (lo, mid - 1)
    return lo


def gate_costs(draft: TextDraft, part: Proposer, context: RunContext) -> tuple[CostProfile, CostProfile] | None:
    """The measured (target, draft) cost curves the gate prices the model's calls by, or None (the
    cost model off, a batch's shared draft cache, a feature draft whose calls need the target's
    features, or the gate switched off): the gate then counts ``model_min_gain`` tokens a call."""
    from dynatree.core.costmodel import profile_for
    from dynatree.runtime.engines import notice

    kv = getattr(part, "kv", None)
    if draft.model_min_gain == 0 or context.draft_kv is not None or not isinstance(part, ModelProposer) \
            or isinstance(part, FeatureProposer) or kv is None or kv.length:
        return None
    target = context.cost_profile()
    if target is None:
        return None
    o = context.options
    cost = profile_for(kv, draft.model, part.draft_engine(o), o.compile, False, o.buckets,
                       o.linear_plan.kernels() if o.linear_plan else False, log=notice, role="draft")
    return None if cost is None else (target, cost)


def merge(builder: TreeBuilder, proposal: Proposal, max_rows: int | None = None) -> int:
    """Add ``proposal``'s nodes to ``builder`` under the root, reusing a node where the tree
    already has that token under that parent; a node's subtree is dropped where its parent's
    children were sampled (DySpec), and where the tree already has ``max_rows`` rows (root
    included: the static engine's largest bucket). Returns the number of nodes added."""
    return len(_merge(builder, proposal, max_rows))


def _merge(builder: TreeBuilder, proposal: Proposal, max_rows: int | None, apply: bool = True) -> list[int]:
    """:func:`merge`; returns the proposal indices of the nodes it adds, in order. ``apply=False``
    changes nothing: it says which nodes a merge would add."""
    children: dict[tuple[int, int], int] = {(p, t): i for i, (p, t) in enumerate(zip(builder.parent, builder.tokens)) if i}
    where: list[int | None] = []
    added: list[int] = []
    size = len(builder.tokens)
    for i, (parent, token, logq) in enumerate(zip(proposal.parents, proposal.tokens, proposal.logprobs)):
        at = 0 if parent < 0 else where[parent]
        if at is None or at in builder.child_q:
            where.append(None)
            continue
        node = children.get((at, token))
        if node is None and max_rows is not None and size >= max_rows:
            where.append(None)  # (best-first: what is left is less likely, and its subtree goes too)
            continue
        if node is None:
            node = builder.add(at, token, logq) if apply else size
            size += 1
            children[(at, token)] = node
            added.append(i)
        where.append(node)
    return added


def trim_merged(builder: TreeBuilder, proposal: Proposal, cost: CostProfile, max_rows: int | None = None,
                rate: float = 1.0) -> Proposal:
    """The best-first prefix of ``proposal`` whose :func:`merge` into ``builder`` (the draft
    model's tree) maximises expected committed tokens per unit of verify cost. The tree's own nodes
    are rows already paid for and their path probabilities (the draft model's, capped at 1) the
    round's expected tokens so far; a text node the tree already has adds neither a row nor a gain;
    each node the merge would add costs a row and gains its text path probability calibrated by
    ``rate`` (:func:`gains`). A merge decides
    each node from the nodes before it only, so merging the returned prefix adds exactly the
    first chosen nodes of the whole proposal's merge. ``builder`` is not changed."""
    added = _merge(builder, proposal, max_rows, apply=False)
    if not added:
        return proposal
    base = 1.0 + sum(min(1.0, math.exp(lq)) for lq in builder.cum_logq[1:])
    node_gains = gains(proposal, rate)
    keep = choose_budget(cost, [node_gains[i] for i in added], base=base, rows=len(builder))
    return proposal if keep == len(added) else proposal.head(added[keep])
