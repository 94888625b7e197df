"""The lean round's shortcuts keep their answers: batched LM head of small trees, tail-only
stop-string decoding."""

from __future__ import annotations

import torch

from dynatree.loop.generate import StopText
from dynatree.core.verify import LazyLogits


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
