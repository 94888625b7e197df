"""The Triton tree-attention kernel equals SDPA with the additive tree mask (Triton interpreter on CPU)."""

from __future__ import annotations


import pytest
import torch

pytest.importorskip("triton")

import dynatree  # noqa: E402
from dynatree.runtime.kernels.hf_attention import register  # noqa: E402
from dynatree.runtime.kernels.tree_attention import block_map, count_blocks, tree_attention, tree_block_counts  # noqa: E402
from dynatree.core.tree import TreeBuilder  # noqa: E402
from tiny import hf_greedy, perturbed  # noqa: E402


def reference(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    add = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=add
    )


@pytest.mark.parametrize("n_q, prefix, heads, kv_heads, dim", [(1, 0, 2, 2, 16), (5, 3, 4, 2, 16), (40, 70, 4, 1, 32), (33, 31, 2, 2, 64), (9, 20, 2, 2, 80), (3, 5, 2, 1, 8)])
def test_kernel_matches_sdpa(n_q: int, prefix: int, heads: int, kv_heads: int, dim: int) -> None:
    g = torch.Generator().manual_seed(n_q + prefix)
    n_k = prefix + n_q
    q = torch.randn(1, heads, n_q, dim, generator=g)
    k = torch.randn(1, kv_heads, n_k, dim, generator=g)
    v = torch.randn(1, kv_heads, n_k, dim, generator=g)
    mask = torch.rand(n_q, n_k, generator=g) < 0.3
    mask[:, :prefix] = True
    mask[torch.arange(n_q), prefix + torch.arange(n_q)] = True  # every query sees itself
    torch.testing.assert_close(tree_attention(q, k, v, mask), reference(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_kernel_skips_only_empty_blocks() -> None:
    mask = torch.zeros(70, 100, dtype=torch.bool)
    mask[0, 0] = mask[69, 99] = mask[40, 50] = True
    tiles = block_map(mask, 32)
    assert tiles.shape == (3, 4) and int(tiles.sum()) == 3 == count_blocks(mask, 32)
    assert bool(tiles[0, 0]) and bool(tiles[2, 3]) and bool(tiles[1, 1])


def test_dfs_order_needs_fewer_blocks_for_bushy_trees() -> None:
    # 16 chains of 16 under the root, built level by level (BFS): every node sees one node of each
    # earlier level, scattered over all earlier blocks; in DFS order each chain is contiguous.
    b = TreeBuilder(0)
    tips = [0] * 16
    for _ in range(16):
        tips = [b.add(t, 1, -0.1) for t in tips]
    t = b.freeze()
    counts = tree_block_counts(t.parent, t.depth, prefix_len=64)
    assert counts["dfs"] < counts["bfs"] < counts["dense"]


def test_engine_with_kernel_is_exact() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, initializer_range=0.5, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    target = LlamaForCausalLM(cfg).eval()
    draft = perturbed(target)
    ids = torch.randint(2, 96, (1, 40), generator=torch.Generator().manual_seed(1))
    ref = hf_greedy(target, ids, 16)
    target.set_attn_implementation(register())
    try:
        out = dynatree.generate(target, draft, ids, "fixed", max_new_tokens=16,
                                stopping=dynatree.StoppingConfig(eos_token_id=()), depth=3, branch=3, tau=0.0,
                                max_nodes=40, text=False)
    finally:
        target.set_attn_implementation("sdpa")
    assert torch.equal(out.sequences, ref)
