"""Distributions and random draws for speculative *sampling* (temperature > 0).

Two distributions meet in lossless verification:

* the **target** distribution, which the output must follow exactly: temperature, then top-k,
  then top-p (the order HF ``generate`` applies them) — :func:`target_probs`;
* the **draft** distribution that sampled tree children (DySpec) were drawn from, at its own
  temperature (DySpec uses 0.6 for every target temperature) — :func:`draft_probs`.

Every random number comes from one CPU ``torch.Generator`` as a float64 uniform, turned into a
token by inverse-CDF on whatever device the probabilities live on. So a seeded run draws the same
numbers whether the models are on CPU or GPU, and the draft policy and the verifier share one
reproducible stream. Siblings are sampled *without replacement*: :func:`without` is the single
definition of "remove a token and renormalise", used by the policies when they sample and by the
verifier when it replays the same residuals, so the two agree bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dynatree.catalog import DRAFT_TEMPERATURE
from dynatree.errors import check



def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding mode of one ``generate`` call, validated at construction.

    temperature: 0 = greedy (top_k / top_p are then irrelevant: they never remove the argmax).
    top_k: keep the k most likely target tokens (None or 0: off).
    top_p: keep the smallest set of most likely target tokens with mass >= top_p (None or 1: off).
    draft_temperature: temperature of the draft distribution that sampled children are drawn from
        (0 = the draft's argmax, so a sampled tree degenerates to a chain).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    draft_temperature: float = DRAFT_TEMPERATURE

    def __post_init__(self) -> None:
        check(_is_number(self.temperature) and self.temperature >= 0, "temperature", "a finite number >= 0 (0 = greedy)", self.temperature)
        check(
            self.top_k is None or (isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 0),
            "top_k", "None or an integer >= 0 (0 = off)", self.top_k,
        )
        check(self.top_p is None or (_is_number(self.top_p) and 0 < self.top_p <= 1), "top_p", "None or a number in (0, 1]", self.top_p)
        check(
            _is_number(self.draft_temperature) and self.draft_temperature >= 0,
            "draft_temperature", "a finite number >= 0", self.draft_temperature,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator:
    """The run's random stream: ``generator`` as given, a fresh one from ``seed``, or torch's global one.

    Falling back to the global CPU generator means ``torch.manual_seed(s)`` before ``generate``
    reproduces a run, as with HF ``generate``.
    """
    check(
        seed is None or (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**64),
        "seed", "None or an integer in [0, 2**64)", seed,
    )
    if generator is not None:
        check(isinstance(generator, torch.Generator) and generator.device.type == "cpu",
                 "generator", "None or a CPU torch.Generator", generator)
        check(seed is None, "seed", "None when generator= is given (seed the generator instead)", seed)
        return generator
    if seed is not None:
        return torch.Generator().manual_seed(seed)
    return torch.default_generator


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Target probabilities (last dim) after temperature, top-k and top-p; ``cfg.temperature > 0``."""
    scaled = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, cfg.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)  # ties with the k-th are kept, as in HF
    probs = torch.softmax(scaled, dim=-1)
    if cfg.top_p is not None and cfg.top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the strictly more likely tokens
        drop_sorted = before >= cfg.top_p  # never drops the most likely token (before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draft_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Draft probabilities (last dim) at ``temperature``; 0 gives a one-hot argmax."""
    if temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits.float() / temperature, dim=-1)


def uniform(generator: torch.Generator) -> float:
    """One U[0, 1) draw from the run's stream."""
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Sample an index from a 1D non-negative weight vector (need not be normalised).

    Inverse CDF in float64: the first index whose cumulative weight exceeds u * total, so an index
    with zero weight can never be returned.
    """
    cdf = probs.cumsum(0, dtype=torch.float64)
    # (a Python float is an IEEE double: u * total is the float64 product; a scalar search key
    #  saves building a tensor, a third of a small vocabulary's draw)
    idx = int(torch.searchsorted(cdf, uniform(generator) * float(cdf[-1]), right=True))
    if idx == probs.numel():  # u * total rounded up to total: take the last token with weight
        idx = int(probs.nonzero().max())
    return idx


def without(dist: torch.Tensor, token: int) -> torch.Tensor | None:
    """``dist`` with ``token`` removed and renormalised; None when no mass is left.

    This is sampling without replacement (DySpec Eq. 8: draft_k = d_k / (1 - sum of earlier
    siblings' d)); a None residual is DySpec's "all zero" case: its value is 0 and it is never
    sampled from again.
    """
    rest = dist.clone()
    rest[token] = 0.0
    mass = float(rest.sum())
    return rest / mass if mass > 0 else None


class DraftSampler:
    """What a sampling policy needs to draw children: the run's generator and the draft temperature."""

    def __init__(self, generator: torch.Generator, temperature: float = DRAFT_TEMPERATURE) -> None:
        self.generator = generator
        self.temperature = temperature

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return draft_probs(logits, self.temperature)

    def draw(self, probs: torch.Tensor) -> int:
        return draw(probs, self.generator)
