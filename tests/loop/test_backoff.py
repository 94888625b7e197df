"""The back-off to plain decoding: its decisions on given round outcomes (no clock involved),
and the loop's output when rounds are skipped (exact for every source)."""

from __future__ import annotations

import pytest
import torch

from dynatree import SamplingConfig, StoppingConfig, generate
from dynatree.drafts.model import ModelProposer
from dynatree.drafts.suffix import TextDraft
from dynatree.errors import DynaTreeError
from dynatree.loop.backoff import Backoff
import dynatree.loop.batch as batch_loop
from tiny import hf_greedy, perturbed, tiny_model

NO_EOS = StoppingConfig(eos_token_id=())  # never stop early: outputs compare at full length


def run(backoff: Backoff, rounds: list[tuple[int, float]], plain: float) -> list[bool]:
    """Feed ``backoff`` speculative rounds (committed, seconds) and plain rounds of ``plain``
    seconds as it asks for them; return its decisions."""
    decisions, spec = [], iter(rounds)
    while True:
        draft = backoff.should_draft()
        decisions.append(draft)
        if draft:
            try:
                committed, seconds = next(spec)
            except StopIteration:
                return decisions[:-1]
            backoff.observe(True, committed, seconds)
        else:
            backoff.observe(False, 1, plain)


def test_speculation_that_pays_is_never_paused() -> None:
    b = Backoff()
    decisions = run(b, [(3, 0.1)] * 50, plain=0.08)  # 30 tok/s against 12.5
    assert decisions[1:3] == [False, False]  # the plain reference, measured once early
    assert decisions.count(False) == 2 and b.paused_rounds == 0 and b.verdicts == 0


def test_speculation_that_loses_pauses_with_doubling_pauses() -> None:
    b = Backoff(first_pause=4, min_rounds=3, max_pause=16, probe_share=1.0)  # (the doubling alone)
    decisions = run(b, [(1, 0.1)] * 30, plain=0.08)  # 10 tok/s against 12.5
    plain_runs, n = [], 0
    for d in decisions[3:]:  # after the warm-up round and the two reference steps
        if not d:
            n += 1
        elif n:
            plain_runs.append(n)
            n = 0
    assert plain_runs[:4] == [4, 8, 16, 16]  # each losing probe doubles the pause, up to max_pause
    assert b.paused_rounds >= 44


def test_a_hopeless_round_is_judged_at_once_and_a_probe_costs_one_round() -> None:
    """A round that loses max_loss plain steps by itself (one token in the time of two plain steps)
    is a verdict without waiting for min_rounds: each probe of a hopeless draft costs one round.
    (The run's first verdict allows twice the loss: two such rounds.)"""
    b = Backoff(first_pause=4, max_pause=64)
    decisions = run(b, [(1, 0.16)] * 7, plain=0.08)  # (the first: the warm-up round, not judged)
    spec_runs = [len(r) for r in "".join("S" if d else "." for d in decisions[1:]).split(".") if r]
    assert spec_runs == [2, 1, 1, 1, 1] and b.verdicts == 5


def test_a_dear_round_buys_a_pause_long_enough_to_repay_it() -> None:
    """A probe that loses 3 plain steps in one round (a draft nearly as dear as the target) buys a
    pause of at least 3 / probe_share rounds, so probing costs at most that share of the run. (The
    first verdict pauses first_pause rounds: the run's first rounds are not the workload's.)"""
    b = Backoff(first_pause=4, probe_share=0.05)
    decisions = run(b, [(1, 0.32)] * 4, plain=0.08)
    pauses = [len(r) for r in "".join("S" if d else "." for d in decisions[3:]).split("S") if r]
    assert b.verdicts == 3 and pauses[0] == 4 and pauses[1] >= 60


def test_the_margin_is_a_share_of_plain_decodings_rate() -> None:
    """margin=0.9: speculation at 94% of plain decoding's rate is kept; at margin 1 it is paused."""
    rounds = [(1, 0.085)] * 12  # 11.8 tok/s against 12.5 plain
    lenient, strict = Backoff(margin=0.9), Backoff(margin=1.0)
    run(lenient, rounds, plain=0.08)
    run(strict, rounds, plain=0.08)
    assert lenient.verdicts == 0 and strict.verdicts >= 1


def test_a_round_that_caught_up_is_not_judged() -> None:
    """A round whose draft model ran over the prompt paid a cost of starting: the back-off counts
    it but judges speculation by the rounds after it."""
    b = Backoff()
    for drafted, committed, seconds, judged in [(True, 1, 1.0, True), (False, 1, 0.08, True), (False, 1, 0.08, True),
                                                (True, 1, 0.5, False), (True, 3, 0.1, True)]:
        b.observe(drafted, committed, seconds, judged=judged)
    assert b.verdicts == 0 and b.mean_loss is not None and b.mean_loss < 0
    b.observe(True, 1, 0.5)  # the same round, judged: a loss of 5.25 steps
    assert b.verdicts == 1


