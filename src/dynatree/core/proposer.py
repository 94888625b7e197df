"""The drafting seam: a :class:`Proposer` grows each round's token tree; the loop calls nothing else.

One proposer per draft kind, one file each (:mod:`dynatree.drafts`): a draft model, a
feature-conditioned head, the text itself (a suffix index over the prompt and the output so far),
a draft model and the text in one tree. :func:`dynatree.drafts.registry.open_proposer` picks the
kind for the ``draft`` argument and opens it once per generation with a frozen :class:`RunContext`;
the loop then calls, in this order,

1. :meth:`Proposer.prefill` with the prompt,
2. per round :meth:`Proposer.propose` (grow the tree under the root) and :meth:`Proposer.observe`
   (what the target committed: bring the draft's state in line, learn from it),
3. :meth:`Proposer.finish` when the generation ends,

and reads two statistics, :attr:`Proposer.calls` and :meth:`Proposer.state`. It never asks which
kind it holds.

How a *model* proposer shapes its tree (linear chain, fixed tree, DynaTree, DySpec and its
threshold variant) is a tree-shaping policy (:mod:`dynatree.policies`) it receives in the context;
the policy yields the levels it wants drafted (:data:`Levels`) and receives their draft logits.

A batch's rows each have their own proposer. So that their draft-model calls run as ONE forward
per step rather than one per row, a proposer may also grow its tree as a generator,
:meth:`Proposer.drafting`, that yields each :class:`DraftCall` it waits on and receives its result:
the batch's loop runs a step's calls of every row together (:func:`run_calls`), a single prompt's
:meth:`Proposer.propose` runs each as it comes (:func:`run_drafting`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch

from dynatree.core.costmodel import CostProfile
from dynatree.core.kv import KVModel
from dynatree.core.sampling import DraftSampler, SamplingConfig
from dynatree.core.tree import TokenTree, TreeBuilder

if TYPE_CHECKING:  # (options imports nothing of the package's core: no cycle)
    from dynatree.options import EngineOptions


#: A policy's tree growth (:meth:`dynatree.policies.DraftPolicy.grow`): yields the tree nodes of
#: each level it wants drafted, receives their draft logits ``[len(nodes), V]``.
Levels = Generator[list[int], torch.Tensor, None]


@dataclass(frozen=True)
class DraftCall:
    """One draft-model call a proposer waits on: ``tokens`` at ``positions`` on ``kv``, seeing every
    cached row before ``since`` and, from there on, the rows marked in ``visible`` (the convention
    of :meth:`~dynatree.core.kv.KVModel.forward`); its result is their float logits ``[q, V]``
    (``[1, V]`` with ``last_only``). ``prefill``: the tokens are a prompt cached causally
    (:meth:`~dynatree.core.kv.KVModel.prefill`), the result the last token's logits ``[V]``.

    A call is data, not an act, so that calls of several rows on one shared batched cache
    (``kv.shared``: :mod:`dynatree.runtime.batch_draft`) can run as one forward (:func:`run_calls`)."""

    kv: KVModel
    tokens: Sequence[int]
    positions: torch.Tensor
    visible: torch.Tensor
    since: int
    last_only: bool = False
    prefill: bool = False

    @classmethod
    def prompt(cls, kv: KVModel, tokens: Sequence[int]) -> "DraftCall":
        """A prompt's prefill on ``kv``: a causal chain after the cached rows, which every cache
        builds for itself (no positions or mask are carried)."""
        return cls(kv, list(tokens), torch.empty(0, dtype=torch.long), torch.empty(0, 0, dtype=torch.bool), kv.length,
                   prefill=True)

    def run(self) -> torch.Tensor:
        """Run this call alone on its cache."""
        if self.prefill:
            logits = self.kv.prefill(self.tokens, logits=True)
            assert logits is not None
            return logits
        return self.kv.forward(self.tokens, self.positions, self.visible, self.since, last_only=self.last_only)


#: A proposer's tree growth as steps (:meth:`Proposer.drafting`): yields each draft call it waits
#: on, receives that call's result.
Drafting = Generator[DraftCall, torch.Tensor, None]


def run_calls(calls: Sequence[DraftCall]) -> list[torch.Tensor]:
    """Each call's result, in order. Calls whose caches share one batched store (``kv.shared``, one
    per draft model in a batch) run together, in one forward per store where the store finds it
    pays (``shared.run``); every other call runs alone."""
    out: list[torch.Tensor | None] = [None] * len(calls)
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, call in enumerate(calls):
        shared = getattr(call.kv, "shared", None)
        if shared is None:
            out[i] = call.run()
        else:
            groups.setdefault(id(shared), (shared, []))[1].append(i)
    for shared, idx in groups.values():
        for i, result in zip(idx, shared.run([calls[i] for i in idx])):
            out[i] = result
    return out  # type: ignore[return-value]


T = TypeVar("T")


def drive(steps: Generator[Any, Any, T], answer: Callable[[Any], Any]) -> T:
    """Run a generator of requests to its end, sending each yielded request's ``answer`` back;
    returns what the generator returns."""
    try:
        request = next(steps)
        while True:
            request = steps.send(answer(request))
    except StopIteration as stop:
        return stop.value


def run_drafting(steps: Generator[DraftCall, torch.Tensor, T]) -> T:
    """Drive steps (a proposer's :meth:`Proposer.drafting`) to their end, each call run as it
    comes; returns what the steps return."""
    return drive(steps, DraftCall.run)


class LevelDrafter(Protocol):
    """What a tree-shaping policy reads of its drafter: the run's sampler for policies that
    *sample* children (DySpec) instead of taking the draft's top tokens; and, for a policy driven
    level by level at once (:meth:`dynatree.policies.DraftPolicy.build`), one draft forward over
    the given tree nodes (all their parents already run)."""

    sampler: DraftSampler | None

    def forward(self, nodes: Sequence[int]) -> torch.Tensor:
        """Draft logits ``[len(nodes), V]`` for the children of ``nodes``."""
        ...


class TreeShape(Protocol):
    """A tree-shaping policy as a model proposer sees it (:class:`dynatree.policies.DraftPolicy`)."""

    name: ClassVar[str]

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels: ...

    def build(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> None: ...

    def observe(self, feedback: Any) -> None: ...

    def state(self) -> dict[str, float]: ...

    def reset(self) -> None: ...

    def wants_cost_model(self) -> bool: ...

    def use_cost_model(self, profile: CostProfile | None) -> None: ...


@dataclass(frozen=True)
class RunContext:
    """Everything one generation was set up with, decided once by :func:`dynatree.generate` and
    read by the loop and, through :func:`~dynatree.drafts.registry.open_proposer`, by the proposer.
    Frozen: nothing in a run rewrites what it was set up with (the random generator, the back-off
    controller and the callback are objects the run uses, not settings).

    The proposer's part: the target and its cache, the logits width, the resolved engine
    ``options``, ``rows`` (prompt + max_new_tokens: the most committed tokens a cache must hold),
    ``streaming`` (a StreamingConfig under KV eviction), ``policy`` (the tree shape a model proposer
    grows; None for proposers without a model), ``sampler`` (the run's draft sampler when the policy
    samples children) and ``cost_profile`` (the target's measured verify-cost profile, measured on
    first call, which takes seconds, and only when the cost model is on; a proposer asks for it in
    ``open``, after its own checks, so a refused draft costs no measurement).

    The loop's part: ``strategy`` (the policy's name, for the statistics), ``max_new_tokens``,
    ``stop`` (EOS ids), ``stop_text`` (the stop-string matcher, or None), ``sampling``, ``rng`` (a
    single prompt's generator; a batch's rows carry their own), ``tree_order``, ``lazy_head``,
    ``screened_head`` (greedy acceptance reads the head's argmax through its int8 screen),
    ``sync`` (the tensor-parallel rank sync, or None), ``on_round``, ``backoff`` (this call's
    controller, or None), ``shared_random`` (the trees themselves are drawn from the run's random
    stream: DySpec), and a batch's ``pad_token_id``, ``tree_rows`` (the verify rows a sampled batch's rows
    share; a greedy batch chooses its share per round from the cost curve) and ``draft_kv`` (its
    rows' shared draft caches).
    """

    target: torch.nn.Module
    target_kv: KVModel
    vocab: int  # the target's logits width
    options: "EngineOptions"  # resolved engine options
    rows: int  # prompt + max_new_tokens: the most committed tokens a cache must hold
    streaming: Any = None  # a StreamingConfig when KV eviction is on, else None
    allow_vocab_mismatch: bool = False
    policy: TreeShape | None = None
    sampler: DraftSampler | None = None
    cost_profile: Callable[[], CostProfile | None] = lambda: None
    strategy: str = ""
    max_new_tokens: int = 0
    stop: frozenset[int] = frozenset()
    stop_text: Any = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rng: torch.Generator | None = None
    tree_order: str = "bfs"
    lazy_head: bool = False
    screened_head: bool = False
    sync: Any = None
    on_round: Callable[[Any], None] | None = None
    backoff: Any = None
    shared_random: bool = False
    pad_token_id: int = 0
    tree_rows: int = 0
    #: a batch's shared draft caches: a model proposer takes its row's draft cache from
    #: ``draft_kv(draft_model)`` (:class:`~dynatree.runtime.batch_draft.BatchDrafts`) instead of
    #: opening one of its own, so the rows' draft calls can run as one forward. None: its own.
    draft_kv: Callable[[torch.nn.Module], KVModel] | None = None


@dataclass(frozen=True)
class Outcome:
    """One round as the target decided it: ``tree`` as verified, its ``accepted`` nodes (path
    order), the ``bonus`` token, and with :attr:`Proposer.wants_features` the target's features of
    the root and the accepted nodes. ``drafted``: whether the tree came from :meth:`Proposer.propose`
    (False: the loop took a plain step: the back-off's choice, or a call's last token);
    ``overhead_ms``: the round's time outside the target's forward so far (drafting and committing
    the target's cache), which cost-model budgets weigh."""

    tree: TokenTree
    accepted: Sequence[int]
    bonus: int
    features: torch.Tensor | None = None
    drafted: bool = True
    overhead_ms: float = 0.0


class Proposer(ABC):
    """Grows each round's tree; keeps whatever per-generation state it needs (a KV cache, an index)."""

    #: the registry name (:mod:`dynatree.drafts.registry`), shown in errors and statistics
    name: ClassVar[str]
    #: whether the loop must hand over the target's features of the prompt (:meth:`prefill`) and
    #: of every round's root and accepted nodes (:class:`Outcome`)
    wants_features: ClassVar[bool] = False
    #: with :attr:`wants_features`: the target's decoder layers whose outputs make the features,
    #: concatenated (EAGLE-3's fused layers); empty = the target's final hidden states
    feature_layers: tuple[int, ...] = ()
    #: whether this round's drafting ran a draft model over the prompt (its prefill waits for the
    #: first round that drafts): a cost paid once per request, which the back-off does not judge
    #: speculation by. (The tokens of a pause, which a draft catches up on when it resumes, are
    #: judged: that is what pausing and probing cost.)
    catching_up: bool = False

    # ------------------------------------------- setup: asked once, by the registry's open_proposer
    @classmethod
    @abstractmethod
    def accepts(cls, draft: Any) -> bool:
        """Whether this proposer drives ``draft`` (the object passed to ``generate(..., draft, ...)``)."""

    @classmethod
    def models(cls, draft: Any) -> list[torch.nn.Module]:
        """The modules it runs (position limits, eval mode, tensor parallelism)."""
        return []

    @classmethod
    def max_depth(cls, draft: Any) -> int:
        """The deepest tree it grows by itself (beyond its policy's), for position checks."""
        return 0

    @classmethod
    def draft_engine(cls, options: "EngineOptions") -> str:
        """The engine its model runs on under resolved ``options`` (what ``precompile`` builds)."""
        return options.engine

    @classmethod
    def wants_cost_model(cls, draft: Any) -> bool:
        """Whether it sizes its own trees by the target's verify cost (then the loop's setup offers
        the measured profile in the context when the cost model is on). Default: no."""
        return False

    @classmethod
    @abstractmethod
    def open(cls, draft: Any, context: RunContext) -> "Proposer":
        """A fresh proposer for one generation; refuses (DynaTreeError) what it cannot serve."""

    # ------------------------------------------------------------------------------ the loop
    @abstractmethod
    def prefill(self, prompt: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Take the prompt in (``features``: the target's of ``prompt[:-1]`` if :attr:`wants_features`)."""

    @abstractmethod
    def propose(self, builder: TreeBuilder) -> None:
        """Grow this round's tree under ``builder``'s root (node 0), within ``builder.cap`` and
        ``builder.deepens``."""

    def drafting(self, builder: TreeBuilder) -> Drafting:
        """:meth:`propose` as steps: a generator that yields each :class:`DraftCall` it waits on and
        receives its result, so that a batch runs a step's calls of all its rows in one forward.
        Default: propose at once, waiting on nothing (a proposer without a draft model, or one
        whose calls cannot be gathered)."""
        self.propose(builder)
        yield from ()

    @abstractmethod
    def observe(self, outcome: Outcome) -> None:
        """The target committed ``outcome``'s accepted nodes and bonus token."""

    def finish(self, length: int | None = None) -> None:
        """The generation ended: a proposer that learns across requests (the text's cross-request
        cache) takes it in here. The request's text is the first ``length`` tokens of what was
        prefilled and committed (None: all of them): a last round can commit tokens past the stop
        token or the length limit, which the output does not keep."""

    # ----------------------------------------------------------------------------- statistics
    @property
    def calls(self) -> int:
        """Draft model forwards in the current round (0 for a model-free proposer)."""
        return 0

    def state(self) -> dict[str, float]:
        """Adaptive parameters worth logging per round (its policy's; empty without one)."""
        return {}
