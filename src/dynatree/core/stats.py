"""Per-round and per-generation statistics returned with every result.

Definitions: L = tokens committed per round (accepted drafted tokens + the
bonus token, after truncation at EOS / max_new_tokens); accepted = drafted nodes on the accepted
path (ℓ); acceptance = accepted / drafted nodes (≤ 1). The papers' own "acceptance rate", which can
exceed 100 %, is computed by the bench under its own name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

import torch

from dynatree.core.tree import TokenTree


@dataclass
class RoundStats:
    committed: int  # L
    accepted: int  # ℓ
    drafted: int  # tree nodes excluding the root
    depth: int  # deepest drafted level (0 for autoregressive)
    draft_calls: int
    t_draft: float
    t_verify: float
    t_commit: float
    policy_state: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundEvent:
    """What one round did, handed to ``generate(on_round=...)`` as soon as it commits.

    ``tokens`` are the committed tokens (after EOS / budget / stop-string truncation); ``path`` are
    the accepted tree nodes (indices into ``tree``, root excluded) and ``bonus`` the target's own
    token after them, *before* truncation, so a trace can show what verification decided.
    """

    tokens: list[int]
    tree: TokenTree
    path: list[int]
    bonus: int
    stats: RoundStats


@dataclass
class GenerationStats:
    strategy: str
    prompt_tokens: int
    new_tokens: int = 0
    t_prefill: float = 0.0
    t_total: float = 0.0
    ttft: float = 0.0  # start -> first committed token (prefill of both models + first round)
    rounds: list[RoundStats] = field(default_factory=list)
    #: the target's verify-cost profile the policy sized its trees from (a CostProfile; None: none)
    cost_profile: Any = None

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def _sum(self, name: str) -> float:
        return sum(getattr(r, name) for r in self.rounds)

    @property
    def mean_committed(self) -> float:
        """L̄: committed tokens per round (the quantity speculation multiplies throughput by)."""
        return self.new_tokens / max(self.num_rounds, 1)

    @property
    def mean_accepted(self) -> float:
        return self._sum("accepted") / max(self.num_rounds, 1)

    @property
    def acceptance(self) -> float:
        """Accepted drafted nodes / drafted nodes (0 when nothing was drafted)."""
        drafted = self._sum("drafted")
        return self._sum("accepted") / drafted if drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.t_total if self.t_total > 0 else 0.0

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first."""
        return (self.t_total - self.ttft) / (self.new_tokens - 1) if self.new_tokens > 1 else 0.0

    def summary(self) -> dict[str, Any]:
        """Totals and means as plain numbers (what the CLI and the bench print and store)."""
        return {
            "strategy": self.strategy,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "rounds": self.num_rounds,
            "mean_committed": self.mean_committed,
            "mean_accepted": self.mean_accepted,
            "acceptance": self.acceptance,
            "mean_drafted": self._sum("drafted") / max(self.num_rounds, 1),
            "mean_depth": self._sum("depth") / max(self.num_rounds, 1),
            "draft_calls": int(self._sum("draft_calls")),
            "tokens_per_second": self.tokens_per_second,
            "ttft": self.ttft,
            "tpot": self.tpot,
            "t_total": self.t_total,
            "t_prefill": self.t_prefill,
            "t_draft": self._sum("t_draft"),
            "t_verify": self._sum("t_verify"),
            "t_commit": self._sum("t_commit"),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "per_round": [dataclasses.asdict(r) for r in self.rounds]}


@dataclass
class BatchRound:
    """One round of a batch: the rows still running, the rows the verify forward took (the widest
    tree times the rows: trees are padded to one width), and where the time went. ``t_realign`` is
    the commit's KV move (each row's accepted rows to its own columns): the cost of ragged rows."""

    active: int
    verified_rows: int
    committed: int
    t_draft: float
    t_verify: float
    t_realign: float


@dataclass
class BatchStats:
    """A batch's statistics: one :class:`GenerationStats` per row (``stats[b]``; its ``t_total``
    runs until that row finished, its ``t_verify`` counts the batch's shared forwards), and the
    batch's own rounds and times. ``tokens_per_second`` is the batch's total: every row's new
    tokens over the batch's time."""

    rows: list[GenerationStats]
    t_prefill: float = 0.0
    t_total: float = 0.0
    rounds: list[BatchRound] = field(default_factory=list)
    #: a greedy batch's verify cost by share: where it came from (``source``: the tuning table or this
    #: machine's measurement), ``shares`` and their ``cost`` relative to a plain step
    share_costs: dict[str, Any] | None = None
    #: draft-model forwards the batch's shared draft caches ran (each step's calls of every row
    #: gathered into one where it paid); the rows' own ``draft_calls`` count each row's calls, as a
    #: single prompt's would
    draft_forwards: int = 0

    def __getitem__(self, row: int) -> GenerationStats:
        return self.rows[row]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[GenerationStats]:
        return iter(self.rows)

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.rows)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.t_total if self.t_total > 0 else 0.0

    @property
    def mean_committed(self) -> float:
        """Tokens a row commits per round it takes part in, over every row."""
        return self.new_tokens / max(sum(r.num_rounds for r in self.rows), 1)

    @property
    def t_realign(self) -> float:
        return sum(r.t_realign for r in self.rounds)

    def summary(self) -> dict[str, Any]:
        return {
            "batch_size": len(self.rows),
            "new_tokens": self.new_tokens,
            "rounds": self.num_rounds,
            "mean_committed": self.mean_committed,
            "tokens_per_second": self.tokens_per_second,
            "t_total": self.t_total,
            "t_prefill": self.t_prefill,
            "t_draft": sum(r.t_draft for r in self.rounds),
            "t_verify": sum(r.t_verify for r in self.rounds),
            "t_realign": self.t_realign,
            "mean_verified_rows": sum(r.verified_rows for r in self.rounds) / max(self.num_rounds, 1),
            "draft_forwards": self.draft_forwards,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "per_round": [dataclasses.asdict(r) for r in self.rounds],
                "per_row": [r.to_dict() for r in self.rows]}


@dataclass
class GenerationResult:
    """Like HF ``generate``'s output: ``sequences`` is ``[1, prompt + new]``, on the device of the
    ``input_ids`` tensor given (the CPU for a list); plus ``stats``. For a batch, ``sequences`` is
    ``[B, longest prompt + most new]`` as HF returns it (prompts left-padded, answers right-padded
    with the pad token) and ``stats`` a :class:`BatchStats` (``stats[b]``: row ``b``'s)."""

    sequences: torch.Tensor
    stats: GenerationStats | BatchStats
