"""generate()'s typed groups (sampling=, options=, stopping=) and the flat keywords they replaced.

The flat spellings of 0.1 are refused (since 0.2) with the group to use, and a misspelt keyword
gets a hint instead of passing for an option of the strategy.
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


# ------------------------------------------------------------------ flat keywords, removed in 0.2
@pytest.mark.parametrize("kwargs, group", [
    ({"temperature": 0.9}, r"temperature= was removed in dynatree 0\.2; pass sampling=SamplingConfig\(temperature=\.\.\.\)"),
    ({"engine": "static", "tree_order": "dfs"}, r"options=EngineOptions\(engine=\.\.\., tree_order=\.\.\.\)"),
    ({"eos_token_id": []}, r"stopping=StoppingConfig\(eos_token_id=\.\.\.\)"),
    ({"top_k": 20, "stop_strings": "x"}, r"sampling=SamplingConfig\(top_k=\.\.\.\) and stopping=StoppingConfig\(stop_strings"),
])
def test_flat_keywords_are_refused_with_their_group(pair, kwargs, group):
    target, draft = pair
    with pytest.raises(DynaTreeError, match=group):
        dynatree.generate(target, draft, PROMPT, "linear", max_new_tokens=4, **kwargs)


def test_settings_after_the_strategy_are_keywords_only(pair):
    target, draft = pair
    with pytest.raises(TypeError, match="positional"):
        dynatree.generate(target, draft, PROMPT, "linear", 8)
    with pytest.raises(DynaTreeError, match="sampling= takes a SamplingConfig, got float"):
        dynatree.generate(target, draft, PROMPT, max_new_tokens=4, sampling=0.5)


def test_a_misspelt_keyword_gets_a_hint(pair):
    target, draft = pair
    with pytest.raises(DynaTreeError, match=r"did you mean sampling=SamplingConfig\(temperature=\.\.\.\) for temprature=\?"):
        dynatree.generate(target, draft, PROMPT, max_new_tokens=4, temprature=0.5)
    with pytest.raises(DynaTreeError, match=r"did you mean stopping= for stoping=\?"):
        dynatree.generate(target, draft, PROMPT, "linear", max_new_tokens=4, stoping=NEVER)
    with pytest.raises(DynaTreeError) as plain:  # nothing close: the strategy's own error, no hint
        dynatree.generate(target, draft, PROMPT, "linear", max_new_tokens=4, zzz=1)
    assert "did you mean" not in str(plain.value)


def test_public_types_are_exported():
    for name in ("SamplingConfig", "EngineOptions", "StoppingConfig", "DraftPolicy", "TreeBuilder", "TextDraft"):
        assert name in dynatree.__all__ and getattr(dynatree, name) is not None
