"""The text as a draft: a suffix index over the prompt and the output so far.

:class:`TextProposer` drafts with no draft model at all (``generate(target, None, ids)``): each
round's tree is the index's best-first proposal (SuffixDecoding's idea: the longest suffix of the
text that occurred before, and the continuations that followed it, with count-based
probabilities). :class:`TextDraft` configures it, and with ``model=`` asks for the draft model and
the text in one tree (:mod:`dynatree.drafts.hybrid`).

Both cut the text's proposal to the best-first prefix that maximises expected committed tokens per
unit of verify cost (:func:`trim`, with ``TextDraft(trim=True)``, the default). The gains are the
proposal's path probabilities, calibrated by :class:`StepAcceptance`: count ratios call a
continuation seen once certain, and on the instruct sets the raw path probabilities promised 4.5-6x
the tokens chat and math prompts accepted, so uncalibrated they cut almost nothing. The cost curve
is the target's measured profile when the cost model is on (``DYNATREE_COST_MODEL=on``) and
otherwise a default relative curve for the device (``tuning.TEXT_COST_CURVE``). On a CPU, where a
verify of 17 rows costs ~3 plain steps, an unsure proposal's tail (or all of it) is dropped and a
confident one stays deep; on a GPU, where rows are nearly free, nothing is cut. In a hybrid round
the text nodes merged into the model's tree are cut by the same rule, the model's nodes counting
as rows already paid for.

Suffix children are deterministic proposals (chosen by counts, not drawn), which lossless sampling
verifies with q = 1, so both sources are exact at any temperature. Text nodes are never attached
below a node whose children were *sampled* (DySpec), which verification reads as all drawn from
one distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dynatree.core.costmodel import CostProfile, choose_budget
from dynatree.core.proposer import Outcome, Proposer, RunContext
from dynatree.core.tree import TreeBuilder, committed_tokens
from dynatree.drafts.suffix_index import Proposal, SuffixCache, TextIndex
from dynatree import tuning
from dynatree.errors import check


@dataclass(frozen=True)
class TextDraft:
    """How to draft from the text: pass as ``draft=`` (or ``draft=None`` for these defaults), or
    wrap a draft model with ``model=`` for one tree from both sources.

    ``budget``: most text nodes per round; ``min_prob``, ``alpha``, ``max_spec``: the suffix
    proposal's probability floor and depth cap ``min(max_spec, ceil(alpha * match_len))``;
    ``confident``: with a model, the expected accepted length (sum of the proposal's path
    probabilities) from which the model sits the round out; ``trim``: cut each round's text
    nodes to the count that maximises expected committed tokens per unit of verify cost, the
    path probabilities calibrated by the acceptance the text has earned so far (:func:`trim`,
    :class:`StepAcceptance`; False: always up to ``budget`` nodes, as before the cut existed);
    ``cache``: a :class:`SuffixCache` shared across requests (chat turns, the prompts of a bench
    run), or None; ``model_min_gain``: with a model, the tokens per call it must add beyond the
    text's own nodes to keep drafting where the text is unsure (:class:`ModelGate`; 0: always).
    """

    model: torch.nn.Module | None = None
    budget: int = tuning.TEXT_BUDGET
    min_prob: float = tuning.TEXT_MIN_PROB
    alpha: float = tuning.TEXT_ALPHA
    max_spec: int = tuning.TEXT_MAX_SPEC
    confident: float = tuning.TEXT_CONFIDENT
    trim: bool = True
    model_min_gain: float = tuning.TEXT_MODEL_MIN_GAIN
    cache: SuffixCache | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check(isinstance(self.budget, int) and self.budget >= 1, "budget", "an integer >= 1", self.budget)
        check(0.0 <= self.min_prob <= 1.0, "min_prob", "a number in [0, 1]", self.min_prob)
        check(self.alpha > 0, "alpha", "a number > 0", self.alpha)
        check(isinstance(self.max_spec, int) and self.max_spec >= 1, "max_spec", "an integer >= 1", self.max_spec)
        check(self.confident >= 0, "confident", "a number >= 0", self.confident)
        check(isinstance(self.trim, bool), "trim", "True or False", self.trim)
        check(self.model_min_gain >= 0, "model_min_gain", "a number >= 0", self.model_min_gain)

    def index(self) -> TextIndex:
        return TextIndex(self.cache, min_prob=self.min_prob, alpha=self.alpha, max_spec=self.max_spec)

    def cost_curve(self, device: str) -> CostProfile | None:
        """What :func:`trim` weighs rows by before (or without) a measured profile: the device's
        default relative curve (``tuning.TEXT_COST_CURVE``); None when trimming is off or the
        device has no curve (the proposal is then kept whole)."""
        if not self.trim or device not in tuning.TEXT_COST_CURVE:
            return None
        rows, cost = tuning.TEXT_COST_CURVE[device]
        return CostProfile(rows, cost, meta={"source": f"tuning.TEXT_COST_CURVE[{device!r}]"})


class StepAcceptance:
    """How often the target takes the text's next token, relative to the text's own estimate.

    Model: a node at depth d is accepted with probability ``min(1, path probability * rate^d)``,
    i.e. every step down the tree is taken with the proposal's conditional probability times a
    per-step ``rate``. The estimate of ``rate`` is successes over exposure: walking each round's
    *whole* proposal (before any cut) down the tokens the round committed (all of them the
    target's own), every node reached with its next token known adds the summed conditional
    probabilities of its children to the exposure, and a child equal to that token one success.
    Both are decayed by ``decay`` per round that offered a step (a memory of ~1 / (1 - decay) such
    rounds) on top of one pseudo-step at rate 1, so a fresh request trusts the counts until it has
    seen otherwise. The whole proposal is walked so that a round cut to nothing (a plain step)
    still teaches: its bonus token says whether the first level would have been taken.
    """

    def __init__(self, decay: float = tuning.TEXT_CALIBRATION_DECAY) -> None:
        check(0.0 <= decay < 1.0, "decay", "a number in [0, 1)", decay)
        self.decay = decay
        self.successes, self.exposure = 1.0, 1.0

    @property
    def rate(self) -> float:
        return min(max(self.successes / self.exposure, 0.01), 1.0)

    def learn(self, proposal: Proposal, committed: Sequence[int]) -> None:
        kids: dict[int, list[int]] = {}
        for i, parent in enumerate(proposal.parents):
            kids.setdefault(parent, []).append(i)
        node, successes, exposure = -1, 0, 0.0
        for token in committed:
            children = kids.get(node)
            if not children:
                break
            exposure += sum(math.exp(proposal.logprobs[c]) for c in children)
            node = next((c for c in children if proposal.tokens[c] == token), -2)
            if node == -2:
                break
            successes += 1
        if exposure > 0:  # (a round that offered nothing, an empty proposal, says nothing)
            self.successes = self.decay * self.successes + successes
            self.exposure = self.decay * self.exposure + exposure


def gains(proposal: Proposal, rate: float = 1.0) -> list[float]:
    """Each node's expected gain: its path probability times ``rate`` per level, at most 1."""
    if rate == 1.0:
        return proposal.path_probs()
    return [min(1.0, p * rate ** d) for p, d in zip(proposal.path_probs(), proposal.depths())]


def trim(proposal: Proposal, cost: CostProfile, base: float = 1.0, rows: int = 1, rate: float = 1.0) -> Proposal:
    """The best-first prefix of ``proposal`` that maximises expected committed tokens per unit of
    verify cost: ``(base + sum of the first n gains) / cost(rows + n)``, the gains being the path
    probabilities calibrated by ``rate`` (:func:`gains`, :class:`StepAcceptance`)
    (:func:`~dynatree.core.costmodel.choose_budget`; the smallest such n on ties). ``base`` and
    ``rows``: what the round already holds (a bare root: 1 expected token, 1 row). A prefix of a
    best-first proposal is a valid tree (parents come before their children)."""
    if not len(proposal):
        return proposal
    return proposal.head(choose_budget(cost, gains(proposal, rate), base=base, rows=rows))


class TextProposer(Proposer):
    """Speculation with no draft model: the tree is the suffix index's proposal."""

    name = "suffix"

    @classmethod
    def accepts(cls, draft: Any) -> bool:
        return draft is None or (isinstance(draft, TextDraft) and draft.model is None)

    @classmethod
    def max_depth(cls, draft: Any) -> int:
        return (draft or TextDraft()).max_spec

    @classmethod
    def wants_cost_model(cls, draft: Any) -> bool:
        return (draft or TextDraft()).trim

    @classmethod
    def open(cls, draft: Any, context: RunContext) -> "TextProposer":
        config = draft if draft is not None else TextDraft()
        return cls(config, text_cost(config, context))

    def __init__(self, config: TextDraft, cost: CostProfile | None = None) -> None:
        self.config = config
        self.cost = cost if config.trim else None  # None: every proposal is kept whole
        self.text = config.index()
        self.acceptance = StepAcceptance()
        self._proposal: Proposal | None = None  # this round's whole proposal, for the calibration

    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        self.text.start(list(prompt))

    def propose(self, builder: TreeBuilder) -> None:
        proposal = self._proposal = self.text.propose(builder.cap(self.config.budget))
        if self.cost is not None:
            proposal = trim(proposal, self.cost, rate=self.acceptance.rate)
        proposal.add_to(builder)

    def observe(self, outcome: Outcome) -> None:
        tokens = committed_tokens(outcome.tree, list(outcome.accepted), outcome.bonus)
        if self._proposal is not None and self.cost is not None:
            self.acceptance.learn(self._proposal, tokens)
        self._proposal = None  # (a plain step the back-off took drafted nothing)
        self.text.commit(tokens)

    def finish(self, length: int | None = None) -> None:
        self.text.finish(length=length)  # into the cross-request cache, when there is one


def text_cost(config: TextDraft, context: RunContext) -> CostProfile | None:
    """The curve the text's proposals are cut by: the target's measured verify-cost profile when the
    cost model is on and measured one, else the device's default relative curve (None: no cut)."""
    if not config.trim:
        return None
    profile = context.cost_profile()
    return profile if profile is not None else config.cost_curve(context.target_kv.device.type)
