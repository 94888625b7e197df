"""Property tests: the tree module's derived tensors and KV compaction equal slow references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from dynatree.runtime.cache import compact
from dynatree.core.tree import (
    TokenTree,
    TreeBuilder,
    ancestor_matrix,
    attention_mask,
    dfs_order,
    path_to,
    position_ids,
    validate,
)
from dynatree.core.verify import greedy_accept


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 40, vocab: int = 6) -> TokenTree:
    n = draw(st.integers(1, max_nodes))
    b = TreeBuilder(draw(st.integers(0, vocab - 1)))
    for i in range(1, n):
        b.add(draw(st.integers(0, i - 1)), draw(st.integers(0, vocab - 1)), -draw(st.floats(0, 5)))
    return b.freeze()


def slow_ancestors(tree: TokenTree, i: int) -> set[int]:
    out, node = set(), i
    while node != -1:
        out.add(node)
        node = int(tree.parent[node])
    return out


@settings(max_examples=150, deadline=None)
@given(trees(), st.integers(0, 7))
def test_mask_positions_paths(tree: TokenTree, prefix: int) -> None:
    validate(tree)
    n = tree.size
    anc = ancestor_matrix(tree.parent, tree.depth)
    mask = attention_mask(anc, prefix, torch.float32)
    assert mask.shape == (1, 1, n, prefix + n)
    pos = position_ids(tree.depth, prefix)[0]
    for i in range(n):
        a = slow_ancestors(tree, i)
        assert (mask[0, 0, i, :prefix] == 0).all()
        for j in range(n):
            assert bool(anc[i, j]) == (j in a)
            assert (mask[0, 0, i, prefix + j] == 0) == (j in a)
        path = path_to(tree.parent, i)
        assert path[0] == 0 and path[-1] == i and set(path) == a
        assert int(pos[i]) == prefix + len(path) - 1 == prefix + int(tree.depth[i])
        assert abs(float(tree.cum_logq[i]) - float(tree.logq[path].sum())) < 1e-4


@settings(max_examples=150, deadline=None)
@given(trees())
def test_dfs_order_is_preorder(tree: TokenTree) -> None:
    order = dfs_order(tree.parent).tolist()
    assert sorted(order) == list(range(tree.size))
    rank = {node: r for r, node in enumerate(order)}
    for i in range(1, tree.size):
        assert rank[int(tree.parent[i])] < rank[i]
    # every subtree occupies a contiguous range of the order
    for i in range(tree.size):
        sub = [j for j in range(tree.size) if i in slow_ancestors(tree, j)]
        ranks = sorted(rank[j] for j in sub)
        assert ranks == list(range(ranks[0], ranks[0] + len(sub)))


@settings(max_examples=200, deadline=None)
@given(trees(vocab=3), st.data())
def test_greedy_accept_is_longest_agreeing_path(tree: TokenTree, data: st.DataObject) -> None:
    best = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=tree.size, max_size=tree.size)))
    logits = torch.nn.functional.one_hot(best, 3).float()  # the target's argmax at node i is best[i]
    path, bonus = greedy_accept(tree, logits)

    def longest(node: int) -> list[int]:  # slow reference: first matching child, recursively
        for c in range(node + 1, tree.size):
            if int(tree.parent[c]) == node and int(tree.tokens[c]) == int(best[node]):
                return [c] + longest(c)
        return []

    assert path == longest(0)
    assert bonus == int(best[path[-1] if path else 0])


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 6), st.integers(1, 12), st.data())
def test_compact_equals_gather(start: int, extra: int, data: st.DataObject) -> None:
    keep = sorted(data.draw(st.sets(st.integers(start, start + extra - 1))))
    cache = DynamicCache()
    k = torch.randn(1, 2, start + extra, 4)
    v = torch.randn(1, 2, start + extra, 4)
    cache.update(k.clone(), v.clone(), 0)
    compact(cache, start, keep)
    idx = list(range(start)) + keep
    assert torch.equal(cache.layers[0].keys, k[..., idx, :])
    assert torch.equal(cache.layers[0].values, v[..., idx, :])


def test_validate_rejects_bad_order() -> None:
    bad = TokenTree(
        tokens=torch.tensor([1, 2, 3]),
        parent=torch.tensor([-1, 2, 0]),
        depth=torch.tensor([0, 2, 1]),
        logq=torch.zeros(3),
        cum_logq=torch.zeros(3),
    )
    with pytest.raises(ValueError, match="precede"):
        validate(bad)
