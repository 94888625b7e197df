"""Fixed tree: top-B children per node to depth D, probability pruning tau, node budget N_max.

This is the algorithm of the first DynaTree paper version (adaptive pruning only, its Alg. 1), which the later versions use as their "Fixed
Tree" baseline. The root u_0 is the draft's top-1 token (as in the paper); ``root_branching=True``
gives the first position B candidates like every other node.

Pruning (``prune``): the paper's pseudocode keeps a node whose path probability is below tau in the
tree (it is verified) but does not expand it: ``"keep"``, the default. Its text says such branches
are discarded before verification: ``"drop"`` never adds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from dynatree.core.proposer import LevelDrafter, Levels
from dynatree.core.tree import TreeBuilder
from dynatree.errors import check
from dynatree.policies.base import DraftPolicy, add_top_children


@dataclass(frozen=True)
class FixedTreeConfig:
    """depth: expansion levels after u_0 (D); branch: children per node (B); tau: pruning
    threshold on path probability; max_nodes: drafted-node budget (N_max).

    Defaults are the DynaTree paper's tuned fixed tree (D=8, B=3, tau=0.1, N_max=256)."""

    depth: int = 8
    branch: int = 3
    tau: float = 0.1
    max_nodes: int = 256
    root_branching: bool = False
    prune: Literal["keep", "drop"] = "keep"

    def __post_init__(self) -> None:
        check(isinstance(self.depth, int) and 0 <= self.depth <= 64, "depth", "an integer in [0, 64]", self.depth)
        check(isinstance(self.branch, int) and 1 <= self.branch <= 64, "branch", "an integer in [1, 64]", self.branch)
        check(0.0 <= self.tau < 1.0, "tau", "in [0, 1)", self.tau)
        check(isinstance(self.max_nodes, int) and 1 <= self.max_nodes <= 4096, "max_nodes", "an integer in [1, 4096]", self.max_nodes)
        check(self.prune in ("keep", "drop"), "prune", "'keep' or 'drop'", self.prune)


class FixedTree(DraftPolicy):
    name: ClassVar[str] = "fixed"
    Config = FixedTreeConfig

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        cfg = self.config
        budget = tree.cap(cfg.max_nodes)  # (the engine's largest verify call may be smaller)
        log_tau = math.log(cfg.tau) if cfg.tau > 0 else -math.inf
        drop = log_tau if cfg.prune == "drop" else None
        logp = torch.log_softmax(root_logits, -1)
        frontier = add_top_children(tree, 0, logp, cfg.branch if cfg.root_branching else 1, budget, drop)
        for _ in range(cfg.depth):
            room = budget - (len(tree) - 1)
            # Nodes past the remaining budget could not receive a child: do not pay for them.
            expand = [u for u in frontier if tree.cum_logq[u] >= log_tau and tree.deepens(u)][:room]
            if not expand:
                break
            logits = yield expand
            frontier = []
            for u, row in zip(expand, torch.log_softmax(logits, -1)):
                frontier += add_top_children(tree, u, row, cfg.branch, budget, drop)

    def max_depth(self) -> int:
        return self.config.depth + 1
