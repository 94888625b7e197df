"""The hybrid tree's draft model drafts only while it earns its calls (``drafts.model_gate``).

The gate on its own (verdicts, the doubling pause, fresh probes), the counterfactual it measures
(``Proposal.matched``: what the text's nodes alone would have had accepted), and the wiring on tiny
models: a draft that agrees with the target keeps drafting, one that does not is paused, and the
output equals autoregressive decoding either way. Control: a gate fed no gain pauses the good draft
too. Decisions read tokens only, so every count here repeats exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny import perturbed, tiny_model

import dynatree
from dynatree.drafts.model_gate import ModelGate
from dynatree.drafts.suffix import TextDraft
from dynatree.drafts.suffix_index import Proposal
from dynatree.errors import DynaTreeError

NO_EOS = dynatree.StoppingConfig(eos_token_id=())


def test_a_losing_model_is_paused_with_a_doubling_pause() -> None:
    gate = ModelGate(min_gain=0.5, min_calls=3, first_pause=2, max_pause=5)
    for _ in range(3):
        assert gate.should_call()
        gate.observe(0.0)
    assert [gate.should_call() for _ in range(3)] == [False, False, True]  # paused 2 rounds, then a probe
    gate.observe(0.1)  # the probe's call, and two more: they lose again, so the pause is 4 rounds now
    for _ in range(2):
        assert gate.should_call()
        gate.observe(0.1)
    assert [gate.should_call() for _ in range(5)] == [False] * 4 + [True]
    gate.observe(2.0)  # a probe that earns: calls go on, the pause resets
    for _ in range(2):
        assert gate.should_call()
        gate.observe(2.0)
    assert all(gate.should_call() for _ in range(10)) and gate.pause == 2
    assert gate.skipped == 6


def test_an_earning_model_is_never_paused_and_zero_means_always() -> None:
    gate = ModelGate(min_gain=0.3, min_calls=2)
    for gain in (1, 0, 1, 0, 1, 0, 1, 0):  # mean ~0.5 with recent calls weighed more
        assert gate.should_call()
        gate.observe(gain)
    always = ModelGate(min_gain=0.0, min_calls=1)
    for _ in range(20):
        always.observe(0.0)
        assert always.should_call()
    with pytest.raises(DynaTreeError, match="min_gain"):
        ModelGate(min_gain=-1)
    with pytest.raises(DynaTreeError, match="model_min_gain"):
        TextDraft(model_min_gain=-0.1)


def test_matched_walks_the_committed_tokens_down_the_proposal() -> None:
    # 10 -> 11 -> 12, and 10 -> 13; 20 at the root
    p = Proposal([-1, 0, 1, 0, -1], [10, 11, 12, 13, 20], [math.log(0.5)] * 5)
    assert p.matched([10, 11, 12, 99]) == 3
    assert p.matched([10, 13, 5]) == 2
    assert p.matched([20, 10]) == 1
    assert p.matched([7]) == 0 and p.matched([]) == 0


def uncertain_prompt(n: int = 80, seed: int = 0) -> list[int]:
    """Tokens from a 4-token alphabet: the text always has a guess and is rarely sure of it."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 6, (n,), generator=g).tolist()


def run(draft: torch.nn.Module, **text: float) -> tuple[list[int], int, int]:
    """(output, rounds the model drafted in, rounds)."""
    target = tiny_model("llama", seed=1)
    r = dynatree.generate(target, TextDraft(model=draft, confident=1e9, **text), uncertain_prompt(),
                          max_new_tokens=60, stopping=NO_EOS, backoff=False)
    return r.sequences[0].tolist(), sum(1 for x in r.stats.rounds if x.draft_calls), r.stats.num_rounds


def reference() -> list[int]:
    target = tiny_model("llama", seed=1)
    return dynatree.generate(target, None, uncertain_prompt(), "autoregressive", max_new_tokens=60,
                             stopping=NO_EOS).sequences[0].tolist()


def test_a_draft_that_agrees_keeps_drafting_one_that_does_not_is_paused() -> None:
    target = tiny_model("llama", seed=1)
    good, bad = perturbed(target, noise=0.01), tiny_model("llama", seed=7)
    ref = reference()
    out, good_calls, good_rounds = run(good)
    assert out == ref
    assert good_calls == good_rounds  # confident=1e9: every round is unsure, and the good draft earns each
    out, bad_calls, bad_rounds = run(bad)
    assert out == ref
    out, always_calls, always_rounds = run(bad, model_min_gain=0.0)
    assert out == ref and always_calls == always_rounds
    assert bad_calls <= bad_rounds // 2, (bad_calls, bad_rounds)


def test_control_a_gate_fed_no_gain_pauses_a_good_draft_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the counterfactual said the text would have taken everything the model added (no gain),
    the good draft would be paused like the bad one: the gains above are what keeps it drafting."""
    target = tiny_model("llama", seed=1)
    monkeypatch.setattr(Proposal, "matched", lambda self, tokens: len(tokens))
    out, calls, rounds = run(perturbed(target, noise=0.01))
    assert out == reference()
    assert calls <= rounds // 2, (calls, rounds)

