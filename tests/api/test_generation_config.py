"""generate()'s typed groups (sampling=, options=, stopping=) and the flat keywords they replace.

The flat spellings must keep producing the same output (with one DeprecationWarning that names
the group to use), a setting given both ways is refused, and a misspelt keyword gets a hint
instead of passing for an option of the strategy.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import dynatree
from dynatree import EngineOptions, SamplingConfig, StoppingConfig
from dynatree.errors import DynaTreeError
from tiny import perturbed, tiny_model

PROMPT = [3, 17, 5, 9, 3, 17]
NEVER = StoppingConfig(eos_token_id=())


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama")
    return target, perturbed(target)


def _quiet(*args, **kwargs):
    """generate() that must not warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        return dynatree.generate(*args, **kwargs)


# ------------------------------------------------------------------------------- StoppingConfig
def test_stopping_config_normalises_and_validates():
    assert StoppingConfig(eos_token_id=[2, 7]) == StoppingConfig(eos_token_id=(2, 7))
    assert StoppingConfig(eos_token_id=torch.tensor([2, 7])).eos_token_id == (2, 7)
    assert StoppingConfig(eos_token_id=[]).eos_token_id == ()
    assert StoppingConfig(stop_strings="\n").stop_strings == ("\n",)
    assert StoppingConfig(eos_token_id=5).eos_token_id == 5
    for bad in (-1, [3, -2], "2", [1.5], True):
        with pytest.raises(DynaTreeError, match="eos_token_id"):
            StoppingConfig(eos_token_id=bad)
    for bad in ([""], [3], 5, ["ok", None]):
        with pytest.raises(DynaTreeError, match="stop_strings"):
            StoppingConfig(stop_strings=bad)


# ------------------------------------------------------------------------------ typed groups
def test_groups_run_without_warnings_and_equal_autoregressive(pair):
    target, draft = pair
    ref = _quiet(target, None, PROMPT, "autoregressive", max_new_tokens=24, stopping=NEVER)
    out = _quiet(target, draft, PROMPT, "linear:k=3", max_new_tokens=24, stopping=NEVER,
                 options=EngineOptions(engine="static"), sampling=SamplingConfig())
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.new_tokens == 24


def test_eos_in_stopping_stops(pair):
    target, _ = pair
    free = _quiet(target, None, PROMPT, "autoregressive", max_new_tokens=20, stopping=NEVER)
    first = int(free.sequences[0, len(PROMPT) + 3])
    stopped = _quiet(target, None, PROMPT, "autoregressive", max_new_tokens=20,
                     stopping=StoppingConfig(eos_token_id=first))
    new = stopped.sequences[0, len(PROMPT):].tolist()
    assert new[-1] == first and len(new) <= 4


# ----------------------------------------------------------------------- flat keywords, deprecated
def test_flat_sampling_keywords_warn_and_match_the_group(pair):
    target, draft = pair
    grouped = _quiet(target, draft, PROMPT, "dyspec", max_new_tokens=16, stopping=NEVER, seed=3,
                     sampling=SamplingConfig(temperature=0.9, top_k=20, draft_temperature=0.5))
    with pytest.warns(DeprecationWarning, match=r"temperature=.*sampling=SamplingConfig\(temperature=\.\.\., top_k"):
        flat = dynatree.generate(target, draft, PROMPT, "dyspec", max_new_tokens=16, stopping=NEVER, seed=3,
                                 temperature=0.9, top_k=20, draft_temperature=0.5)
    assert torch.equal(flat.sequences, grouped.sequences)
    # control: the temperature took effect (a dropped keyword would have run greedily)
    greedy = _quiet(target, draft, PROMPT, "dyspec", max_new_tokens=16, stopping=NEVER, seed=3)
    assert not torch.equal(greedy.sequences, grouped.sequences)


def test_flat_engine_and_stopping_keywords_and_positional_values_warn_once(pair):
    target, draft = pair
    ref = _quiet(target, draft, PROMPT, "linear", max_new_tokens=12, stopping=NEVER,
                 options=EngineOptions(engine="static", tree_order="dfs"), k=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = dynatree.generate(target, draft, PROMPT, "linear", 12, [], engine="static", tree_order="dfs", k=3)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 1, messages
    for part in ("max_new_tokens by position", "eos_token_id by position", "engine=", "tree_order=",
                 "options=EngineOptions(engine=..., tree_order=...)", "stopping=StoppingConfig(eos_token_id=...)"):
        assert part in messages[0]
    assert caught[0].filename == __file__  # points at the caller, not at dynatree's internals
    assert torch.equal(out.sequences, ref.sequences)


def test_a_setting_given_flat_and_in_its_group_is_refused(pair):
    target, draft = pair
    with pytest.raises(DynaTreeError, match="temperature given both"):
        dynatree.generate(target, draft, PROMPT, max_new_tokens=4, temperature=0.5, sampling=SamplingConfig())
    with pytest.raises(DynaTreeError, match="eos_token_id given both"):
        dynatree.generate(target, draft, PROMPT, max_new_tokens=4, eos_token_id=[], stopping=NEVER)
    with pytest.raises(DynaTreeError, match="given twice and different"):
        dynatree.generate(target, draft, PROMPT, max_new_tokens=4, engine="hf",
                          options=EngineOptions(engine="static"))
    with pytest.raises(DynaTreeError, match="max_new_tokens given both"):
        dynatree.generate(target, draft, PROMPT, "linear", 8, max_new_tokens=4)
    with pytest.raises(DynaTreeError, match="at most 4 positional"):
        dynatree.generate(target, draft, PROMPT, "linear", 8, [], "extra")


def test_a_misspelt_keyword_gets_a_hint(pair):
    target, draft = pair
    with pytest.raises(DynaTreeError, match=r"did you mean temperature= for temprature=\?"):
        dynatree.generate(target, draft, PROMPT, max_new_tokens=4, temprature=0.5)
    with pytest.raises(DynaTreeError, match=r"did you mean stopping= for stoping=\?"):
        dynatree.generate(target, draft, PROMPT, "linear", max_new_tokens=4, stoping=NEVER)
    with pytest.raises(DynaTreeError) as plain:  # nothing close: the strategy's own error, no hint
        dynatree.generate(target, draft, PROMPT, "linear", max_new_tokens=4, zzz=1)
    assert "did you mean" not in str(plain.value)


def test_public_types_are_exported():
    for name in ("SamplingConfig", "EngineOptions", "StoppingConfig", "DraftPolicy", "TreeBuilder", "TextDraft"):
        assert name in dynatree.__all__ and getattr(dynatree, name) is not None