@pytest.mark.parametrize("source", ["model", "hybrid"])
def test_the_loop_does_not_judge_the_round_that_ran_the_drafts_prompt(source: str) -> None:
    """The draft model's prefill waits for the first round that calls it; that round reaches the
    back-off as not judged, every other round as judged."""
    target = tiny_model("llama", seed=1)
    model = perturbed(target, noise=0.05)
    draft = model if source == "model" else TextDraft(model=model, confident=1e9)  # (the model drafts every round)
    seen: list[tuple[bool, bool]] = []

    class Logged(EveryOther):
        def observe(self, drafted, committed, seconds, judged=True):
            seen.append((drafted, judged))
            super().observe(drafted, committed, seconds, judged)

    generate(target, draft, repetitive(target.config.vocab_size), "dynatree", max_new_tokens=16, stopping=NO_EOS,
             backoff=Logged(), text=False)
    assert seen[0] == (True, False) and all(judged for _, judged in seen[1:]) and any(d for d, _ in seen[1:])


def test_a_round_that_proposed_nothing_is_not_judged() -> None:
    """A text source with no match drafts nothing: that round is a plain step plus a lookup, and
    the back-off does not judge speculation by it (a steady small loss there paused a winning text
    draft in its first rounds); the rounds that verified a tree are judged."""
    target = tiny_model("llama", seed=1)
    seen: list[tuple[bool, bool]] = []

    class Logged(Backoff):
        def observe(self, drafted, committed, seconds, judged=True):
            seen.append((drafted, judged))
            super().observe(drafted, committed, seconds, judged)

    out = generate(target, None, repetitive(target.config.vocab_size), "dynatree", max_new_tokens=24,
                   stopping=NO_EOS, backoff=Logged(probe_plain=1, max_loss=1e9, z=1e9))
    empty = [r.drafted == 0 for r in out.stats.rounds][1:len(seen)]
    drafted = [d for d, _ in seen][1:]
    judged = [j for _, j in seen][1:]
    assert any(empty) and not all(empty)
    assert judged == [not (d and e) for d, e in zip(drafted, empty)]


def test_a_slow_loser_is_caught_by_its_mean_and_an_unlucky_winner_is_not() -> None:
    """A draft 10% slower than plain decoding loses only 0.1 step a round: the verdict comes from
    its steady mean loss, after min_rounds. A winner whose rounds alternate between a loss and a
    larger gain (1 token, then 4, in 0.1 s each against 0.08 a plain step) is never paused."""
    slow = Backoff(min_rounds=2)
    run(slow, [(1, 0.088)] * 3, plain=0.08)  # (the warm-up round and two judged)
    assert slow.verdicts == 1
    lucky = Backoff()
    run(lucky, [(1, 0.1), (4, 0.1)] * 30, plain=0.08)
    assert lucky.verdicts == 0


def test_a_probe_that_pays_again_resets_the_pause() -> None:
    b = Backoff(first_pause=4, min_rounds=2, probe_share=1.0)
    run(b, [(1, 0.1)] * 3, plain=0.08)  # the warm-up round, then two losing ones: paused once
    assert b.verdicts == 1 and b.pause == 8
    run(b, [(4, 0.1)] * 6, plain=0.08)
    assert b.pause == 4 and b.pause_left == 0 and b.verdicts == 1


@pytest.mark.parametrize("field,value", [("margin", 0), ("ema", 1.5), ("min_rounds", 0), ("first_pause", 2.5),
                                         ("max_loss", 0), ("z", -1), ("decay", 1.0)])
def test_bad_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(DynaTreeError, match=field):
        Backoff(**{field: value})


# ------------------------------------------------------------------- the loop on a modeled clock
class ModeledClock:
    """Time as a cost model says, in plain steps: a target call of ``q`` rows costs
    ``1 + row_cost (q - 1)`` (0.02: a CPU whose few-row kernels read each weight once), a
    draft-model call ``draft_cost``. The loop and the back-off read it instead of the wall clock, so
    what they decide depends on the model only: the same on every machine."""

    def __init__(self, draft_cost: float, row_cost: float) -> None:
        self.draft_cost, self.row_cost, self.t = draft_cost, row_cost, 0.0

    def __call__(self) -> float:
        return self.t


