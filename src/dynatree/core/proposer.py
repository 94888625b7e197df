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
the policy calls back only :meth:`LevelDrafter.forward`, the level-batched draft call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from dynatree.core.costmodel import CostProfile
from dynatree.core.kv import KVModel
from dynatree.core.sampling import DraftSampler, SamplingConfig
from dynatree.core.tree import TokenTree, TreeBuilder

if TYPE_CHECKING:  # (options imports nothing of the package's core: no cycle)
    from dynatree.options import EngineOptions


class LevelDrafter(Protocol):
    """What a tree-shaping policy calls while it grows a tree: one draft forward over the given
    tree nodes (all their parents already run), and the run's sampler for policies that *sample*
    children (DySpec) instead of taking the draft's top tokens."""

    sampler: DraftSampler | None

    def forward(self, nodes: Sequence[int]) -> torch.Tensor:
        """Draft logits ``[len(nodes), V]`` for the children of ``nodes``."""
        ...


class TreeShape(Protocol):
    """A tree-shaping policy as a model proposer sees it (:class:`dynatree.policies.DraftPolicy`)."""

    name: ClassVar[str]

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
    ``sync`` (the tensor-parallel rank sync, or None), ``on_round``, ``backoff`` (this call's
    controller, or None), ``shared_random`` (the trees themselves are drawn from the run's random
    stream: DySpec), and a batch's ``pad_token_id`` and ``tree_rows`` (the verify rows a sampled batch's rows
    share; a greedy batch chooses its share per round from the cost curve).
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
    sync: Any = None
    on_round: Callable[[Any], None] | None = None
    backoff: Any = None
    shared_random: bool = False
    pad_token_id: int = 0
    tree_rows: int = 0


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
