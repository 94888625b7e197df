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
                            stopping=StoppingConfig(eos_token_id=(), stop_strings=(stop,)), tokenizer=tokenizer, text=False)
    assert ref.shape[1] < free.shape[1]  # the stop string did stop HF early
    assert torch.equal(out.sequences, ref)
    assert stop in tokenizer.decode(out.sequences[0, 5:])


def test_stop_strings_need_a_tokenizer() -> None:
    target = tiny_model("llama", 0)
    with pytest.raises(DynaTreeError, match="stop_strings need a tokenizer"):
        dynatree.generate(target, None, [3, 4], "autoregressive", stopping=StoppingConfig(stop_strings=("x",)))


@pytest.mark.parametrize("strategy", ["autoregressive", "dynatree"])
def test_a_batch_stops_each_row_at_its_own_stop_string(tokenizer, strategy: str) -> None:
    """Each row of a batch stops at its own stop string, as HF's ``generate`` stops that prompt
    alone, and is padded after it. (HF's *batched* generate with transformers 5.23 did not stop
    the row in this case although its single-prompt run does: the single run is the reference.)"""
    target = tiny_model("llama", 0, vocab=VOCAB)
    draft = perturbed(target)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, VOCAB, (3, 6), generator=g)
    rows = [ids[0, 3:], ids[1], ids[2]]  # prompts of 3, 6 and 6 tokens
    free = [target.generate(r[None], do_sample=False, max_new_tokens=30, eos_token_id=None, pad_token_id=0)
            for r in rows]
    texts = [tokenizer.decode(f[0, len(r):]) for f, r in zip(free, rows)]
    # row 1 stops a third of the way in, at plain text (HF matches token strings, which a piece of a
    # multi-byte character does not survive) that the other rows never write
    stop = next(texts[1][i: i + 3] for i in range(len(texts[1]) // 3, len(texts[1]) - 3)
                if texts[1][i: i + 3].isascii() and texts[1][i: i + 3].isprintable()
                and texts[1][i: i + 3] not in texts[0] + texts[2])
    refs = [target.generate(r[None], do_sample=False, max_new_tokens=30, eos_token_id=None, pad_token_id=0,
                            stop_strings=[stop], tokenizer=tokenizer)[0, len(r):].tolist() for r in rows]
    out = dynatree.generate(target, draft, [r.tolist() for r in rows], strategy, max_new_tokens=30,
                            tokenizer=tokenizer,
                            stopping=StoppingConfig(eos_token_id=(), stop_strings=(stop,), pad_token_id=0), text=False)
    assert len(refs[1]) < 30 and [len(r) for r in (refs[0], refs[2])] == [30, 30]  # only row 1 stops early
    assert [s.new_tokens for s in out.stats] == [len(r) for r in refs]
    for b, ref in enumerate(refs):
        assert out.sequences[b, 6: 6 + len(ref)].tolist() == ref
        assert (out.sequences[b, 6 + len(ref):] == 0).all()
