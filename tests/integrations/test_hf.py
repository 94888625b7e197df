"""HF-native entry: ``target.generate(..., custom_generate=...)`` runs dynatree's loop.

Greedy output must equal plain HF greedy ``target.generate(ids, do_sample=False)`` token for token,
through both of HF's routes (a callable, and the repository's ``custom_generate/`` folder, which
HF calls with raw arguments, and a direct call); streamers must see tokens round by round; what the
engine cannot reproduce must be refused with one line.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
import torch
from transformers import TextIteratorStreamer
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

import dynatree.integrations.hf
from dynatree import STRATEGIES, DynaTreeError
from tiny import SMALL_TREES, perturbed, tiny_model
from tiny_tok import VOCAB, tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
OPTIONS = SMALL_TREES


@functools.lru_cache(maxsize=None)
def pair(arch: str = "llama") -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model(arch, 0, vocab=VOCAB)
    return target, perturbed(target)


def prompt(length: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, VOCAB - 2, (1, length), generator=torch.Generator().manual_seed(seed))


def hf_reference(target: torch.nn.Module, ids: torch.Tensor, n: int, **kw) -> torch.Tensor:
    return target.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=0, **kw)


CASES = [("llama", s) for s in sorted(STRATEGIES)] + [("gpt2", "dynatree")]


@pytest.mark.parametrize("arch, strategy", CASES)
def test_callable_equals_hf_greedy(arch: str, strategy: str) -> None:
    target, draft = pair(arch)
    ids = prompt()
    ref = hf_reference(target, ids, 40, eos_token_id=None)
    out = target.generate(ids, draft=draft, custom_generate=dynatree.integrations.hf.generate, strategy=strategy,
                          strategy_options=OPTIONS.get(strategy), max_new_tokens=40, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.long
    assert torch.equal(out, ref), strategy
    assert out.stats.strategy == strategy and out.stats.new_tokens == 40
    if strategy != "autoregressive":
        assert out.stats.mean_committed > 1.0  # the draft really was used


@pytest.mark.parametrize("strategy", ["linear", "dynatree"])
def test_folder_equals_hf_greedy_and_returns_hf_output(strategy: str) -> None:
    """``custom_generate="<repo>"``: HF loads custom_generate/generate.py and passes raw arguments."""
    target, draft = pair()
    ids = prompt(5, 2)
    ref = hf_reference(target, ids, 30, eos_token_id=None)
    out = target.generate(ids, assistant_model=draft, custom_generate=str(REPO), trust_remote_code=True,
                          strategy=strategy, strategy_options=OPTIONS[strategy], max_new_tokens=30,
                          eos_token_id=None, pad_token_id=0, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, ref)
    assert out.stats.strategy == strategy and out.stats.num_rounds < 30


def test_eos_from_generation_config_as_hf() -> None:
    """No eos_token_id argument: the model's generation_config decides, as in plain HF generate."""
    target, draft = pair()
    ids = prompt(4, 3)
    free = hf_reference(target, ids, 30, eos_token_id=None)[0, 4:].tolist()
    eos = next(t for i, t in enumerate(free) if i >= 8 and t not in free[:i])
    old = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        ref = hf_reference(target, ids, 30)
        out = target.generate(ids, draft=draft, custom_generate=dynatree.integrations.hf.generate, max_new_tokens=30,
                              pad_token_id=0, strategy_options=OPTIONS["dynatree"])
    finally:
        target.generation_config.eos_token_id = old
    assert ref.shape[1] < 4 + 30 and torch.equal(out, ref)


def test_generation_arguments_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """kwargs override the model's generation_config, which overrides HF's defaults (top_k=50)."""
    target, draft = pair()
    seen: dict = {}

    def record(model, draft, ids, strategy, **kw):
        seen.update(kw, strategy=strategy)
        raise DynaTreeError("recorded")

    monkeypatch.setattr(dynatree.integrations.hf, "_engine_generate", record)
    monkeypatch.setattr(target.generation_config, "top_k", 7)
    with pytest.raises(DynaTreeError, match="recorded"):
        target.generate(prompt(3), draft=draft, custom_generate=dynatree.integrations.hf.generate, strategy="linear",
                        strategy_options={"k": 2}, do_sample=True, temperature=0.7, top_p=0.9, max_new_tokens=11,
                        eos_token_id=[5, 6], engine_options={"seed": 3})
    assert seen["strategy"] == "linear" and seen["k"] == 2 and seen["seed"] == 3
    sampling = seen["sampling"]
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.7, 7, 0.9)
    assert seen["max_new_tokens"] == 11 and seen["stopping"].eos_token_id == (5, 6)


