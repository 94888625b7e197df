"""Whether the draft model of a hybrid tree (draft model + text) is worth calling this round.

The text decides first: where its proposal is confident the model sits the round out anyway
(``TextDraft.confident``). Where the text is unsure, the model is called only while it *earns* its
calls: each call's gain is the number of tokens the round had accepted beyond what the text's own
nodes would have had accepted (the text proposal walked down the committed tokens), and the model
keeps drafting while the gains of its recent calls are at least what they cost: the call's draft
forwards and the verify rows it added, in plain steps, read off the measured cost curves of the
draft and the target (``drafts.hybrid``); where none is measured, ``min_gain`` tokens a call.

Why: a draft model trained on prose gains ~0.1 token a call on chat and math answers, where it
costs about 0.3 of a step on the CPU, so calling it there made the hybrid slower than the text
alone; on prose it gains far more than it costs. A fixed rule cannot know which workload it is in;
the gains say so within a few calls. A model that loses its verdict sits out ``first_pause``
unsure rounds, doubling after each losing probe up to ``max_pause`` (the back-off's schedule), then
gets ``min_calls`` fresh calls to prove itself again. As the back-off does, it also loses its
verdict at once when its calls since the last one have cost ``max_loss`` plain steps more than they
gained (twice that before the first), and after a losing probe it sits out at least that loss over
``probe_share`` rounds: a draft model a third of the target's size costs about a step to resume
after a pause (its calls over the tokens it sat out) plus a third of one per call, so four probe
calls of a draft that never agrees cost several steps.

The decisions read committed tokens only, never the clock: a seeded run repeats exactly, and the
output never depends on them (any tree is verified exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynatree import tuning
from dynatree.core.pausing import loss_allowed, pause_after
from dynatree.errors import check


@dataclass
class ModelGate:
    """Per-request state: call :meth:`should_call` in a round the text is unsure of, and
    :meth:`observe` with the gain of every round the model drafted."""

    min_gain: float = tuning.TEXT_MODEL_MIN_GAIN
    min_calls: int = 4
    decay: float = tuning.TEXT_CALIBRATION_DECAY
    first_pause: int = tuning.BACKOFF_FIRST_PAUSE
    max_pause: int = tuning.BACKOFF_MAX_PAUSE
    max_loss: float = tuning.BACKOFF_MAX_LOSS
    probe_share: float = tuning.BACKOFF_PROBE_SHARE
    gain: float = field(default=0.0, init=False)  # decayed sum of gains since the last verdict
    cost: float = field(default=0.0, init=False)  # decayed sum of the calls' costs since the last verdict
    calls: int = field(default=0, init=False)  # calls since the last verdict
    pause_left: int = field(default=0, init=False)
    pause: int = field(default=0, init=False)
    skipped: int = field(default=0, init=False)  # unsure rounds the model sat out, in all
    lost: float = field(default=0.0, init=False)  # cost - gain of the calls since the last verdict
    verdicts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        check(self.min_gain >= 0, "min_gain", "a number >= 0", self.min_gain)
        check(0.0 <= self.decay < 1.0, "decay", "a number in [0, 1)", self.decay)
        check(self.max_loss > 0, "max_loss", "a number > 0", self.max_loss)
        check(0 < self.probe_share <= 1, "probe_share", "a number in (0, 1]", self.probe_share)
        for name in ("min_calls", "first_pause", "max_pause"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, "an integer >= 1", value)
        self.pause = self.first_pause

    def should_call(self) -> bool:
        """Whether the model drafts in this round, where the text is unsure (counts the pause)."""
        if self.min_gain == 0:
            return True
        if self.pause_left > 0:
            self.pause_left -= 1
            self.skipped += 1
            return False
        return True

    def observe(self, gain: float, cost: float | None = None) -> None:
        """A round the model drafted in: ``gain`` tokens accepted beyond the text's own nodes, at
        ``cost`` plain steps (None: ``min_gain``, the cost tuned on one machine)."""
        cost = self.min_gain if cost is None else cost
        self.gain = self.decay * self.gain + gain
        self.cost = self.decay * self.cost + cost
        self.calls += 1
        self.lost += cost - gain
        if self.min_gain == 0:
            return  # (the gate is off)
        hopeless = self.lost >= loss_allowed(self.max_loss, self.verdicts)
        if self.calls < self.min_calls and not hopeless:
            return
        if self.gain >= self.cost and not hopeless:  # the mean gain at least the mean cost, without dividing
            self.pause = self.first_pause  # earned: the next loss pauses briefly again
            return
        # lost: sit out, then probe afresh
        self.pause_left, self.pause = pause_after(self.lost, self.pause, self.verdicts, self.probe_share, self.max_pause)
        self.gain = self.cost = self.lost = 0.0
        self.calls = 0
        self.verdicts += 1
