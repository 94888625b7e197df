"""Stop strings behave like HF ``generate(stop_strings=..., tokenizer=...)``."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import dynatree
from dynatree import DynaTreeError, StoppingConfig
from tiny import perturbed, tiny_model

VOCAB = 300


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (the kind HF's stop-string matcher understands) trained in-process."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["the quick brown fox jumps over the lazy dog", "speculative decoding verifies a tree"] * 50
    tok.train_from_iterator(text, trainer)
    assert tok.get_vocab_size() <= VOCAB
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize("strategy", ["autoregressive", "linear", "dynatree"])
def test_stop_string_matches_hf(tokenizer, strategy: str) -> None:
    target = tiny_model("llama", 0, vocab=VOCAB)
    draft = perturbed(target)
    ids = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))
    free = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None, pad_token_id=0)
    text = tokenizer.decode(free[0, 5:])
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a piece from the middle, maybe across tokens
    ref = target.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None, pad_token_id=0,
                          stop_strings=[stop], tokenizer=tokenizer)
    out = dynatree.generate(target, draft, ids, strategy, max_new_tokens=40,
                            stopping=StoppingConfig(eos_token_id=(), stop_strings=(stop,)), tokenizer=tokenizer)
    assert ref.shape[1] < free.shape[1]  # the stop string did stop HF early
    assert torch.equal(out.sequences, ref)
    assert stop in tokenizer.decode(out.sequences[0, 5:])


def test_stop_strings_need_a_tokenizer() -> None:
    target = tiny_model("llama", 0)
    with pytest.raises(DynaTreeError, match="stop_strings need a tokenizer"):
        dynatree.generate(target, None, [3, 4], "autoregressive", stopping=StoppingConfig(stop_strings=("x",)))
