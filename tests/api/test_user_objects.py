"""A call never changes the objects the caller hands it: a policy instance and a ``Backoff`` are
copied for the run (their settings are used, their state stays the caller's), so a second call
with the same object starts where the first did."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny import perturbed, tiny_model

import dynatree
from dynatree.loop.backoff import Backoff
from dynatree.options import StoppingConfig
from dynatree.policies import make_policy

NO_EOS = StoppingConfig(eos_token_id=())


def snapshot(obj: object) -> str:
    return repr(sorted((k, repr(v)) for k, v in vars(obj).items()))


@pytest.mark.parametrize("strategy", ["linear", "fixed", "dynatree", "dyspec", "dyspec-threshold"])
def test_a_policy_instance_is_not_changed_and_runs_the_same_twice(strategy: str) -> None:
    target = tiny_model("llama", seed=1)
    draft = perturbed(target, noise=0.3)
    ids = torch.randint(2, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    policy = make_policy(strategy)
    before = snapshot(policy)
    first = dynatree.generate(target, draft, ids, policy, max_new_tokens=24, stopping=NO_EOS, seed=3,
                              sampling=dynatree.SamplingConfig(temperature=1.0), text=False)
    assert snapshot(policy) == before
    second = dynatree.generate(target, draft, ids, policy, max_new_tokens=24, stopping=NO_EOS, seed=3,
                               sampling=dynatree.SamplingConfig(temperature=1.0), text=False)
    assert torch.equal(first.sequences, second.sequences)
    assert [r.drafted for r in first.stats.rounds] == [r.drafted for r in second.stats.rounds]


def test_a_backoff_instance_is_not_changed() -> None:
    target = tiny_model("llama", seed=1)
    draft = perturbed(target, noise=0.3)
    ids = torch.randint(2, target.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    backoff = Backoff(min_rounds=1, probe_plain=1)
    before = dataclasses.asdict(backoff)
    out = dynatree.generate(target, draft, ids, "linear", max_new_tokens=24, stopping=NO_EOS, backoff=backoff, text=False)
    assert out.stats.num_rounds > 3  # the back-off saw rounds (in its copy)
    assert dataclasses.asdict(backoff) == before
