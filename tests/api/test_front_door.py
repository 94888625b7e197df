"""The front door: models and prompts of the wrong kind, and settings out of range, are refused in
one line before any model runs (library and HF entry) and before any model loads (CLI).

Every refusal is checked with a spy on each module's forward: an encoder-decoder would otherwise be
refused only after HF ran its encoder, and a masked LM or a bool prompt would not be refused at all.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (BartConfig, BartForConditionalGeneration, BertConfig, BertForMaskedLM, BertLMHeadModel,
                          BertModel, T5Config, T5ForConditionalGeneration)
from typer.testing import CliRunner

import dynatree
import dynatree.hf
from dynatree import DynaTreeError
from dynatree.cli import app
from dynatree.drafts.suffix import TextDraft
from dynatree.runtime.inputs import check_causal_lm
from cli_helpers import error_lines
from tiny import ARCHS, WINDOW_ARCHS, tiny_model
from tiny_tok import VOCAB

REPO = Path(__file__).resolve().parents[2]
IDS = torch.tensor([[5, 6, 7, 8]])


# ------------------------------------------------------------------------------------ helpers
@functools.lru_cache(maxsize=None)
def llama() -> torch.nn.Module:
    return tiny_model("llama", 0, vocab=VOCAB)


def _bert(**extra: Any) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=64, **extra)


# Models that are no decoder-only causal LM, built tiny and random: (what to build, the refusal).
WRONG_KINDS: dict[str, tuple[Callable[[], torch.nn.Module], str]] = {
    "t5": (lambda: T5ForConditionalGeneration(T5Config(
        vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1, num_heads=4, d_kv=8, decoder_start_token_id=0)),
        "encoder-decoder models are not supported by dynatree (decoder-only causal LMs only): the {role} is a "
        "T5ForConditionalGeneration"),
    "bart": (lambda: BartForConditionalGeneration(BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)),
        "encoder-decoder models are not supported by dynatree (decoder-only causal LMs only): the {role} is a "
        "BartForConditionalGeneration"),
    "masked-lm": (lambda: BertForMaskedLM(_bert()), "the {role} BertForMaskedLM is not a causal LM (it has no "
                  "next-token head"),
    "encoder": (lambda: BertModel(_bert()), "the {role} BertModel is not a causal LM (it has no next-token head"),
    "bidirectional-lm-head": (lambda: BertLMHeadModel(_bert()), "the {role} BertLMHeadModel is not a causal LM: its "
                              "attention is bidirectional (its config has is_decoder=False)"),
    "llama-body": (lambda: tiny_model("llama", 0, vocab=VOCAB).model, "the {role} LlamaModel is not a causal LM (it "
                   "has no next-token head"),
}


@functools.lru_cache(maxsize=None)
def wrong(kind: str) -> torch.nn.Module:
    return WRONG_KINDS[kind][0]().eval()


@contextlib.contextmanager
def no_model_call(*models: torch.nn.Module) -> Iterator[None]:
    """Fail if any module of ``models`` (submodules included: an encoder is one) runs a forward."""
    calls: list[str] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=type(m).__name__: calls.append(name))
             for model in models for m in model.modules()]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == [], f"model forwards ran before the refusal: {calls[:5]}"


def refused(call: Callable[[], Any], *models: torch.nn.Module) -> str:
    """The one-line DynaTreeError ``call`` raises, with no forward of ``models`` before it."""
    with no_model_call(*models), pytest.raises(DynaTreeError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------ model kinds
@pytest.mark.parametrize("kind", WRONG_KINDS)
@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_that_is_no_causal_lm_is_refused_before_any_call(kind: str, role: str) -> None:
    bad, good = wrong(kind), llama()
    target, draft = (bad, good) if role == "target" else (good, bad)
    message = refused(lambda: dynatree.generate(target, draft, IDS, "linear", max_new_tokens=4, k=2, text=False), bad, good)
    assert message.startswith(WRONG_KINDS[kind][1].format(role=role))


@pytest.mark.parametrize("kind", ["t5", "masked-lm"])
def test_the_model_part_of_a_hybrid_draft_is_checked_too(kind: str) -> None:
    bad, good = wrong(kind), llama()
    message = refused(lambda: dynatree.generate(good, TextDraft(model=bad), IDS, "linear", max_new_tokens=4, k=2),
                      bad, good)
    assert message.startswith(WRONG_KINDS[kind][1].format(role="draft"))


@pytest.mark.parametrize("arch", [*ARCHS, *WINDOW_ARCHS])
def test_every_supported_architecture_passes_the_model_check(arch: str) -> None:
    """What the refusals above must not catch: the causal LMs the engine is tested on."""
    check_causal_lm(tiny_model(arch, 0), "target")


def test_a_causal_bert_passes_the_model_check() -> None:
    """BERT with ``is_decoder=True`` flags its attention causal: the same class is refused without it."""
    check_causal_lm(BertLMHeadModel(_bert(is_decoder=True)), "target")
    with pytest.raises(DynaTreeError, match="attention is bidirectional"):
        check_causal_lm(wrong("bidirectional-lm-head"), "target")


# ----------------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("ids, message", [
    (torch.tensor([[True, False, True]]), "input_ids must be integer token ids, got bools"),
    ([True, False, True], "input_ids must be integer token ids, got bools"),
    ([[5, True, 7]], "input_ids must be integer token ids, got bools"),
    ([[1, 2, 3], [4, VOCAB]], f"token id {VOCAB} out of range for the target vocabulary (size {VOCAB})"),
    ([[1, 2, 3], 4], "input_ids mixes lists and token ids"),
    (None, "input_ids must be token ids ([1, L] or [L] integers), got None"),
    ("the fox", "input_ids must be token ids ([1, L] or [L] integers), got a str; tokenize the prompt first"),
    (torch.zeros(0, 3, dtype=torch.long), "empty prompt: input_ids of shape (0, 3) has no rows"),
    (torch.tensor([1.0, 2.0]), "input_ids must be integer token ids"),
    ([1.0, 2.0], "input_ids must be integer token ids"),
    (torch.tensor([1 + 0j]), "input_ids must be integer token ids"),
    ([5, VOCAB], f"token id {VOCAB} out of range for the target vocabulary (size {VOCAB})"),
    ([5, -2, 7], f"token id -2 out of range for the target vocabulary (size {VOCAB})"),
    ([], "empty prompt: input_ids has no tokens"),
    ([[]], "empty prompt: input_ids has no tokens"),
    ([[5, 6], []], "empty prompt: input_ids has no tokens"),
], ids=["bool tensor", "bool list", "bool in a row", "a batch's bad row", "mixed", "None", "text", "no rows", "float tensor",
        "float list", "complex", "outside the vocabulary", "negative", "empty", "empty row", "a batch's empty row"])
def test_bad_prompts_are_refused_before_any_call(ids: Any, message: str) -> None:
    target = llama()
    assert refused(lambda: dynatree.generate(target, None, ids, "linear", max_new_tokens=4), target).startswith(message)


# ------------------------------------------------------------------------------- HF entry
@pytest.mark.parametrize("route", ["direct", "folder"])
def test_hf_entry_refuses_an_encoder_decoder_before_its_encoder_runs(route: str) -> None:
    """HF's preparation runs an encoder-decoder's encoder; called directly or through the
    custom_generate/ folder (raw arguments), dynatree refuses before that."""
    t5, draft = wrong("t5"), llama()
    if route == "direct":
        call = functools.partial(dynatree.hf.generate, t5, IDS, assistant_model=draft, max_new_tokens=3)
    else:
        call = functools.partial(t5.generate, IDS, assistant_model=draft, custom_generate=str(REPO),
                                 trust_remote_code=True, max_new_tokens=3)
    assert refused(call, t5, draft).startswith(WRONG_KINDS["t5"][1].format(role="target"))


@pytest.mark.parametrize("kind", ["t5", "masked-lm"])
@pytest.mark.parametrize("route", ["callable", "direct"])
def test_hf_entry_refuses_an_assistant_model_that_is_no_causal_lm(kind: str, route: str) -> None:
    bad, target = wrong(kind), llama()
    if route == "callable":  # (the draft's keyword there: HF does not pass assistant_model on to a callable)
        call = functools.partial(target.generate, IDS, draft=bad, custom_generate=dynatree.hf.generate,
                                 max_new_tokens=3, pad_token_id=0)
    else:
        call = functools.partial(dynatree.hf.generate, target, IDS, assistant_model=bad, max_new_tokens=3,
                                 pad_token_id=0)
    role = "draft" if route == "callable" else "assistant_model"
    assert refused(call, bad, target).startswith(WRONG_KINDS[kind][1].format(role=role))


@pytest.mark.parametrize("ids, message", [
    ([[5, 6, 7]], "inputs must be a [B, L] tensor of token ids, as for HF's generate, got a list"),
    (torch.tensor([5, 6, 7]), "inputs must be [B, L] (batch, length), as for HF's generate, got shape (3,)"),
    (torch.tensor([[True, False, True]]), "input_ids must be integer token ids, got bools"),
], ids=["list", "one dimension", "bools"])
def test_hf_entry_refuses_ids_it_cannot_take(ids: Any, message: str) -> None:
    target = llama()
    call = functools.partial(dynatree.hf.generate, target, ids, max_new_tokens=3, pad_token_id=0)
    assert refused(call, target).startswith(message)
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:  # HF's own route to the engine refuses them too
        call = functools.partial(target.generate, ids, custom_generate=dynatree.hf.generate, max_new_tokens=3,
                                 pad_token_id=0)
        assert refused(call, target).startswith(message)


# ------------------------------------------------------------------------------------- CLI
@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails the test: the settings must be refused before one."""
    from dynatree.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


