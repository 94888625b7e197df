"""DynaTree: confidence-aware breadth, probability-gated depth, history adaptation (the DynaTree paper).

Per round (DynaTree paper, Alg. 1, expanded breadth-first, one draft call per level):

* root u_0 = the draft's top-1 token (as in the paper; ``root_branching=True`` branches there too);
* a frontier node u with path probability p(u) and depth d(u) as the paper counts it (u_0 has d = 0) is expanded iff
  p(u) >= tau, d(u) < D_max, p(u) >= rho_stop and (d(u) < D_0 or p(u) >= rho_deep), while the tree
  holds fewer than N_max drafted nodes (Alg. 1 lines 14-25);
* breadth from the draft's confidence c(u) = max softmax at u: B_min if c >= tau_h, B_max if
  c < tau_l, else B_mid (line 27); children are the top-B tokens, added until N_max (line 28);
* history (DynaTree paper §3.4): a_r = accepted / drafted nodes of round r, averaged over the last W rounds
  (ā); then D_0 <- clip(D_0 + eta_D (ā - a*), 1, D_max - 1) and tau_h <- clip(tau_h - eta_h (ā - a*)).

Decisions the paper leaves open (ours): tau = 0.1 and rho_deep = 0.5 come from a sweep on the
offline pair (2-core AMD EPYC VM), which ran at a 4-node budget; the CPU budget is now 3
(:data:`DEFAULT_MAX_NODES`, why below); a* = 0.25 from the history sweep there
(W in 4/8/16 x a* in 0.25/0.35/0.5; B_mid, rho_stop and eta_D swept too and left at 2, 0.05, 2:
at a 4-node budget they move L by < 0.03). D_0 is kept as a real number and rounded when gating;
tau_l moves with tau_h (same shift, kept below it); history starts afresh at every generate() call;
adaptation starts once W rounds have been seen. eta_h is not swept.

Level batching: gating depends only on a node's own depth and path probability, so all nodes of a
level that pass it are expanded in one draft call; capping that list at the remaining budget makes
the tree identical to the paper's one-node-at-a-time FIFO loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import torch

from dynatree.core import costmodel
from dynatree.core.costmodel import choose_budget
from dynatree.core.proposer import LevelDrafter, Levels
from dynatree.core.tree import TreeBuilder
from dynatree.errors import check
from dynatree.policies.base import DraftPolicy, RoundFeedback, add_top_children


@dataclass(frozen=True)
class DynaTreeConfig:
    """Every DynaTree knob. Seed values: B=(1,·,3), tau_h=0.9, tau_l=0.4, D_0=5, D_max=8."""

    b_min: int = 1
    b_mid: int = 2
    b_max: int = 3
    tau_h: float = 0.9
    tau_l: float = 0.4
    d0: int = 5
    d_max: int = 8
    rho_stop: float = 0.05
    rho_deep: float = 0.5
    tau: float = 0.1
    max_nodes: int | None = None  # None: from the target's measured verify cost (costmodel.py)
    history: bool = True
    window: int = 8
    target_accept: float = 0.25
    eta_d: float = 2.0
    eta_h: float = 0.2
    adaptive_breadth: bool = True
    adaptive_depth: bool = True
    root_branching: bool = False

    def __post_init__(self) -> None:
        ints = {"b_min": self.b_min, "b_mid": self.b_mid, "b_max": self.b_max, "d0": self.d0, "d_max": self.d_max}
        for name, v in ints.items():
            check(isinstance(v, int) and 1 <= v <= 64, name, "an integer in [1, 64]", v)
        check(self.b_min <= self.b_mid <= self.b_max, "b_mid", f"between b_min={self.b_min} and b_max={self.b_max}", self.b_mid)
        check(0.0 < self.tau_h < 1.0, "tau_h", "in (0, 1)", self.tau_h)
        check(0.0 < self.tau_l < self.tau_h, "tau_l", f"in (0, tau_h={self.tau_h})", self.tau_l)
        check(self.d0 < self.d_max, "d0", f"less than d_max={self.d_max}", self.d0)
        check(0.0 < self.rho_deep < 1.0, "rho_deep", "in (0, 1)", self.rho_deep)
        check(0.0 < self.rho_stop < self.rho_deep, "rho_stop", f"in (0, rho_deep={self.rho_deep})", self.rho_stop)
        check(0.0 <= self.tau < 1.0, "tau", "in [0, 1)", self.tau)
        check(self.max_nodes is None or (isinstance(self.max_nodes, int) and 1 <= self.max_nodes <= 4096),
              "max_nodes", "None (by device) or an integer in [1, 4096]", self.max_nodes)
        check(isinstance(self.window, int) and self.window >= 1, "window", "an integer >= 1", self.window)
        check(0.0 < self.target_accept < 1.0, "target_accept", "in (0, 1)", self.target_accept)
        check(self.eta_d >= 0.0, "eta_d", ">= 0", self.eta_d)
        check(self.eta_h >= 0.0, "eta_h", ">= 0", self.eta_h)


# Node budget when max_nodes is None and no cost profile is available (DYNATREE_COST_MODEL=off, or
# StreamingLLM eviction): tuned by hand per device, see dynatree.tuning.
from dynatree.tuning import DEFAULT_MAX_NODES  # noqa: E402


class DynaTree(DraftPolicy):
    name: ClassVar[str] = "dynatree"
    Config = DynaTreeConfig

    def __init__(self, config: DynaTreeConfig) -> None:
        super().__init__(config)
        self.reset()

    def reset(self) -> None:
        cfg = self.config
        self.d0 = float(cfg.d0)
        self.tau_h = cfg.tau_h
        self.tau_l = cfg.tau_l
        self._window: deque[float] = deque(maxlen=cfg.window)
        # Cost-model budget state (kept across rounds, reset per generation).
        self._calib: deque[tuple[float, int]] = deque(maxlen=cfg.window)  # (expected, accepted) per round
        self._overhead_ms = 0.0
        self._expected = 0.0  # raw expected accepted nodes of the last tree (sum of path probabilities)
        self._nodes = 0
        self._empty = 0  # consecutive rounds verified without a drafted node
        self._trims = costmodel.trims()  # (read once per generation: DYNATREE_COST_MODEL=trim)

    # ---------------------------------------------------------------------------- cost model
    def wants_cost_model(self) -> bool:
        """True when the budget should come from a measured verify-cost profile (no pinned max_nodes
        and none given yet); the engine then calls :meth:`use_cost_model`."""
        return self.config.max_nodes is None and self.cost_profile is None

    def calibration(self) -> float:
        """Accepted nodes per expected accepted node over the last rounds: the draft's path
        probabilities are an estimate (DySpec's SD[x] ~ p_draft(x)) that a miscalibrated draft
        over- or under-states; 1 until a round has been seen."""
        # One pseudo-round of a perfectly calibrated node keeps a few unlucky first rounds from
        # collapsing the estimate (a tree of 0 nodes teaches nothing, so it could not recover).
        expected = 1.0 + sum(e for e, _ in self._calib)
        return min(max((1.0 + sum(a for _, a in self._calib)) / expected, 0.05), 2.0)

    def _gains(self, tree: TreeBuilder, nodes: list[int] | range) -> list[float]:
        c = self.calibration()
        return [min(1.0, c * math.exp(tree.cum_logq[u])) for u in nodes]

    def _worth_expanding(self, tree: TreeBuilder, expand: list[int]) -> bool:
        """Could another level pay for itself? Its children get at most their parents' path
        probability each, so if even one such child per expanded node does not raise expected
        tokens per ms, drafting the level is wasted work."""
        assert self.cost_profile is not None
        now = self._gains(tree, range(1, len(tree)))
        optimistic = now + self._gains(tree, expand)
        return choose_budget(self.cost_profile, optimistic, self._overhead_ms) > len(now)

    def _trim(self, tree: TreeBuilder) -> None:
        """Keep the prefix of the tree (creation order: always a valid tree) that maximises expected
        committed tokens per ms under the cost profile."""
        assert self.cost_profile is not None
        n = choose_budget(self.cost_profile, self._gains(tree, range(1, len(tree))), self._overhead_ms)
        if n == 0 and self._empty >= self.config.window:
            n = 1  # probe: after `window` empty rounds verify one node, so the calibration can move
        self._empty = 0 if n else self._empty + 1
        tree.truncate(1 + n)

    def _budget(self, device: str) -> int:
        if self.config.max_nodes is None and self.cost_profile is not None and self._trims:
            return max(1, self.cost_profile.max_rows - 1)  # (the per-round cut decides: the whole measured curve)
        return self.node_budget(self.config.max_nodes, device)

    # ------------------------------------------------------------------------------ drafting
    def breadth(self, confidence: float) -> int:
        cfg = self.config
        if not cfg.adaptive_breadth:
            return cfg.b_mid
        if confidence >= self.tau_h:
            return cfg.b_min
        if confidence < self.tau_l:
            return cfg.b_max
        return cfg.b_mid

    def expandable(self, depth: int, cum_logq: float) -> bool:
        """The paper's gate for a node at tree depth ``depth`` (u_0 has depth 1 here, 0 in the paper)."""
        cfg = self.config
        d, p = depth - 1, math.exp(cum_logq)
        if p < cfg.tau:
            return False
        if not cfg.adaptive_depth:
            return d < round(self.d0)
        return d < cfg.d_max and p >= cfg.rho_stop and (d < round(self.d0) or p >= cfg.rho_deep)

    def grow(self, tree: TreeBuilder, drafter: LevelDrafter, root_logits: torch.Tensor) -> Levels:
        cfg = self.config
        budget = tree.cap(self._budget(root_logits.device.type))  # (the engine's largest verify call)
        costed = cfg.max_nodes is None and self.cost_profile is not None and self._trims
        logp = torch.log_softmax(root_logits, -1)
        root_b = self.breadth(float(logp.max().exp())) if cfg.root_branching else 1
        frontier = add_top_children(tree, 0, logp, root_b, budget)
        while frontier:
            room = budget - (len(tree) - 1)
            expand = [u for u in frontier if self.expandable(tree.depth[u], tree.cum_logq[u]) and tree.deepens(u)][:room]
            if not expand or (costed and not self._worth_expanding(tree, expand)):
                break
            logps = torch.log_softmax((yield expand), -1)
            confidence = logps.max(-1).values.exp().tolist()
            frontier = []
            for u, row, c in zip(expand, logps, confidence):
                frontier += add_top_children(tree, u, row, self.breadth(c), budget)
        if costed:
            self._trim(tree)
        self._nodes = len(tree) - 1
        self._expected = sum(math.exp(lq) for lq in tree.cum_logq[1:])

    def max_depth(self) -> int:
        # u_0 plus up to D_max expansions (the paper's gate is d(u) < D_max with d(u_0) = 0).
        return self.config.d_max + 1

    # ------------------------------------------------------------------------------- history
    def observe(self, feedback: RoundFeedback) -> None:
        cfg = self.config
        if feedback.drafted:
            self._calib.append((self._expected, feedback.accepted))
        if feedback.overhead_ms > 0:  # drafting + committing, the round's cost besides the verify
            a = 0.25
            self._overhead_ms = feedback.overhead_ms if self._overhead_ms == 0 else \
                (1 - a) * self._overhead_ms + a * feedback.overhead_ms
        if not cfg.history or feedback.drafted == 0:
            return
        self._window.append(feedback.accepted / feedback.drafted)
        if len(self._window) < cfg.window:
            return
        err = sum(self._window) / len(self._window) - cfg.target_accept
        self.d0 = min(max(self.d0 + cfg.eta_d * err, 1.0), cfg.d_max - 1.0)
        self.tau_h = min(max(self.tau_h - cfg.eta_h * err, 0.02), 0.99)
        self.tau_l = min(max(cfg.tau_l + (self.tau_h - cfg.tau_h), 0.01), self.tau_h - 0.01)

    def state(self) -> dict[str, float]:
        out = {"d0": self.d0, "tau_h": self.tau_h, "tau_l": self.tau_l}
        if self.config.max_nodes is None and self.cost_profile is not None:
            if self._trims:  # the per-round cut's choice
                out.update(budget=float(self._nodes), calibration=self.calibration())
            else:  # the budget read off the curve
                out.update(budget=float(costmodel.node_budget(self.cost_profile)))
        return out