class Recorder(BaseStreamer):
    """Records every put and whether end() had been called before it."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended_before_put: list[bool] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.flatten().tolist())
        self.ended_before_put.append(self.ends > 0)

    def end(self) -> None:
        self.ends += 1


@pytest.mark.parametrize("route", ["direct", "folder"])
def test_streamer_gets_each_round_before_the_end(route: str) -> None:
    """Both routes that receive generate's raw arguments stream (the callable route is handed no
    streamer by transformers)."""
    target, draft = pair()
    ids = prompt(5, 4)
    rec = Recorder()
    args = dict(assistant_model=draft, streamer=rec, max_new_tokens=30, eos_token_id=None, pad_token_id=0,
                strategy_options=OPTIONS["dynatree"])
    if route == "direct":
        out = dynatree.integrations.hf.generate(target, ids, **args)
    else:
        out = target.generate(ids, custom_generate=str(REPO), trust_remote_code=True, **args)
    assert rec.puts[0] == ids[0].tolist()  # the prompt first, as HF's own loops do
    rounds = rec.puts[1:]
    assert len(rounds) == out.stats.num_rounds >= 3
    assert [len(r) for r in rounds] == [r.committed for r in out.stats.rounds]
    assert sum(rounds, []) == out[0, 5:].tolist()
    assert rec.ends == 1 and not any(rec.ended_before_put)


def test_text_iterator_streamer_in_a_thread() -> None:
    """The usual HF pattern: generate in a thread, read text chunks from the streamer."""
    target, draft = pair()
    tok = tiny_tokenizer()
    ids = prompt(5, 5)
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    box: dict = {}

    def work() -> None:
        box["out"] = dynatree.integrations.hf.generate(target, ids, assistant_model=draft, streamer=streamer,
                                                       max_new_tokens=40, eos_token_id=None, pad_token_id=0)

    thread = threading.Thread(target=work)
    thread.start()
    chunks = list(streamer)
    thread.join()
    assert len([c for c in chunks if c]) > 1
    assert "".join(chunks) == tok.decode(box["out"][0, 5:])


def test_stop_strings_match_hf_through_the_folder() -> None:
    target, draft = pair()
    tok = tiny_tokenizer()
    ids = prompt(5, 3)
    free = hf_reference(target, ids, 40, eos_token_id=None)
    text = tok.decode(free[0, 5:])
    stop = text[len(text) // 2: len(text) // 2 + 3]
    ref = hf_reference(target, ids, 40, eos_token_id=None, stop_strings=[stop], tokenizer=tok)
    out = target.generate(ids, assistant_model=draft, custom_generate=str(REPO), trust_remote_code=True,
                          max_new_tokens=40, eos_token_id=None, pad_token_id=0, stop_strings=[stop], tokenizer=tok)
    assert ref.shape[1] < free.shape[1] and torch.equal(out, ref)


def test_stop_strings_with_the_callable_need_a_tokenizer_source() -> None:
    """HF drops tokenizer= on the callable route: one line names the routes that keep it, and the
    direct call with tokenizer= stops where HF does."""
    target, draft = pair()
    tok = tiny_tokenizer()
    ids = prompt(5, 3)
    with pytest.raises(DynaTreeError, match=r"stop_strings need a tokenizer.*dynatree\.hf\.generate\(model, ids"):
        target.generate(ids, draft=draft, custom_generate=dynatree.integrations.hf.generate, max_new_tokens=10,
                        stop_strings=["x"], tokenizer=tok, pad_token_id=0)
    free = hf_reference(target, ids, 40, eos_token_id=None)
    text = tok.decode(free[0, 5:])
    stop = text[len(text) // 2: len(text) // 2 + 3]
    ref = hf_reference(target, ids, 40, eos_token_id=None, stop_strings=[stop], tokenizer=tok)
    out = dynatree.integrations.hf.generate(target, ids, assistant_model=draft, max_new_tokens=40, eos_token_id=None,
                                            pad_token_id=0, stop_strings=[stop], tokenizer=tok)
    assert ref.shape[1] < free.shape[1] and torch.equal(out, ref)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_beams": 2}, "beam search"),
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"min_new_tokens": 5}, "min_new_tokens"),
        ({"max_time": 5.0}, "max_time"),
        ({"output_scores": True, "return_dict_in_generate": True}, "output_scores"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
    ],
)
def test_unsupported_arguments_are_refused(kwargs: dict, message: str) -> None:
    target, draft = pair()
    # (with draft= HF does not know of a draft model, so the refusals are ours: one line, a ValueError)
    with pytest.raises(ValueError, match=message) as err:
        target.generate(prompt(4), draft=draft, custom_generate=dynatree.integrations.hf.generate, max_new_tokens=5,
                        pad_token_id=0, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("route", ["callable", "folder"])
def test_a_left_padded_batch_equals_hf_batched_greedy(route: str) -> None:
    """HF users pass a batch as they would to ``generate``: left-padded ids and their mask; each row
    comes back as HF's own batched greedy decoding (pad token after a row's EOS included)."""
    target, draft = pair()
    ids = torch.cat([prompt(6, 1), prompt(6, 2), prompt(6, 3)])
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # row 0: a 2-token prompt, row 1: 4 tokens, row 2: 6
    mask[1, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, eos_token_id=None,
                          pad_token_id=0)
    if route == "callable":
        out = target.generate(ids, attention_mask=mask, draft=draft, custom_generate=dynatree.hf.generate,
                              max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    else:
        out = dynatree.hf.generate(target, ids, attention_mask=mask, assistant_model=draft, max_new_tokens=12,
                                   eos_token_id=None, pad_token_id=0)
    assert torch.equal(out, ref)
    assert [s.new_tokens for s in out.stats] == [12, 12, 12]


def test_a_right_padded_batch_and_a_batch_streamer_are_refused() -> None:
    target, draft = pair()
    hf = dynatree.integrations.hf.generate
    ids = torch.cat([prompt(4, 1), prompt(4, 2)])
    with pytest.raises(DynaTreeError, match="row 0 of attention_mask is not left-padded"):
        target.generate(ids, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), draft=draft,
                        custom_generate=hf, max_new_tokens=5, pad_token_id=0)

    class Streamer:
        def put(self, value): ...
        def end(self): ...

    with pytest.raises(DynaTreeError, match="a streamer follows one prompt"):
        hf(target, ids, streamer=Streamer(), max_new_tokens=5, pad_token_id=0)  # (the callable route gets no streamer)
    # autoregressive needs no draft and still equals HF
    out = target.generate(prompt(4), custom_generate=hf, strategy="autoregressive", max_new_tokens=8,
                          eos_token_id=None, pad_token_id=0)
    assert torch.equal(out, hf_reference(target, prompt(4), 8, eos_token_id=None))


@pytest.mark.parametrize("route", ["callable", "folder"])
def test_no_assistant_model_drafts_from_the_text_and_equals_hf_greedy(route: str) -> None:
    """One keyword, no second model: HF users get speculation from the text itself."""
    from test_suffix_source import repetitive_prompt

    target = tiny_model("llama", seed=1)  # its greedy output from a repeating prompt loops
    ids = repetitive_prompt(target.config.vocab_size, seed=2)[None]
    ref = hf_reference(target, ids, 60, eos_token_id=None)
    extra = {"custom_generate": dynatree.integrations.hf.generate} if route == "callable" else \
        {"custom_generate": str(REPO), "trust_remote_code": True}
    out = target.generate(ids, max_new_tokens=60, eos_token_id=None, pad_token_id=0, **extra)
    assert torch.equal(out, ref)
    # the text drafted (the tiny model rarely continues what it repeats, so the cut of the text's
    # proposal to what pays for its rows soon drafts nothing: count drafted nodes, not rounds saved)
    assert out.stats.strategy == "dynatree" and sum(r.drafted for r in out.stats.rounds) > 0


def test_the_draft_is_given_once() -> None:
    """draft= (the callable route's keyword) and assistant_model= (generate's) name the same model:
    both at once is refused in one line, on a direct call as on the callable route."""
    target, draft = pair()
    with pytest.raises(DynaTreeError, match="given twice") as err:
        dynatree.integrations.hf.generate(target, prompt(4), draft=draft, assistant_model=draft, max_new_tokens=5)
    assert "\n" not in str(err.value)
    # a direct call takes draft= too, and equals HF greedy
    ids = prompt(5, 6)
    out = dynatree.integrations.hf.generate(target, ids, draft=draft, max_new_tokens=20, eos_token_id=None,
                                            pad_token_id=0, strategy_options=OPTIONS["dynatree"])
    assert torch.equal(out, hf_reference(target, ids, 20, eos_token_id=None))
    assert sum(r.draft_calls for r in out.stats.rounds) > 0  # the model drafted (with the text, in one tree)