def modeled(monkeypatch: pytest.MonkeyPatch, target: torch.nn.Module, draft_cost: float = 0.3,
            row_cost: float = 0.02) -> ModeledClock:
    from dynatree.loop import generate as loop
    from dynatree.runtime.cache import CachedModel

    clock = ModeledClock(draft_cost, row_cost)
    call = CachedModel.call

    def timed(kv, tokens, *args, **kwargs):
        clock.t += 1.0 + clock.row_cost * (len(tokens) - 1) if kv.model is target else clock.draft_cost
        return call(kv, tokens, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "call", timed)
    monkeypatch.setattr(loop, "sync_clock", lambda device: clock)
    return clock


def timed_run(clock: ModeledClock, *args, **kwargs):
    start = clock.t
    out = generate(*args, **kwargs)
    return out, clock.t - start


@pytest.mark.parametrize("guard,within", [(None, True), (Backoff(max_loss=1e9, z=1e9), False)],
                         ids=["backoff", "mutant-never-pauses"])
def test_a_draft_that_never_agrees_ends_within_3_percent_of_plain_decoding(guard, within, monkeypatch) -> None:
    """A draft model unrelated to the target (another random model) never agrees with it, and its
    rounds cost 1.3-1.9 plain steps: speculating in every round takes 1.5x plain decoding's time.
    With the back-off, a 256-token run ends within 3.5% of plain decoding's time, the output exact
    (3.2%: plain decoding takes its first token from the prefill, a step the speculative run pays
    in its first round). The control, a back-off that never pauses, does not."""
    target = tiny_model("llama", seed=1)
    stranger = tiny_model("llama", seed=7)
    ids = repetitive(target.config.vocab_size)
    clock = modeled(monkeypatch, target)
    n = 256
    plain, t_plain = timed_run(clock, target, None, ids, "autoregressive", max_new_tokens=n, stopping=NO_EOS)
    always, t_always = timed_run(clock, target, stranger, ids, "dynatree", max_new_tokens=n, stopping=NO_EOS,
                                 backoff=False, text=False)
    assert always.stats.mean_accepted < 0.05 and t_always > 1.4 * t_plain  # (speculation cannot pay here)
    guarded, t_guarded = timed_run(clock, target, stranger, ids, "dynatree", max_new_tokens=n, stopping=NO_EOS,
                                   backoff=guard if guard is not None else True, text=False)
    assert torch.equal(guarded.sequences, plain.sequences)
    assert (t_guarded <= 1.035 * t_plain) is within, (t_guarded / t_plain)


