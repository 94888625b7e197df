"""The library's default draft: a draft model drafts together with the text, in one tree.

``generate(target, draft, ids)`` must run exactly what ``TextDraft(model=draft)`` runs (the CLI's
default), ``text=False`` the draft model's tree alone (the papers' trees); all three equal greedy
decoding. Rounds are compared with the back-off off: it decides by timing.
"""

from __future__ import annotations

import pytest
import torch
from test_suffix_source import repetitive_prompt
from tiny import perturbed, tiny_model

import dynatree
import dynatree.hf
from dynatree import DynaTreeError, StoppingConfig, TextDraft
from dynatree.integrations.chat import ChatSession
from dynatree.loop import generate as generate_module

NO_EOS = StoppingConfig(eos_token_id=())
N = 40


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("llama", seed=1)  # its greedy output from a repeating prompt loops: the text has work
    return target, perturbed(target, noise=0.1), repetitive_prompt(target.config.vocab_size, seed=2)


def _run(target, draft, ids, **kw):
    return dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=N, stopping=NO_EOS, backoff=False, **kw)


def _rounds(result) -> list[tuple[int, int, int]]:
    return [(r.drafted, r.committed, r.draft_calls) for r in result.stats.rounds]


def test_a_draft_model_drafts_with_the_text_unless_text_is_false(setup) -> None:
    target, draft, ids = setup
    ref = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=N, stopping=NO_EOS)
    default = _run(target, draft, ids)
    both = _run(target, TextDraft(model=draft), ids)
    alone = _run(target, draft, ids, text=False)
    for out in (default, both, alone):
        assert torch.equal(out.sequences, ref.sequences)
    assert _rounds(default) == _rounds(both)
    assert _rounds(alone) != _rounds(both)
    # the model alone calls the draft in every drafting round; with the text it sits some out
    assert sum(r.draft_calls for r in alone.stats.rounds) > sum(r.draft_calls for r in default.stats.rounds)


def test_the_default_fails_when_the_text_is_not_joined(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken variant (the model alone whatever ``text`` says) no longer runs what the default
    promises: the rounds comparison above catches it."""
    target, draft, ids = setup
    monkeypatch.setattr(generate_module, "with_text", lambda d, *args: d)
    default = _run(target, draft, ids)
    both = _run(target, TextDraft(model=draft), ids)
    assert _rounds(default) != _rounds(both)


def test_text_applies_to_a_draft_model_only_and_is_a_bool(setup) -> None:
    target, draft, ids = setup
    text_only = _run(target, None, ids)
    assert _rounds(_run(target, None, ids, text=False)) == _rounds(text_only)  # None drafts from the text anyway
    with pytest.raises(DynaTreeError, match="text must be True or False, got 1"):
        _run(target, draft, ids, text=1)


def test_the_hf_route_and_chat_follow_the_same_default(setup) -> None:
    target, draft, ids = setup
    both = _run(target, TextDraft(model=draft), ids)
    alone = _run(target, draft, ids, text=False)
    kw = dict(max_new_tokens=N, eos_token_id=None, pad_token_id=0, engine_options={"backoff": False})
    hf_default = dynatree.hf.generate(target, ids[None], assistant_model=draft, **kw)
    assert _rounds(hf_default) == _rounds(both)
    kw["engine_options"] = {"backoff": False, "text": False}
    hf_alone = target.generate(ids[None], custom_generate=dynatree.hf.generate, draft=draft, **kw)
    assert _rounds(hf_alone) == _rounds(alone)
    assert torch.equal(hf_default, hf_alone)
    # ChatSession resolves the draft once, with the same rule
    assert isinstance(ChatSession(target, draft, None, "linear").draft, TextDraft)
    assert ChatSession(target, draft, None, "linear", text=False).draft is draft


def test_the_cli_hybrid_fits_a_window_the_model_alone_fits(model_dirs) -> None:
    """`dynatree generate --kv-window 16` with its default `--text`: the CLI's hybrid reaches no
    deeper than the window allows, as the library's default does (it used to reserve the text's
    full depth of 32 and refuse the window)."""
    from typer.testing import CliRunner

    from dynatree.cli import app

    argv = ["generate", "--target", model_dirs[0], "--draft", model_dirs[1], "--prompt", "the cat sat on the mat",
            "--max-new-tokens", "40", "--kv-window", "16"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, [*argv, "--no-text"]).exit_code == 0