def cli_error(argv: list[str]) -> str:
    res = CliRunner().invoke(app, argv, input="/exit\n")
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = error_lines(res.stderr)
    assert len(lines) == 1, res.output
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["generate", "--temperature", "-1"], "invalid temperature=-1.0: must be a finite number >= 0"),
    (["generate", "--temperature", "1", "--top-p", "2"], "invalid top_p=2.0: must be None or a number in (0, 1]"),
    (["generate", "--temperature", "1", "--top-k", "-3"], "invalid top_k=-3"),
    (["generate", "--strategy", "dyspec", "--draft-temperature", "-1"], "invalid draft_temperature=-1.0"),
    (["generate", "--seed", "-1"], "invalid seed=-1: must be None or an integer in [0, 2**64)"),
    (["generate", "--draft", "early-exit:x"], "bad draft spec 'early-exit:x': expected early-exit:K"),
    (["generate", "--draft", "no-such-draft"], "unknown model 'no-such-draft'"),
    (["chat", "--temperature", "-1"], "invalid temperature=-1.0"),
    (["chat", "--seed", "-1"], "invalid seed=-1"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_generate_and_chat_refuse_bad_settings_before_loading_a_model(no_loading, argv: list[str],
                                                                       message: str) -> None:
    assert cli_error(argv).startswith(f"error: {message}")


def test_generate_refuses_a_trace_path_it_could_not_write_before_loading_a_model(no_loading, tmp_path: Path) -> None:
    """The page is written after the run: a bad path used to end a finished run in FileNotFoundError."""
    missing = tmp_path / "no-such-folder" / "trace.html"
    assert cli_error(["generate", "--trace", str(missing)]) == \
        f"error: --trace {missing}: the folder {missing.parent} does not exist"
    assert cli_error(["generate", "--trace", str(tmp_path)]) == \
        f"error: --trace {tmp_path} is a folder: give the path of a file to write"


@pytest.mark.parametrize("argv, message", [
    (["bench", "--temperature", "-1"], "--temperature must be a finite number >= 0, got -1.0"),
    (["bench", "--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
    (["bench", "--max-new-tokens", "0"], "--max-new-tokens must be a positive integer, got 0"),
    (["bench", "--num-prompts", "0"], "--num-prompts must be at least 1, got 0"),
    (["bench", "--max-prompt-tokens", "0"], "--max-prompt-tokens must be at least 1, got 0"),
    (["bench", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["bench", "--warmup-tokens", "-1"], "--warmup-tokens must be >= 0"),
    (["bench", "--dataset", "no-such-set"], "unknown prompt set 'no-such-set': use one of pydoc"),
    (["bench", "--strategies", "autoregressive,hf-assisted", "--draft", "none"],
     "hf-assisted needs a draft model (--draft none gives none)"),
    (["bench", "--draft", "early-exit:x"], "bad draft spec 'early-exit:x'"),
    (["sweep", "--strategy", "linear", "-g", "k=2,3", "--lengths", "x"],
     "--lengths must be comma-separated positive integers, got 'x'"),
    (["sweep", "--strategy", "linear", "-g", "k=2,3", "--max-new-tokens", "0"],
     "--max-new-tokens must be a positive integer, got 0"),
    (["sweep", "--strategy", "linear", "-g", "k=2,3", "--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["sweep", "--strategy", "linear", "-g", "k=2,3", "--dataset", "no-such-set"], "unknown prompt set"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bench_and_sweep_refuse_bad_settings_before_loading_a_model(no_loading, tmp_path: Path, argv: list[str],
                                                                     message: str) -> None:
    out = tmp_path / "r.jsonl"
    assert cli_error([*argv, "--output", str(out)]).startswith(f"error: {message}")
    assert not out.exists()


def test_bench_refuses_a_prompt_file_with_too_few_prompts_before_loading_a_model(no_loading, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the fox\n\nthe dog\n", encoding="utf-8")
    argv = ["bench", "--dataset", str(prompts), "--num-prompts", "3", "--output", str(tmp_path / "r.jsonl")]
    assert cli_error(argv) == f"error: '{prompts}' has only 2 prompts, 3 requested"


# ----------------------------------------------------------------- gaps found by a user's read
@pytest.mark.parametrize("ids", [[[5, 6, 7], [8, True, 9]], [[5, 6], [7, 8], [False, 9]]],
                         ids=["second row", "third row"])
def test_a_bool_in_a_later_row_of_an_equal_length_batch_is_refused(ids: Any) -> None:
    """Every row is read, not only the first: a bool anywhere is a mask in the ids' place (torch
    would run it as token 1)."""
    target = llama()
    message = refused(lambda: dynatree.generate(target, None, ids, "linear", max_new_tokens=4), target)
    assert message.startswith("input_ids must be integer token ids, got bools")


@pytest.mark.parametrize("value", ["10", 2.5, 0, True], ids=["a string", "a float", "zero", "a bool"])
@pytest.mark.parametrize("draft", ["model", "text"])
def test_max_new_tokens_of_the_wrong_kind_is_refused_by_name(value: Any, draft: str) -> None:
    """Checked before anything reads it (the text source's depth did: a raw TypeError for "10",
    an error blaming max_spec for 2.5)."""
    target = llama()
    d = tiny_model("llama", 1, vocab=VOCAB) if draft == "model" else None
    message = refused(lambda: dynatree.generate(target, d, IDS, max_new_tokens=value), target)
    assert message == f"max_new_tokens must be a positive integer, got {value!r}"


def test_a_batch_without_a_mask_reads_its_padding_as_hf_does() -> None:
    """[B, L] without attention_mask: where the pad token is not an EOS token, its occurrences are
    padding (HF's generate infers the mask so); the rows equal those decoded alone. Where it is also
    the EOS token and a row begins with it, the batch is refused in one line."""
    target = tiny_model("llama", 0, vocab=VOCAB)  # (its own: the test sets its generation config)
    target.generation_config.pad_token_id = 0
    target.generation_config.eos_token_id = 1
    batch = torch.tensor([[0, 0, 5, 6, 7], [9, 8, 5, 6, 7]])
    out = dynatree.generate(target, None, batch, "autoregressive", max_new_tokens=6,
                            stopping=dynatree.StoppingConfig(eos_token_id=()))
    alone = dynatree.generate(target, None, [[5, 6, 7]], "autoregressive", max_new_tokens=6,
                              stopping=dynatree.StoppingConfig(eos_token_id=()))
    assert out.sequences[0, -6:].tolist() == alone.sequences[0, -6:].tolist()
    assert out.stats[0].prompt_tokens == 3 and out.stats[1].prompt_tokens == 5
    target.generation_config.eos_token_id = 0  # pad == EOS: cannot tell
    message = refused(lambda: dynatree.generate(target, None, batch, "autoregressive", max_new_tokens=4), target)
    assert message.startswith("input_ids is a [B, L] batch without attention_mask, and rows [0] begin with token 0")
    ok = dynatree.generate(target, None, batch[[1, 1]], "autoregressive", max_new_tokens=2)  # (no row begins with it)
    assert ok.sequences.shape[0] == 2


@pytest.mark.parametrize("route", ["direct", "callable"])
def test_an_empty_prompt_on_the_hf_route_is_called_empty(route: str) -> None:
    """[1, 0] ids are an empty prompt, said so (not a hint about inputs_embeds, which it has none of)."""
    target = llama()
    empty = torch.zeros(1, 0, dtype=torch.long)
    if route == "direct":
        call = functools.partial(dynatree.hf.generate, target, empty, max_new_tokens=3, pad_token_id=0)
    else:
        call = functools.partial(target.generate, empty, custom_generate=dynatree.hf.generate, max_new_tokens=3,
                                 pad_token_id=0)
    assert refused(call, target) == "empty prompt: input_ids of shape (1, 0) has no tokens"
