"""The lean round's shortcuts keep their answers: batched LM head of small trees, tail-only
stop-string decoding."""

from __future__ import annotations

import torch

from dynatree.loop.generate import StopText
from dynatree.core.tree import TokenTree, TreeBuilder
from dynatree.core.verify import LazyLogits, greedy_accept, likely_chain


class CountingHead:
    def __init__(self, weight: torch.Tensor) -> None:
        self.weight, self.calls = weight, 0

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return hidden @ self.weight.T


def test_small_tree_head_is_one_call_with_the_same_rows() -> None:
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(4, 8, generator=g), torch.randn(20, 8, generator=g)
    head = CountingHead(weight)
    lazy = LazyLogits(hidden, head, 16)
    rows = [lazy[i] for i in (0, 2, 3, 0)]
    assert head.calls == 1
    for i, row in zip((0, 2, 3, 0), rows):
        assert row.shape == (16,) and torch.allclose(row, (hidden[i] @ weight.T)[:16], atol=1e-5)


def test_large_tree_head_stays_per_row() -> None:
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(9, 8, generator=g), torch.randn(20, 8, generator=g)
    head = CountingHead(weight)
    lazy = LazyLogits(hidden, head, 20)
    lazy[0], lazy[5], lazy[5]
    assert head.calls == 2  # only the rows read, each once


def chain_tree(n: int) -> "TreeBuilder":
    """A root with a chain of ``n`` likely nodes (logq -0.1) and a less likely sibling at each level."""
    tree, node = TreeBuilder(1), 0
    for i in range(n):
        tree.add(node, 50 + i, -2.0)  # the unlikely sibling comes first: the chain is picked by logq
        node = tree.add(node, 10 + i, -0.1)
    return tree


def test_the_likely_chain_follows_the_largest_logq():
    tree = chain_tree(4).freeze()
    assert likely_chain(tree) == [0, 2, 4, 6, 8]
    assert likely_chain(TreeBuilder(3).freeze()) == [0]


def agreeing_chain() -> tuple[TokenTree, torch.Tensor, torch.Tensor]:
    """(tree, hidden, weight): a 6-level chain tree whose target agrees with its likely chain for 4
    levels, then picks a token no child has."""
    tree = chain_tree(6).freeze()
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(tree.size, 8, generator=g)
    weight = torch.randn(80, 8, generator=g)
    chain = likely_chain(tree)
    wanted = [int(tree.tokens[c]) for c in chain[1:5]] + [77]
    for node, token in zip(chain, wanted):
        weight[token] = hidden[node] / hidden[node].norm() ** 2 * 100.0  # this row's logit dominates at that node
    return tree, hidden, weight


def test_a_large_tree_walk_along_the_likely_chain_costs_one_head_call():
    """Greedy acceptance of a long accepted chain (what the text source drafts): one call for the
    whole walk, not one per accepted node, and the same decision as full logits."""
    tree, hidden, weight = agreeing_chain()
    chain = likely_chain(tree)
    full = hidden @ weight.T
    expected = greedy_accept(tree, full)
    head = CountingHead(weight)
    got = greedy_accept(tree, LazyLogits(hidden, head, 80))
    assert got == expected and len(expected[0]) == 4
    assert head.calls == 1
    # control: without the prefetch the same walk costs one call per row read
    head = CountingHead(weight)
    lazy = LazyLogits(hidden, head, 80)
    for node in chain[:5]:
        lazy[node]
    assert head.calls == 5


class CountingArgmax:
    """A head's argmax over rows of hidden states that counts its calls and the rows it saw."""

    def __init__(self, weight: torch.Tensor, vocab: int) -> None:
        self.weight, self.vocab, self.rows = weight, vocab, []

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.rows.append(hidden.shape[0])
        return (hidden @ self.weight.T)[:, : self.vocab].argmax(-1)


def test_a_small_trees_argmaxes_are_one_call_and_no_logits() -> None:
    """A screened head: a tree of at most ``batch_rows`` rows gets every row's argmax in one call on
    the first read, and the head's logits are never computed."""
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(4, 8, generator=g), torch.randn(20, 8, generator=g)
    head, argmax = CountingHead(weight), CountingArgmax(weight, 16)
    lazy = LazyLogits(hidden, head, 16, argmax=argmax)
    got = [lazy.argmax(i) for i in (0, 2, 3, 0)]
    assert got == [int((hidden[i] @ weight.T)[:16].argmax()) for i in (0, 2, 3, 0)]
    assert argmax.rows == [4] and head.calls == 0


