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
    gate = ModelGate(min_gain=0.5, min_calls=3, first_pause=2, max_pause=5, max_loss=1e9, probe_share=1.0)  # (the mean alone)
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


def test_a_hopeless_model_loses_its_verdict_at_once_and_a_dear_probe_buys_a_long_pause() -> None:
    """Calls that cost a step each and gain nothing (a large draft that never agrees): the verdict
    comes after twice max_loss at first (two calls, before min_calls), then after max_loss (one
    call); a probe that lost a step pauses the model for at least 1 / probe_share unsure rounds."""
    gate = ModelGate(min_gain=0.3, min_calls=4, first_pause=2, max_loss=0.75, probe_share=0.05)
    for _ in range(2):
        assert gate.should_call()
        gate.observe(0.0, cost=1.0)
    assert gate.verdicts == 1 and gate.pause_left == 2
    assert [gate.should_call() for _ in range(3)] == [False, False, True]
    gate.observe(0.0, cost=1.0)  # the probe: one call
    assert gate.verdicts == 2 and gate.pause_left >= 20


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



def test_a_rounds_model_cost_prices_each_call_by_its_rows() -> None:
    """The model part of a round: each draft call at its own row count on the draft's curve (a call
    catching up on a pause's 24 tokens costs what 24 rows cost, past the curve by its last slope),
    plus the verify rows it added beyond the text's, in one-row target steps."""
    from dynatree.core.costmodel import CostProfile
    from dynatree.drafts.hybrid import model_cost

    target = CostProfile((1, 2, 4, 8), (10.0, 10.0, 12.0, 16.0))
    draft = CostProfile((1, 2, 4, 8), (3.0, 3.0, 4.0, 6.0))
    want = (6.0 + 0.5 * 16 + 3.0 + 3.5 + (13.0 - 10.0)) / 10.0
    assert model_cost(target, draft, [24, 2, 3], 5, 2) == pytest.approx(want)
    assert model_cost(target, draft, [], 2, 2) == 0.0


def test_the_prompt_window_is_the_most_the_share_allows() -> None:
    """The draft caches the whole prompt while that costs at most the share of plain decoding's run
    (the target's prefill plus a step a new token); past it, the largest window within the share,
    never under ``least``."""
    from dynatree.core.costmodel import CostProfile
    from dynatree.drafts.hybrid import prompt_window

    target = CostProfile((1, 2), (10.0, 20.0))  # 10 ms a row
    draft = CostProfile((1, 2), (1.0, 2.0))  # 1 ms a row
    # plain run: 100 * 10 + 100 * 10 = 2000 ms; 2% = 40 ms = 40 draft rows
    assert prompt_window(target, draft, 20, 100, share=0.02, least=8) is None  # 20 ms of 1200
    w = prompt_window(target, draft, 100, 100, share=0.02, least=8)
    assert w == 40 and draft.cost(w) <= 0.02 * 2000 < draft.cost(w + 1)
    assert prompt_window(target, draft, 100, 100, share=0.001, least=8) == 8


def test_a_windowed_draft_caches_the_prompts_last_tokens_and_the_output_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 8: the draft's first call (its prompt) runs the prompt's last 8 tokens, not its
    80, and the good draft still drafts and the output still equals autoregressive decoding. The
    control: without the window that call runs all 80."""
    from dynatree.core.costmodel import CostProfile
    from dynatree.drafts import hybrid

    target = tiny_model("llama", seed=1)
    good = perturbed(target, noise=0.01)
    costs = (CostProfile((1, 2), (1.0, 1.0)), CostProfile((1, 2), (0.01, 0.01)))  # (a draft call nearly free)
    monkeypatch.setattr(hybrid, "gate_costs", lambda draft, part, context: costs)
    seen: list[int] = []
    hook = good.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs["input_ids"].shape[-1]),
                                      with_kwargs=True)
    try:
        for window, first in ((8, 8), (None, 80)):
            monkeypatch.setattr(hybrid, "prompt_window", lambda *a, w=window, **k: w)
            seen.clear()
            out, calls, rounds = run(good)
            assert out == reference()
            assert seen[0] == first and calls >= rounds // 2, (seen[:3], calls, rounds)
    finally:
        hook.remove()
