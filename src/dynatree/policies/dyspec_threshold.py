"""DySpec threshold tree (DySpec, Alg. 2): layer by layer, one draft call per layer.

Every leaf of the current layer with value v >= t is run through the draft (all of them in one
call); then each keeps sampling children without replacement while its pending sampling's value is
at least t: child y gets v * d[y], the next sampling v * (1 - d[y]), with d[y] <- 0 renormalised,
exactly the values of the heap variant (:mod:`.dyspec`). So the tree holds every sampling worth at
least t, which is the heap tree grown until its values fall below t ("If we set the threshold to be
the same as the acceptance rate of the last token, we will exactly get the same result as the
previous algorithm") but at one draft call per layer instead of a priority order. The threshold is
"typically around 1/n"; the paper's experiment uses t = 0.001 with a cap of 768 nodes.

Fix to the paper's pseudocode: Alg. 2 line 9 reads ``while v_i < t``, a typo
for ``while v_i >= t`` (it would only ever expand worthless samplings); the paper also uses a size
cap the pseudocode lacks: ``max_nodes``. Under the cap, leaves are expanded in layer order (the
paper's ``foreach``), so a capped layer keeps its earlier-created subtrees. Leaves below t are never
run through the draft: they could not receive a child.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from dynatree.core.proposer import LevelDrafter, Levels
from dynatree.core.sampling import without
from dynatree.core.tree import TreeBuilder
from dynatree.errors import check
from dynatree.policies.dyspec import SampledTreePolicy


@dataclass(frozen=True)
class DySpecThresholdConfig:
    """threshold: minimum value t of a sampling (paper: 0.001, "typically around 1/n");
    max_nodes: drafted-node cap (paper: 768; None: read off the target's measured verify-cost
    curve, as DySpec's budget)."""

    threshold: float = 0.001
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        check(0.0 < self.threshold <= 1.0, "threshold", "in (0, 1]", self.threshold)
        check(self.max_nodes is None or (isinstance(self.max_nodes, int) and 1 <= self.max_nodes <= 4096),
              "max_nodes", "None (from the measured cost) or an integer in [1, 4096]", self.max_nodes)


class DySpecThreshold(SampledTreePolicy):
    name: ClassVar[str] = "dyspec-threshold"
    Config = DySpecThresholdConfig

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        sampler = self._start(drafter)
        t, cap = self.config.threshold, tree.cap(self.budget(root_logits.device.type))  # (and the engine's largest call)
        leaves: list[tuple[int, float]] = [(0, 1.0)]  # (node, value) of the current layer
        while leaves and len(tree) - 1 < cap:
            # Each expanded leaf adds at least one child, so leaves past the remaining room are not run.
            expand = [(n, v) for n, v in leaves if v >= t and self._may_expand(tree, n)][: cap - (len(tree) - 1)]
            if not expand:
                break
            nodes = [n for n, _ in expand]
            dists = sampler.probs(root_logits)[None] if nodes == [0] else self._draft(nodes, (yield nodes))
            leaves = []
            for (node, v), d in zip(expand, dists):
                tree.set_sampled(node, d)
                res: torch.Tensor | None = d
                while res is not None and v >= t and len(tree) - 1 < cap:  # paper: `v_i < t` (typo)
                    y = sampler.draw(res)
                    r_y = float(res[y])
                    child = tree.add(node, y, math.log(float(d[y])))
                    leaves.append((child, v * r_y))
                    self.values.append(v * r_y)
                    v *= 1.0 - r_y
                    res = without(res, y) if r_y < 1.0 else None
