"""DySpec greedy dynamic tree (DySpec, Alg. 1): expand the pending sampling of highest value.

A heap element is a *pending sampling* at a tree node: the node's residual draft distribution R
(its draft distribution with the already sampled children removed and renormalised) and the value
v = probability that verification reaches this sampling. The root's first sampling has v = 1. Pop
the best element, sample y ~ R, add y as a child; the child's first sampling gets v * R[y] and the
node's next sampling gets v * (1 - R[y]) with R[y] <- 0 renormalised. A residual with no mass left
has value 0 and is never pushed. Stop when the tree holds ``max_nodes`` drafted nodes. Children are
*sampled* (at the draft temperature, default 0.6), never chosen as top-k: whether a node is kept
must not depend on which token it is, or verification would be biased (DySpec §4). Every node's
value equals its path probability under the draft, exp(cum_logq) (App. D, Eq. 11), and the sum of
the node values is the tree's expected number of accepted tokens under DySpec's estimate
SD[x] ≈ p_draft(x); it is logged per round as ``expected_accept``.

Fixes to the paper's pseudocode: y is sampled before the node is added
(Alg. 1 lines 6-7 are in the wrong order); the sibling is pushed before the child, as written, so
equal values pop the sibling first.

Batching (``mode``):

* ``"per_node"`` is the paper's cost model: one draft call for every node whose distribution is
  needed. It is lazy — a node is run through the draft only when its first sampling is popped,
  whereas Alg. 1 line 14 runs every new node, the final leaves included; the tree is the same.
* ``"batch"`` (default): when the popped element needs a draft distribution, ONE draft call also
  computes it for every other pending first sampling among the ``room`` best heap elements
  (``room`` = nodes still to add, the most that can still be popped), in value order. A node's
  draft distribution depends only on its path, and the random draws happen in the same order, so
  the tree, the values and the random stream are those of ``"per_node"`` — up to float rounding:
  a multi-row draft forward can differ from a one-row forward in the last bits, which very rarely
  flips a near-tie between heap values or a draw at a CDF boundary. Batching changes the cost
  only: fewer draft calls (on a GPU a call costs about the same for 1 or 64 rows) against rows
  run for nodes that end up never popped. Measured on tiny models (64 nodes): 15.5 instead of
  36.5 calls per round for 45 instead of 36.5 rows (peaked draft), 2 instead of 8.8 calls for 25
  instead of 8.8 rows (flat draft); the lower bound is the depth of the expanded nodes. ``draft_rows``
  in the round state counts the rows, ``draft_calls`` in the round stats the calls.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from dynatree.core.proposer import LevelDrafter, Levels
from dynatree.core.sampling import DraftSampler, without
from dynatree.core.tree import TreeBuilder
from dynatree.errors import check
from dynatree.policies.base import DraftPolicy


@dataclass(frozen=True)
class DySpecConfig:
    """max_nodes: drafted-node budget m (the paper's "guess length": 64, or 768 with offloading;
    None: read off the target's measured verify-cost curve, :func:`~dynatree.core.costmodel.node_budget`,
    the paper's 64 on a GPU without one); mode: ``"batch"`` (shared draft calls, same tree) or
    ``"per_node"`` (one call per expanded node)."""

    max_nodes: int | None = None
    mode: Literal["batch", "per_node"] = "batch"

    def __post_init__(self) -> None:
        check(self.max_nodes is None or (isinstance(self.max_nodes, int) and 1 <= self.max_nodes <= 4096),
              "max_nodes", "None (from the measured cost) or an integer in [1, 4096]", self.max_nodes)
        check(self.mode in ("batch", "per_node"), "mode", "'batch' or 'per_node'", self.mode)


class SampledTreePolicy(DraftPolicy):
    """Shared by the DySpec policies: they sample children, with the run's draft sampler (the
    drafter's ``sampler``), and they record per round the value of every drafted node and the
    draft rows they ran."""

    samples_children: ClassVar[bool] = True

    def __init__(self, config: object) -> None:
        super().__init__(config)
        self.sampler: DraftSampler | None = None  # this round's (the drafter's)
        self.values: list[float] = []  # value (reach probability) of each drafted node, creation order
        self.draft_rows = 0

    def _may_expand(self, tree: TreeBuilder, node: int) -> bool:
        """Whether ``node`` may receive children under this round's depth limit (the tokens left)."""
        return tree.deepens(node)

    def max_depth(self) -> int:
        # A sampled tree's depth is bounded only by its node budget (a peaked draft makes a chain of
        # max_nodes); the loop's position check takes the run's max_new_tokens when that is smaller.
        return self.config.max_nodes if self.config.max_nodes is not None else 4096

    def wants_cost_model(self) -> bool:
        return self.config.max_nodes is None and self.cost_profile is None

    def budget(self, device: str) -> int:
        """The drafted-node budget (:meth:`DraftPolicy.node_budget`; the table's 64 on a GPU is
        the paper's)."""
        return self.node_budget(self.config.max_nodes, device)

    def _start(self, drafter: LevelDrafter) -> DraftSampler:
        sampler = getattr(drafter, "sampler", None)
        if sampler is None:
            raise RuntimeError(f"{self.name} samples children: its drafter needs the run's sampler (drafter.sampler, "
                               "a DraftSampler; generate() sets it)")
        self.sampler = sampler
        self.values = []
        self.draft_rows = 0
        return sampler

    def _draft(self, nodes: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The draft distributions of ``nodes`` from their draft ``logits``."""
        assert self.sampler is not None
        self.draft_rows += len(nodes)
        return self.sampler.probs(logits)

    def state(self) -> dict[str, float]:
        return {"expected_accept": sum(self.values), "draft_rows": float(self.draft_rows)}


class DySpec(SampledTreePolicy):
    name: ClassVar[str] = "dyspec"
    Config = DySpecConfig

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        sampler = self._start(drafter)
        budget = tree.cap(self.budget(root_logits.device.type))  # (the engine's largest verify call may be smaller)
        dist: dict[int, torch.Tensor] = {0: sampler.probs(root_logits)}  # node -> its draft distribution
        order = itertools.count()  # FIFO among equal values
        # (-value, order, node, residual); residual None = the node's first sampling, from dist[node]
        heap: list[tuple[float, int, int, torch.Tensor | None]] = [(-1.0, next(order), 0, None)]
        while heap and len(tree) - 1 < budget:
            _, _, node, res = heap[0]
            if res is None and node not in dist:
                if self.config.mode == "per_node":
                    todo = [node]
                else:
                    best = heapq.nsmallest(budget - (len(tree) - 1), heap)
                    todo = [e[2] for e in best if e[3] is None and e[2] not in dist]
                for n, row in zip(todo, self._draft(todo, (yield todo))):
                    dist[n] = row
            neg_v, _, node, res = heapq.heappop(heap)
            v = -neg_v
            if res is None:
                res = dist[node]
                tree.set_sampled(node, res)
            y = sampler.draw(res)
            r_y = float(res[y])
            child = tree.add(node, y, math.log(float(dist[node][y])))
            self.values.append(v * r_y)
            rest = without(res, y) if r_y < 1.0 else None
            if rest is not None:
                heapq.heappush(heap, (-v * (1.0 - r_y), next(order), node, rest))
            if self._may_expand(tree, child):
                heapq.heappush(heap, (-v * r_y, next(order), child, None))