@pytest.mark.parametrize("source", ["model", "text", "hybrid"])
def test_every_draft_kind_is_guarded(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """For each draft kind on a draft that pays, and on rounds made too dear to pay (a draft call
    as dear as a target step; for the text alone, every verify row beyond the root 0.3 of a step),
    the guarded run ends within 5.5% of the faster of plain decoding and speculating in every round
    (the worst, the model draft made dear, 5.4%: plain decoding takes its first token from the
    prefill, a step a speculative run pays in its first round)."""
    target = tiny_model("llama", seed=1)
    model = perturbed(target, noise=0.05)
    draft = {"model": model, "text": None, "hybrid": TextDraft(model=model)}[source]
    ids = repetitive(target.config.vocab_size)
    n = 192
    dear = {"draft_cost": 1.0} if source != "text" else {"row_cost": 0.3}
    for costs in ({}, dear):
        clock = modeled(monkeypatch, target, **costs)
        _, t_plain = timed_run(clock, target, None, ids, "autoregressive", max_new_tokens=n, stopping=NO_EOS)
        _, t_always = timed_run(clock, target, draft, ids, "dynatree", max_new_tokens=n, stopping=NO_EOS,
                                backoff=False, text=False)
        _, t_guarded = timed_run(clock, target, draft, ids, "dynatree", max_new_tokens=n, stopping=NO_EOS,
                                 backoff=True, text=False)
        assert t_guarded <= 1.055 * min(t_plain, t_always), (costs, t_guarded, t_plain, t_always)
        monkeypatch.undo()


class EveryOther(Backoff):
    """Drafts on even rounds only: a deterministic stand-in for timing-driven pauses."""

    def should_draft(self) -> bool:
        return self.rounds % 2 == 0


def repetitive(vocab: int) -> torch.Tensor:
    block = torch.randint(2, vocab, (12,), generator=torch.Generator().manual_seed(2))
    return torch.cat([block, block, block[:5]])


@pytest.mark.parametrize("source", ["model", "text", "hybrid"])
@pytest.mark.parametrize("strategy", ["linear", "fixed", "dynatree", "dyspec", "dyspec-threshold"])
def test_skipped_rounds_keep_the_output_exact(source: str, strategy: str) -> None:
    target = tiny_model("llama", seed=1)
    model = perturbed(target, noise=0.05)
    draft = {"model": model, "text": None, "hybrid": TextDraft(model=model)}[source]
    ids = repetitive(target.config.vocab_size)
    out = generate(target, draft, ids, strategy, max_new_tokens=40, stopping=NO_EOS, backoff=EveryOther(), text=False)
    assert out.sequences[0].tolist() == hf_greedy(target, ids[None], 40, None)[0].tolist()
    plain = [r for r in out.stats.rounds if r.drafted == 0 and r.draft_calls == 0]
    assert len(plain) >= len(out.stats.rounds) // 2 - 1  # the pauses happened


def test_a_draft_that_forgets_the_paused_tokens_drafts_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: what keeps acceptance up across pauses is the draft catching up on the tokens
    committed while it sat out (exact either way: the target verifies)."""
    target = tiny_model("llama", seed=1)
    draft = perturbed(target, noise=0.02)
    ids = repetitive(target.config.vocab_size)
    good = generate(target, draft, ids, "linear", max_new_tokens=40, stopping=NO_EOS, backoff=EveryOther(), text=False)
    commit = ModelProposer.commit

    def forgetful(self, tree, accepted, bonus, features=None):  # a skipped round's tokens are lost
        if self._builder is None:
            self.pending = [int(bonus)]
            return
        commit(self, tree, accepted, bonus, features)

    monkeypatch.setattr(ModelProposer, "commit", forgetful)
    bad = generate(target, draft, ids, "linear", max_new_tokens=40, stopping=NO_EOS, backoff=EveryOther(), text=False)
    assert torch.equal(good.sequences, bad.sequences)
    accepted = lambda r: sum(x.accepted for x in r.stats.rounds)  # noqa: E731
    assert accepted(good) > accepted(bad)


def test_sampled_runs_and_plain_decoding_have_no_backoff() -> None:
    target = tiny_model("llama", seed=1)
    ids = repetitive(target.config.vocab_size)
    never = Backoff()
    never.should_draft = lambda: (_ for _ in ()).throw(AssertionError("asked"))  # type: ignore[method-assign]
    generate(target, None, ids, "dynatree", max_new_tokens=8, sampling=SamplingConfig(temperature=1.0), seed=0,
             backoff=never)
    generate(target, None, ids, "autoregressive", max_new_tokens=8, backoff=never)


def test_the_default_reads_the_environment_at_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read per call, not once at import: switching it after ``import dynatree`` takes effect."""
    from dynatree.loop import backoff

    for value, want in (("off", False), ("on", True), ("0", False), ("ON", True)):
        monkeypatch.setenv("DYNATREE_BACKOFF", value)
        assert backoff.enabled() is want


@pytest.mark.parametrize("source", ["model", "text", "hybrid"])
def test_a_batch_backs_off_as_a_whole(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The back-off judges the batch: every row drafts or none does, and the controller sees the
    batch's committed tokens per round; the rows stay their own greedy decodings. (A flat verify
    cost: the batch's share cuts no tree, so the drafting rounds keep their trees.)"""
    monkeypatch.setattr(batch_loop, "BATCH_SHARE_COST", {"cpu": {128: ((1, 2), (1.0, 1.0))}})
    target = tiny_model("llama", seed=1)
    model = perturbed(target, noise=0.05)
    draft = {"model": model, "text": None, "hybrid": TextDraft(model=model)}[source]
    seen: list[tuple[bool, int]] = []

    class Logged(EveryOther):
        def observe(self, drafted: bool, committed: int, seconds: float) -> None:
            seen.append((drafted, committed))
            super().observe(drafted, committed, seconds)

    rows = [repetitive(target.config.vocab_size).tolist(), [5, 9, 14, 5, 9], [7]]
    out = generate(target, draft, rows, "dynatree", max_new_tokens=24,
                   stopping=StoppingConfig(eos_token_id=(), pad_token_id=0), backoff=Logged(), text=False)
    for b, row in enumerate(rows):
        new = out.sequences[b, max(map(len, rows)):].tolist()
        assert new == hf_greedy(target, torch.tensor([row]), 24, None)[0, len(row):].tolist(), b
    batch_rounds = out.stats.rounds
    assert [c for _, c in seen] == [r.committed for r in batch_rounds][: len(seen)]
    for k, (drafted, _) in enumerate(seen):
        per_row = [s.rounds[k].drafted for s in out.stats if len(s.rounds) > k]
        assert drafted or not any(per_row), (k, per_row)  # a plain round is plain for every row
    assert any(d for d, _ in seen) and not all(d for d, _ in seen)
    assert any(s.rounds[k].drafted for s in out.stats for k in range(0, len(s.rounds) - 1, 2))
