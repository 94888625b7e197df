"""The drafting-policy interface shared by every strategy.

A policy only decides which nodes to add to the tree (calling the drafter for the draft
distributions it needs); it never touches a KV cache or the target. The engine owns everything
else, so every strategy, the autoregressive baseline included, runs through the same loop and the
same timers.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from dynatree.core import costmodel
from dynatree.core.proposer import LevelDrafter, Levels, drive
from dynatree.errors import DynaTreeError
from dynatree.tuning import DEFAULT_MAX_NODES
from dynatree.core.tree import TreeBuilder

if TYPE_CHECKING:
    from dynatree.core.costmodel import CostProfile


@dataclasses.dataclass(frozen=True)
class RoundFeedback:
    """What a policy may learn from a finished round (for history adaptation)."""

    drafted: int  # drafted nodes in the tree (root excluded)
    accepted: int  # drafted nodes on the accepted path
    overhead_ms: float = 0.0  # the round's drafting + committing time (cost-model budgets weigh it)


class DraftPolicy(ABC):
    """Grows a token tree for one round. Subclasses set ``name`` and ``Config``."""

    name: ClassVar[str]
    Config: ClassVar[type]
    uses_draft: ClassVar[bool] = True
    #: whether it *samples* children (DySpec) with the run's random stream, rather than taking the
    #: draft's top tokens: the run then shares that stream with every tensor-parallel rank
    samples_children: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config
        self.cost_profile: CostProfile | None = None  # set by use_cost_model (the bench reports it)

    @classmethod
    def from_options(cls, **options: Any) -> "DraftPolicy":
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise DynaTreeError(
                f"unknown option(s) {', '.join(unknown)} for strategy '{cls.name}'; "
                f"valid: {', '.join(sorted(fields)) or '(none)'}"
            )
        return cls(cls.Config(**options))

    def reset(self) -> None:
        """Forget per-generation state (history); called when a model proposer opens for a run."""

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        """Add drafted nodes to ``tree`` (whose node 0 is the root), within ``tree.cap`` and
        ``tree.deepens``: a generator that *yields* each level it wants the draft run over (a list
        of tree nodes, all their parents already run) and receives that level's draft logits
        ``[len(nodes), V]``.

        ``root_logits`` are the draft's logits for the root's children, already computed by the
        model proposer's first draft call of the round; a policy that samples children draws with
        ``drafter.sampler``.

        Why a generator rather than a call back into the drafter: a batch's rows each grow their
        own tree, and a level that waits as a yielded value can run in ONE draft forward with the
        other rows' levels (:mod:`dynatree.runtime.batch_draft`); one prompt's proposer runs each
        level as it comes (:meth:`build`).

        A policy written against :meth:`build` alone (calling ``drafter.forward`` itself) still
        runs: this default runs its ``build`` at once, its levels then not gathered in a batch.
        """
        if type(self).build is DraftPolicy.build:
            raise NotImplementedError(f"{type(self).__name__} must implement grow (or build)")
        self.build(tree, drafter, root_logits)
        yield from ()

    def build(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> None:
        """:meth:`grow`, each level run at once with ``drafter.forward(nodes)``."""
        drive(self.grow(tree, drafter, root_logits), drafter.forward)

    def observe(self, feedback: RoundFeedback) -> None:
        """Called after every round with that round's outcome."""

    @abstractmethod
    def max_depth(self) -> int:
        """Upper bound on the drafted depth, so the engine can check positions before running (a
        run never drafts deeper than its ``max_new_tokens`` either: the loop takes the smaller)."""

    def state(self) -> dict[str, float]:
        """Adaptive parameters worth logging per round (empty for static policies)."""
        return {}

    def wants_cost_model(self) -> bool:
        """Whether the model proposer should hand it the target's measured verify-cost profile
        (:meth:`use_cost_model`) when it opens (a budget chosen from the hardware). Default: no."""
        return False

    def use_cost_model(self, profile: "CostProfile | None") -> None:
        """Receive the measured cost profile (called only if :meth:`wants_cost_model` said yes). It
        is kept across generations: the profile belongs to the machine, not to one run."""
        self.cost_profile = profile

    def node_budget(self, max_nodes: int | None, device: str) -> int:
        """The drafted-node budget of a tree: ``max_nodes`` where the config pins it, else the most
        nodes whose verify costs about one step on the measured curve
        (:func:`~dynatree.core.costmodel.node_budget`), else the per-device table
        (``tuning.DEFAULT_MAX_NODES``: tuned by hand, the fallback when nothing is measured)."""
        if max_nodes is not None:
            return max_nodes
        if self.cost_profile is not None:
            return costmodel.node_budget(self.cost_profile)
        return DEFAULT_MAX_NODES.get(device, DEFAULT_MAX_NODES["cuda"])


def add_top_children(
    tree: TreeBuilder,
    parent: int,
    logp: torch.Tensor,
    breadth: int,
    budget: int,
    min_cum_logp: float | None = None,
) -> list[int]:
    """Add the top-``breadth`` draft tokens as children of ``parent``, in descending probability.

    Stops once the tree holds ``budget`` drafted nodes. With ``min_cum_logp`` set, children whose
    path log-probability falls below it are not added at all ("drop" pruning). Returns the new
    node indices.
    """
    values, tokens = torch.topk(logp, breadth)
    added = []
    base = tree.cum_logq[parent]
    for lp, tok in zip(values.tolist(), tokens.tolist()):
        if len(tree) - 1 >= budget:
            break
        if min_cum_logp is not None and base + lp < min_cum_logp:
            break  # descending order: every later sibling is below the threshold too
        added.append(tree.add(parent, tok, lp))
    return added
