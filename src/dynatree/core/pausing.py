"""The pause schedule the back-off (``loop/backoff.py``) and the hybrid's model gate
(``drafts/model_gate.py``) share.

Both keep an account, in plain steps, of what speculation (or the draft model's calls) lost since
their last verdict. A verdict against it pauses for so many rounds, then probes again. One rule for
both, so that the draft model inside a hybrid backs off on the same schedule as speculation as a
whole (simulated in ``benchmarks/backoff/``).
"""

from __future__ import annotations

import math


def loss_allowed(max_loss: float, verdicts: int) -> float:
    """The loss that ends an account at once: ``max_loss`` plain steps, twice that before the first
    verdict (a run's first rounds are its worst: a text index still short, a draft warming up)."""
    return max_loss if verdicts else 2 * max_loss


def pause_after(lost: float, pause: int, verdicts: int, probe_share: float, max_pause: int) -> tuple[int, int]:
    """(rounds to sit out now, the pause after the next losing verdict): the current ``pause``,
    doubling up to ``max_pause``; after a probe (a verdict before this one) at least the loss that
    ended it over ``probe_share``, so that probing costs at most about that share of the rounds
    where one probe is very dear."""
    dear = math.ceil(max(lost, 0.0) / probe_share) if verdicts else 0
    return max(pause, dear), min(2 * pause, max_pause)