def test_a_large_tree_walk_reads_argmaxes_along_the_likely_chain_in_one_call() -> None:
    """The walk of test_a_large_tree_walk_along_the_likely_chain_costs_one_head_call through a
    screened head: the same decision, one argmax call for the chain, no logits."""
    tree, hidden, weight = agreeing_chain()
    chain = likely_chain(tree)
    expected = greedy_accept(tree, hidden @ weight.T)
    head, argmax = CountingHead(weight), CountingArgmax(weight, 80)
    got = greedy_accept(tree, LazyLogits(hidden, head, 80, argmax=argmax))
    assert got == expected and len(expected[0]) == 4
    assert argmax.rows == [len(chain)] and head.calls == 0


def test_a_row_whose_logits_are_computed_reads_its_argmax_from_them() -> None:
    g = torch.Generator().manual_seed(4)
    hidden, weight = torch.randn(9, 8, generator=g), torch.randn(20, 8, generator=g)
    head, argmax = CountingHead(weight), CountingArgmax(weight, 20)
    lazy = LazyLogits(hidden, head, 20, argmax=argmax)
    row = lazy[5]
    assert lazy.argmax(5) == int(row.argmax()) and argmax.rows == [] and head.calls == 1
    assert lazy.argmax(6) == int((hidden[6] @ weight.T).argmax()) and argmax.rows == [1]


class CharTokenizer:
    """One character per token id (id = ord)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_stop_text_finds_strings_across_the_tail_boundary() -> None:
    stop = StopText(CharTokenizer(), ["STOP", "x"])
    out = [ord(c) for c in "a" * 500 + "ST"]
    assert stop.cut(out, [ord(c) for c in "OPzz"]) == 2  # completed by the second new token
    assert stop.cut([ord(c) for c in "a" * 500], [ord(c) for c in "aax"]) == 3
    assert stop.cut([ord(c) for c in "a" * 500], [ord(c) for c in "abc"]) == 0
    assert stop.tail >= 4 * len("STOP")


def test_plain_decoding_takes_its_first_token_from_the_prefill(monkeypatch) -> None:
    """Without a draft, the prefill caches the whole prompt and its last row's logits give the
    first token: n tokens cost the prefill and n - 1 steps (not n, as when the last prompt token
    waited for the first round), and the tokens are HF greedy's."""
    import dynatree
    from dynatree.options import StoppingConfig
    from dynatree.runtime.cache import CachedModel
    from tiny import VOCAB, hf_greedy, tiny_model

    target = tiny_model("llama", 0)
    calls: list[int] = []
    call = CachedModel.call
    monkeypatch.setattr(CachedModel, "call", lambda kv, tokens, *a, **k: calls.append(len(tokens)) or call(kv, tokens, *a, **k))
    ids = torch.randint(2, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    for n in (1, 12):
        calls.clear()
        out = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=n,
                                stopping=StoppingConfig(eos_token_id=()))
        assert calls == [9] + [1] * (n - 1) and torch.equal(out.sequences, hf_greedy(target, ids, n))


def test_a_drafting_runs_prompt_is_cached_without_the_lm_head(monkeypatch) -> None:
    """A run with a draft caches all of the prompt but its last token (the first round verifies
    that one with the first tree), so no logits of the prefill are read: the target's prefill
    runs its base model alone, no product over the vocabulary; the tokens stay HF greedy's."""
    import dynatree
    from dynatree.options import StoppingConfig
    from dynatree.runtime.cache import CachedModel
    from tiny import VOCAB, hf_greedy, perturbed, tiny_model

    target = tiny_model("llama", 0)
    calls: list[tuple[int, bool]] = []
    call = CachedModel.call

    def spy(kv, tokens, *a, base: bool = False, **k):
        if kv.model is target:
            calls.append((len(tokens), base))
        return call(kv, tokens, *a, base=base, **k)

    monkeypatch.setattr(CachedModel, "call", spy)
    ids = torch.randint(2, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    out = dynatree.generate(target, perturbed(target), ids, "linear", max_new_tokens=12, k=3,
                            stopping=StoppingConfig(eos_token_id=()))
    assert calls[0] == (8, True) and torch.equal(out.sequences, hf_greedy(target, ids, 12))
