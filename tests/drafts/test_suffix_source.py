"""Speculation from the text itself: no draft model (``draft=None``) and a model draft merged with
the text in one tree. Greedy output must equal the target's own, whatever the tree."""

from __future__ import annotations

import pytest
import torch
from tiny import hf_greedy, perturbed, tiny_model

from dynatree import EngineOptions, SamplingConfig, StoppingConfig, generate
from dynatree.core.tree import TreeBuilder
from dynatree.drafts.hybrid import HybridProposer, merge
from dynatree.drafts.suffix import TextDraft, TextProposer
from dynatree.drafts.suffix_index import Proposal
from dynatree.drafts.registry import proposer_for
from dynatree.errors import DynaTreeError

ARCHS = ["llama", "neox", "qwen2", "gpt2"]
NO_EOS = StoppingConfig(eos_token_id=())


def repetitive_prompt(vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    block = torch.randint(2, vocab, (12,), generator=g)  # no pad (0) or eos (1) id
    return torch.cat([block, block, block[:5]])


def reference(target: torch.nn.Module, ids: torch.Tensor, n: int) -> list[int]:
    return hf_greedy(target, ids[None], n, None)[0].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_no_draft_model_speculates_from_the_text_and_stays_exact(arch: str) -> None:
    target = tiny_model(arch, seed=1)
    ids = repetitive_prompt(target.config.vocab_size)
    out = generate(target, None, ids, max_new_tokens=40, stopping=NO_EOS)
    assert out.sequences[0].tolist() == reference(target, ids, 40)
    assert out.stats.strategy == "dynatree"
    assert sum(r.drafted for r in out.stats.rounds) > 0  # the text proposed something


@pytest.mark.parametrize("strategy", ["linear", "fixed", "dynatree", "dyspec", "dyspec-threshold"])
@pytest.mark.parametrize("confident", [0.0, 2.0, 1e9])  # text alone / either / model always called
def test_hybrid_tree_is_exact_for_every_strategy(strategy: str, confident: float) -> None:
    target, draft = tiny_model("llama", seed=1), tiny_model("llama", seed=2)
    ids = repetitive_prompt(target.config.vocab_size, seed=3)
    out = generate(target, TextDraft(model=draft, confident=confident), ids, strategy=strategy, max_new_tokens=33,
                   stopping=NO_EOS)
    assert out.sequences[0].tolist() == reference(target, ids, 33)
    calls = sum(r.draft_calls for r in out.stats.rounds)
    assert (calls == 0) == (confident == 0.0)  # confident=0: the model never runs


def test_eos_inside_a_suffix_branch_stops_there() -> None:
    target = tiny_model("llama", seed=1)
    ids = repetitive_prompt(target.config.vocab_size)
    ref = reference(target, ids, 30)[len(ids):]
    eos = ref[7]
    out = generate(target, None, ids, max_new_tokens=30, stopping=StoppingConfig(eos_token_id=eos))
    new = out.sequences[0, len(ids):].tolist()
    assert new == ref[: ref.index(eos) + 1]


def test_sampling_with_the_text_draft_is_reproducible_and_in_range() -> None:
    target = tiny_model("llama", seed=1)
    ids = repetitive_prompt(target.config.vocab_size)
    sampled = SamplingConfig(temperature=0.8)
    a = generate(target, None, ids, max_new_tokens=20, sampling=sampled, seed=5, stopping=NO_EOS)
    b = generate(target, None, ids, max_new_tokens=20, sampling=sampled, seed=5, stopping=NO_EOS)
    assert torch.equal(a.sequences, b.sequences)


def test_the_registry_picks_the_text_sources() -> None:
    draft = tiny_model("llama", seed=2)
    assert proposer_for(None) is TextProposer and proposer_for(TextDraft()) is TextProposer
    assert proposer_for(TextDraft(model=draft)) is HybridProposer
    with pytest.raises(DynaTreeError, match="no draft source takes"):
        proposer_for("not a model")
    with pytest.raises(DynaTreeError, match="budget"):
        TextDraft(budget=0)


def test_merge_shares_agreeing_nodes_and_skips_sampled_parents() -> None:
    b = TreeBuilder(7)
    a = b.add(0, 5, -0.1)
    b.add(a, 6, -0.2)
    p = Proposal(parents=[-1, 0, 1, -1], tokens=[5, 6, 9, 8], logprobs=[0.0, 0.0, 0.0, -1.0], match_len=2)
    assert merge(b, p) == 2  # 5 and 5->6 exist; 5->6->9 and 8 are new
    assert b.tokens == [7, 5, 6, 9, 8] and b.parent == [-1, 0, 1, 2, 0]
    c = TreeBuilder(7)
    c.child_q[0] = torch.full((10,), 0.1)  # the root's children were sampled
    assert merge(c, p) == 0 and len(c) == 1


def test_a_broken_index_commit_drafts_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the acceptance the text source earns comes from indexing what was committed. (The
    whole proposals: cut to what pays for their rows, the text of a tiny random model drafts next to
    nothing, tests/drafts/test_text_trim.py.)"""
    target = tiny_model("llama", seed=1)
    ids = repetitive_prompt(target.config.vocab_size, seed=2)
    whole = TextDraft(trim=False)
    good = generate(target, whole, ids, max_new_tokens=120, stopping=NO_EOS)  # (the tiny model's output loops)
    monkeypatch.setattr(TextProposer, "observe", lambda self, outcome: None)
    bad = generate(target, whole, ids, max_new_tokens=120, stopping=NO_EOS)
    assert torch.equal(good.sequences, bad.sequences)  # exact either way...
    accepted = lambda r: sum(x.accepted for x in r.stats.rounds)  # noqa: E731
    assert accepted(good) > accepted(bad)  # ...but only the full index drafts well


def test_a_hybrid_tree_fits_the_static_engine_s_largest_bucket() -> None:
    """The policy's tree plus the text's proposal could outgrow the static engine's largest
    bucket mid-run; the merge stops at it (this run raised "exceeds the largest static bucket")."""
    target = tiny_model("llama", seed=1)
    draft = perturbed(target, noise=0.05)
    ids = repetitive_prompt(target.config.vocab_size, seed=2)
    out = generate(target, TextDraft(model=draft, confident=1e9), ids, "fixed", max_new_tokens=24, stopping=NO_EOS,
                   options=EngineOptions(engine="static", buckets=(1, 4, 16)), max_nodes=15, depth=4, branch=2,
                   tau=0.0)
    assert out.sequences[0].tolist() == reference(target, ids, 24)
    assert max(r.drafted for r in out.stats.rounds) <= 15


@pytest.mark.parametrize("source", ["text", "hybrid"])
def test_text_sources_under_kv_eviction_equal_autoregressive_under_the_same_eviction(source: str) -> None:
    """`--kv-window` with the CLI's default (--text): exact against AR with the same eviction. (The
    whole proposals, so that text trees are verified under eviction: cut, the tiny model's text
    drafts next to nothing; the cut keeps a prefix of the same trees.)"""
    target = tiny_model("llama", seed=1)
    draft = TextDraft(trim=False) if source == "text" else TextDraft(model=perturbed(target, noise=0.05), trim=False)
    ids = repetitive_prompt(target.config.vocab_size, seed=2)
    run = dict(max_new_tokens=60, stopping=NO_EOS, options=EngineOptions(kv_window=48, engine="hf"))
    out = generate(target, draft, ids, **run)
    ref = generate(target, None, ids, "autoregressive", **run)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.stats.rounds) < 60  # the text drafted


def test_the_cache_takes_in_the_request_as_returned_not_what_a_last_round_committed_past_it() -> None:
    """A last round may commit tokens past the stop token or the length limit, which the output does
    not keep: the cross-request cache must hold the request as returned (prompt + output), or a
    later request would be drafted from tokens no one saw."""
    from dynatree.drafts.suffix_index import SuffixCache, TextIndex

    cache = SuffixCache(10_000)
    source = TextIndex(cache)
    source.start([5, 6, 7])
    source.commit([8, 9, 10, 11])  # the round committed 4 tokens, the output kept 2
    source.finish(length=5)
    assert cache.num_sequences == 1 and cache.num_tokens == 5
    assert cache.index.sequence(next(iter(cache._lengths))) == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("with_model", [False, True], ids=["text", "hybrid"])
def test_the_loop_tells_the_source_how_long_the_request_is(with_model: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``finish`` gets the returned sequence's length (prompt + output), whichever source drafts."""
    from dynatree.drafts.suffix_index import TextIndex

    lengths: list[int | None] = []
    real = TextIndex.finish
    monkeypatch.setattr(TextIndex, "finish", lambda self, keep_prompt=True, length=None: (
        lengths.append(length), real(self, keep_prompt, length)))
    target = tiny_model("llama", seed=1)
    ids = repetitive_prompt(target.config.vocab_size)
    out = generate(target, TextDraft(model=perturbed(target) if with_model else None), ids, max_new_tokens=9,
                   stopping=NO_EOS)
    assert lengths == [out.sequences.shape[1]] == [len(ids) + 9]
