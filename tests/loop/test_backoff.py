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
    assert decisions.count(False) == 2 and b.paused_rounds == 0


def test_speculation_that_loses_pauses_with_doubling_pauses() -> None:
    b = Backoff(first_pause=4, min_rounds=3, max_pause=16)
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


def test_a_probe_that_pays_again_resets_the_pause() -> None:
    b = Backoff(first_pause=4, min_rounds=2)
    run(b, [(1, 0.1)] * 4, plain=0.08)  # losing: paused once
    assert b.pause == 8
    run(b, [(4, 0.1)] * 6, plain=0.08)
    assert b.pause == 4 and b.pause_left == 0


@pytest.mark.parametrize("field,value", [("margin", 0), ("ema", 1.5), ("min_rounds", 0), ("first_pause", 2.5)])
def test_bad_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(DynaTreeError, match=field):
        Backoff(**{field: value})


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
