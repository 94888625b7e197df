"""Bad input is refused up front with one clear line, never a traceback from inside torch."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import dynatree
from dynatree import DynaTreeError
from dynatree.cli import app
from tiny import tiny_model


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    return tiny_model("llama", 0, max_positions=64), tiny_model("llama", 1, max_positions=64)


IDS = torch.tensor([[5, 6, 7]])
NO_EOS = dynatree.StoppingConfig(eos_token_id=())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_ids": torch.tensor([[5, 6], [7, 8]]), "attention_mask": torch.tensor([[1, 1], [1, 0]])},
         "row 1 of attention_mask is not left-padded"),
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "empty prompt"),
        ({"input_ids": torch.tensor([[5, 500]])}, "token id 500 out of range"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"strategy": "dynatre"}, "unknown strategy 'dynatre'; did you mean 'dynatree'"),
        ({"strategy": "linear", "kk": 3}, "unknown option(s) kk for strategy 'linear'; valid: k"),
        ({"strategy": "linear", "k": 0}, "invalid k=0: must be an integer in [1, 256]"),
        ({"tau_l": 0.95}, "invalid tau_l=0.95: must be in (0, tau_h=0.9)"),
        ({"b_min": 4}, "invalid b_mid=2: must be between b_min=4 and b_max=3"),
        ({"d0": 8}, "invalid d0=8: must be less than d_max=8"),
        ({"max_nodes": -1}, "invalid max_nodes=-1"),
        ({"strategy": "fixed", "tau": 1.5}, "invalid tau=1.5: must be in [0, 1)"),
        ({"rho_stop": 0.6}, "invalid rho_stop=0.6: must be in (0, rho_deep=0.5)"),
        ({"max_new_tokens": 60}, "= 72 positions exceeds LlamaForCausalLM's maximum of 64 by 8"),
    ],
)
def test_bad_arguments(pair, kwargs: dict, message: str) -> None:
    target, draft = pair
    args = {"input_ids": IDS, "strategy": "dynatree", "max_new_tokens": 5, **kwargs}
    with pytest.raises(DynaTreeError) as err:
        dynatree.generate(target, draft, **args, text=False)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_no_draft_model_drafts_from_the_text_within_the_positions(pair) -> None:
    # draft=None is no longer refused: the suffix source drafts, and its trees' depth counts
    # towards the model's positions like any policy's.
    with pytest.raises(DynaTreeError, match=r"tree depth \(32\).*exceeds LlamaForCausalLM's maximum of 64"):
        dynatree.generate(pair[0], None, IDS, "linear")
    out = dynatree.generate(pair[0], None, IDS, "linear", max_new_tokens=8, stopping=NO_EOS)
    assert out.stats.new_tokens == 8 and out.sequences.shape == (1, IDS.shape[1] + 8)


def test_vocab_mismatch_and_override(pair) -> None:
    other = tiny_model("llama", 2, vocab=128, max_positions=64)
    with pytest.raises(DynaTreeError, match=r"draft vocabulary \(128 tokens\) differs from the target's \(96\)"):
        dynatree.generate(pair[0], other, IDS, "linear", max_new_tokens=5, text=False)
    out = dynatree.generate(pair[0], other, IDS, "linear", max_new_tokens=5, stopping=NO_EOS,
                            allow_vocab_mismatch=True, text=False)
    ref = pair[0].generate(IDS, do_sample=False, max_new_tokens=5, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out.sequences, ref)


def test_truncate_prompt_keeps_the_tail(pair) -> None:
    target, draft = pair
    ids = torch.arange(2, 62).view(1, -1)  # 60 tokens; 60 + 5 + depth 5 > 64
    out = dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=5, truncate_prompt=True, stopping=NO_EOS, text=False)
    kept = 64 - 5 - 5  # (DynaTree's d_max is 9, but no tree is deeper than the 5 new tokens)
    assert out.stats.prompt_tokens == kept
    assert torch.equal(out.sequences[0, :kept], ids[0, -kept:])


def test_training_mode_is_restored(pair) -> None:
    target, draft = pair
    target.train()
    try:
        dynatree.generate(target, draft, IDS, "linear", max_new_tokens=3, text=False)
        assert target.training and not draft.training
    finally:
        target.eval()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--strategy", "dynatre"], "did you mean 'dynatree'"),
        (["generate", "--prompt", "   "], "empty prompt"),
        (["generate", "--max-new-tokens", "0"], "--max-new-tokens must be a positive integer"),
        (["generate", "-o", "k"], "strategy option 'k' must look like name=value"),
        (["generate", "--strategy", "linear", "-o", "k=0"], "invalid k=0"),
        (["generate", "--kv-window", "0"], "kv_window must be a positive integer"),
        (["generate", "--kv-window", "64", "--kv-sinks", "-1"], "kv_sinks must be an integer >= 0"),
        (["generate", "--engine", "hf", "--compile"], "compile=True needs engine='static'"),
        (["generate", "--buckets", "0"], "buckets must be positive integers"),
        (["chat", "--engine", "fast"], "unknown engine 'fast'"),
    ],
)
def test_cli_one_line_errors(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
