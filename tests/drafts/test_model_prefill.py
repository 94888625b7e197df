"""The draft model's prefill waits for the first round that drafts.

A run that never drafts (a wide batch's share of one row per row, a hybrid whose text stays
confident) then never pays for it, and a run that starts drafting late gets the same draft cache
and trees as if the prompt and the tokens committed since had been cached all along."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, perturbed, tiny_model

import dynatree
import dynatree.loop.batch as batch_loop
from dynatree.core.proposer import Outcome
from dynatree.core.tree import TreeBuilder
from dynatree.drafts.model import ModelProposer
from dynatree.options import StoppingConfig
from dynatree.policies import make_policy
from dynatree.runtime.cache import CachedModel

PROMPT = [5, 17, 3, 40, 22, 9]


def plain_round(root: int, bonus: int) -> Outcome:
    """A round the loop stepped plain: the root alone, the target's bonus token."""
    return Outcome(TreeBuilder(root).freeze(), [], bonus, drafted=False)


def tree_after(committed: list[int], lazy: bool) -> list[int]:
    """The draft tree's tokens for the round after ``committed``: lazily (plain rounds observed
    before the first draft) or from a proposer prefilled with prompt + committed at once."""
    target, draft = tiny_model("llama", 0), perturbed(tiny_model("llama", 0))
    with torch.inference_mode():
        proposer = ModelProposer(CachedModel(draft, VOCAB), make_policy("dynatree", tau=0.0, max_nodes=8))
        if lazy:
            proposer.prefill(PROMPT)
            root = PROMPT[-1]
            for token in committed:
                proposer.observe(plain_round(root, token))
                root = token
        else:
            proposer.prefill(PROMPT + committed)
        builder = TreeBuilder((PROMPT + committed)[-1])
        proposer.propose(builder)
        assert proposer.kv.length >= len(PROMPT + committed)
    return builder.tokens


def test_a_late_first_draft_sees_every_committed_token() -> None:
    late = tree_after([7, 8, 30], lazy=True)
    assert len(late) > 2 and late == tree_after([7, 8, 30], lazy=False)
    assert late != tree_after([7, 8, 31], lazy=False)  # (the trees depend on what was committed)


def test_a_batch_that_never_drafts_never_runs_the_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every verify row costs a step: every round is plain, and the draft model is never called,
    its prefill included. With a flat curve the same batch does run it."""
    target, draft = tiny_model("llama", 0), perturbed(tiny_model("llama", 0))
    calls = []
    draft.register_forward_hook(lambda *_: calls.append(1))
    rows = [[3, 4, 5, 6], [9, 2, 11], [7, 7, 8, 1, 2]]

    def run() -> torch.Tensor:
        return dynatree.generate(target, draft, rows, "dynatree", max_new_tokens=12, text=False,
                                 stopping=StoppingConfig(pad_token_id=0)).sequences

    monkeypatch.setattr(batch_loop, "BATCH_SHARE_COST", {"cpu": {128: ((1, 2), (1.0, 2.0))}})
    plain = run()
    assert calls == []
    monkeypatch.setattr(batch_loop, "BATCH_SHARE_COST", {"cpu": {128: ((1, 2), (1.0, 1.0))}})
    assert torch.equal(run(), plain) and calls
