"""Back off to plain decoding while speculation does not pay, and probe again later.

A speculative round pays when it commits tokens faster than plain one-token steps would. Which
one is faster depends on the workload (a draft that agrees 40% of the time loses on chat and wins
on rewrites) and on the machine, so it is measured, not predicted: the loop times both kinds of
round and this controller says, before each round, whether to draft.

* Early in a run (after the first round, which pays for warm-up), ``probe_plain`` rounds are run
  plain: the reference rate.
* A verdict needs ``min_rounds`` speculative rounds. While the speculative rate stays below
  ``margin`` times the plain rate, the run decodes plain for a pause of ``first_pause`` rounds,
  doubling after every probe that still loses (up to ``max_pause``), and resets once a probe pays.
* Rates are exponential moving averages of tokens per second (``ema`` weight on the newest
  round), so a workload that changes midway (a reply that starts quoting the prompt) is followed.

Skipping the draft leaves the output exactly what it was: a round without drafted nodes is one
plain target step, and every draft source takes a skipped round (its commit sees no tree). The
decisions depend on the clock, so a run's *trees* vary between runs; its tokens do not (greedy).
Sampled runs keep the back-off off: their random draws would then depend on timing, and a seeded
run would no longer repeat.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dynatree import tuning
from dynatree.errors import check

def enabled() -> bool:
    """What ``generate(backoff=None)`` does: on, unless ``DYNATREE_BACKOFF=off``, read at every call
    (not once at import: a setting made after ``import dynatree`` takes effect). The test suite
    sets it for every test that does not pass its own ``backoff``: no test's tree statistics may
    depend on the machine's timing."""
    return os.environ.get("DYNATREE_BACKOFF", "on").lower() not in ("off", "0", "false")


@dataclass
class Backoff:
    """Decides per round whether to draft; :meth:`observe` feeds it each round's outcome."""

    margin: float = tuning.BACKOFF_MARGIN
    probe_plain: int = tuning.BACKOFF_PROBE_PLAIN
    min_rounds: int = tuning.BACKOFF_MIN_ROUNDS
    first_pause: int = tuning.BACKOFF_FIRST_PAUSE
    max_pause: int = tuning.BACKOFF_MAX_PAUSE  # a pause's tokens reach the draft model in one call
    ema: float = 0.3
    spec_rate: float | None = field(default=None, init=False)
    plain_rate: float | None = field(default=None, init=False)
    rounds: int = field(default=0, init=False)
    spec_rounds: int = field(default=0, init=False)  # since the last verdict
    plain_rounds: int = field(default=0, init=False)
    pause_left: int = field(default=0, init=False)
    pause: int = field(default=0, init=False)  # the next pause's length
    paused_rounds: int = field(default=0, init=False)  # rounds decoded plain by a pause, in all

    def __post_init__(self) -> None:
        check(self.margin > 0, "margin", "a number > 0", self.margin)
        check(0 < self.ema <= 1, "ema", "a number in (0, 1]", self.ema)
        for name in ("probe_plain", "min_rounds", "first_pause", "max_pause"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, "an integer >= 1", value)
        self.pause = self.first_pause

    def should_draft(self) -> bool:
        """Whether the next round drafts (False: one plain step)."""
        if self.rounds == 0:
            return True  # the first round warms everything up; it is not measured
        if self.plain_rounds < self.probe_plain:
            return False
        return self.pause_left == 0

    def observe(self, drafted: bool, committed: int, seconds: float) -> None:
        """The round just run: whether it drafted, the tokens it committed, its wall time."""
        self.rounds += 1
        if self.rounds == 1 or seconds <= 0:
            return
        rate = committed / seconds
        if not drafted:
            self.plain_rate = _mix(self.plain_rate, rate, self.ema)
            self.plain_rounds += 1
            if self.pause_left:
                self.pause_left -= 1
                self.paused_rounds += 1
            return
        self.spec_rate = _mix(self.spec_rate, rate, self.ema)
        self.spec_rounds += 1
        if self.spec_rounds < self.min_rounds or self.plain_rate is None:
            return
        if self.spec_rate < self.margin * self.plain_rate:  # losing: decode plain for a while
            self.pause_left = self.pause
            self.pause = min(2 * self.pause, self.max_pause)
            self.spec_rounds, self.spec_rate = 0, None  # the next probe is judged on its own rounds
        else:
            self.pause = self.first_pause


def _mix(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new
