"""Back off to plain decoding while speculation does not pay, and probe again later.

A speculative round pays when it commits tokens faster than plain one-token steps would. Which
one is faster depends on the workload (a draft that agrees 40% of the time loses on chat and wins
on rewrites) and on the machine (a verify of 8 rows costs 1.1 plain steps on one CPU and 2.3 on
another), so it is measured, not predicted: the loop times every round and this controller says,
before each round, whether to draft.

The account is kept in plain steps. After the first round (which pays for warm-up and is not
judged), ``probe_plain`` plain rounds measure what a plain step costs (seconds per token, a moving
average that every later plain round updates). Each speculative round then has a *loss*

    d = seconds / plain_step - committed

the tokens it fell short of what plain decoding would have committed in the same time (negative:
it gained). Speculation is paused, and the run decodes plain, as soon as either

* the rounds since the last verdict have lost ``max_loss`` plain steps in all (twice that before the
  run's first verdict: its first rounds are a workload's worst; a hopeless draft is stopped after a
  round or two, whatever the noise), or
* at least ``min_rounds`` of them lose on average with confidence: their decayed mean loss exceeds
  ``z`` standard errors (a slow loser is caught once its rounds say so; a winner's unlucky round
  does not stop it, since its losses and gains average out).

A pause lasts ``first_pause`` rounds, doubling after every probe that loses again (up to
``max_pause``) and back to ``first_pause`` once speculation is ahead; and after a probe, at least
the loss that ended it divided by ``probe_share``, so that where a single round is very dear (a
draft model nearly as large as the target) the probes still cost at most about that share of the
rounds between them. Two kinds of round are not judged: one in which a draft model ran over the
prompt (its prefill waits for the first round that calls it: a cost paid once per request), and
one whose proposer proposed nothing (a plain step plus a lookup: a text index with no match yet
would otherwise read as a steady small loss and pause a text draft that wins where it matches). So a draft that can never
pay costs the warm-up round, then at most about ``max_loss`` plus one round per verdict, and the
verdicts thin out geometrically: on simulated drafts that never agree (speculative rounds of 1.1
to 2 plain steps) a 192-token run ends within 1-3.7% of plain decoding's time, and drafts that win
lose at most 2.2% of speculation's time to probes and verdicts (``benchmarks/backoff/``, measured
before plain decoding took its first token from the prefill: about half a percent more of a
192-token run now; ``tests/loop/test_backoff.py`` runs the loop itself on a modeled clock).

Skipping the draft leaves the output exactly what it was: a round without drafted nodes is one
plain target step, and every draft source takes a skipped round (its commit sees no tree). The
decisions depend on the clock, so a run's *trees* vary between runs; its tokens do not (greedy).
Sampled runs keep the back-off off: their random draws would then depend on timing, and a seeded
run would no longer repeat.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from dynatree import tuning
from dynatree.core.pausing import loss_allowed, pause_after
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

    margin: float = tuning.BACKOFF_MARGIN  # speculation must reach this share of the plain rate
    probe_plain: int = tuning.BACKOFF_PROBE_PLAIN
    min_rounds: int = tuning.BACKOFF_MIN_ROUNDS
    max_loss: float = tuning.BACKOFF_MAX_LOSS  # plain steps a verdict may cost at most (see above)
    z: float = tuning.BACKOFF_Z
    first_pause: int = tuning.BACKOFF_FIRST_PAUSE
    max_pause: int = tuning.BACKOFF_MAX_PAUSE  # a pause's tokens reach the draft model in one call
    probe_share: float = tuning.BACKOFF_PROBE_SHARE
    decay: float = 0.9  # weight of the earlier rounds in the mean loss (~10 rounds)
    ema: float = 0.3  # weight of the newest plain round in the plain step's cost
    plain_step: float | None = field(default=None, init=False)  # seconds per token of a plain round
    rounds: int = field(default=0, init=False)
    plain_rounds: int = field(default=0, init=False)
    pause_left: int = field(default=0, init=False)
    pause: int = field(default=0, init=False)  # the next pause's length
    paused_rounds: int = field(default=0, init=False)  # rounds decoded plain by a pause, in all
    verdicts: int = field(default=0, init=False)  # pauses begun, in all
    # the losses since the last verdict: count, running loss, decayed weight, weight^2, sum, sum of squares
    _k: int = field(default=0, init=False, repr=False)
    _lost: float = field(default=0.0, init=False, repr=False)
    _w: float = field(default=0.0, init=False, repr=False)
    _w2: float = field(default=0.0, init=False, repr=False)
    _s: float = field(default=0.0, init=False, repr=False)
    _q: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        check(self.margin > 0, "margin", "a number > 0", self.margin)
        check(self.max_loss > 0, "max_loss", "a number > 0", self.max_loss)
        check(self.z >= 0, "z", "a number >= 0", self.z)
        check(0 < self.ema <= 1, "ema", "a number in (0, 1]", self.ema)
        check(0 <= self.decay < 1, "decay", "a number in [0, 1)", self.decay)
        check(0 < self.probe_share <= 1, "probe_share", "a number in (0, 1]", self.probe_share)
        for name in ("probe_plain", "min_rounds", "first_pause", "max_pause"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, "an integer >= 1", value)
        self.pause = self.first_pause

    def should_draft(self) -> bool:
        """Whether the next round drafts (False: one plain step)."""
        if self.rounds == 0:
            return True  # the first round warms everything up; it is not judged
        if self.plain_rounds < self.probe_plain:
            return False
        return self.pause_left == 0

    @property
    def mean_loss(self) -> float | None:
        """The decayed mean loss per speculative round since the last verdict (plain steps)."""
        return self._s / self._w if self._w > 0 else None

    def observe(self, drafted: bool, committed: int, seconds: float, judged: bool = True) -> None:
        """The round just run: whether it drafted, the tokens it committed, its wall time; a round
        that is not ``judged`` (a draft model ran over the prompt, or nothing was proposed) counts,
        but its time says nothing about speculation."""
        self.rounds += 1
        if self.rounds == 1 or seconds <= 0 or committed <= 0 or (drafted and not judged):
            return
        if not drafted:
            per = seconds / committed
            self.plain_step = per if self.plain_step is None else (1 - self.ema) * self.plain_step + self.ema * per
            self.plain_rounds += 1
            if self.pause_left:
                self.pause_left -= 1
                self.paused_rounds += 1
            return
        if self.plain_step is None:
            return  # (a caller that drafts before any plain round: nothing to compare with yet)
        loss = self.margin * seconds / self.plain_step - committed  # (>0: slower than margin x plain)
        self._k += 1
        self._lost += loss
        a = self.decay
        self._w, self._w2 = a * self._w + 1.0, a * a * self._w2 + 1.0
        self._s, self._q = a * self._s + loss, a * self._q + loss * loss
        if self._lost >= loss_allowed(self.max_loss, self.verdicts) or (self._k >= self.min_rounds and self._confidently_losing()):
            self._pause()
        elif self._k >= self.min_rounds and self._s < 0:
            self.pause = self.first_pause  # ahead: the next verdict pauses briefly again

    def _confidently_losing(self) -> bool:
        mean = self._s / self._w
        var = max(self._q / self._w - mean * mean, tuning.BACKOFF_MIN_SD**2)
        n = self._w * self._w / self._w2  # the decayed rounds' effective count
        return mean > self.z * math.sqrt(var / n)

    def _pause(self) -> None:
        self.pause_left, self.pause = pause_after(self._lost, self.pause, self.verdicts, self.probe_share, self.max_pause)
        self.verdicts += 1
        self._k, self._lost, self._w, self._w2, self._s, self._q = 0, 0.0, 0.0, 0.0, 0.0, 0.0
