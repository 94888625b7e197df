"""Acceptance: which drafted path the target agrees with, and the token it adds (greedy).

``target_logits[i]`` is the target's prediction after the root-to-node-i path, computed by the
single tree-masked verify pass. Greedy acceptance walks from the root, each step taking the child
whose token equals the target's argmax at the current node; the target's argmax at the last node
reached is the bonus token. Since the argmax is unique, at most one child can match, so the path is
unique (if a policy ever adds two equal siblings, the first one wins).
"""

from __future__ import annotations

import torch

from .cache import cache_length
from .tree import TokenTree, ancestor_matrix, attention_mask, position_ids


def greedy_accept(tree: TokenTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Return (accepted drafted nodes in path order, bonus token)."""
    best = target_logits.argmax(-1).cpu()
    return walk_matches(tree, best)


def walk_matches(tree: TokenTree, best: torch.Tensor) -> tuple[list[int], int]:
    """Longest root path with ``tokens[child] == best[parent]``; bonus ``best[last]``."""
    if tree.size == 1:
        return [], int(best[0])
    parent = tree.parent[1:]
    matched = ((tree.tokens[1:] == best[parent]).nonzero().flatten() + 1).tolist()
    par = tree.parent.tolist()
    path: list[int] = []
    last = 0
    # Nodes come in creation order (parents before children): the first matched child of the
    # current end of the path is the next path node.
    for i in matched:
        if par[i] == last:
            path.append(i)
            last = i
    return path, int(best[last])


def tree_forward(model: torch.nn.Module, cache, tree: TokenTree) -> torch.Tensor:
    """ONE target forward over every tree node; returns float logits ``[n, V]``.

    4D additive mask (prefix + ancestors + self), positions ``prefix_len + depth``; the tree's
    rows are appended to ``cache`` in tree order (the commit step then keeps the accepted ones).
    """
    param = next(model.parameters())
    prefix = cache_length(cache)
    anc = ancestor_matrix(tree.parent, tree.depth)
    out = model(
        input_ids=tree.tokens.view(1, -1).to(param.device),
        attention_mask=attention_mask(anc, prefix, param.dtype, param.device),
        position_ids=position_ids(tree.depth, prefix).to(param.device),
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[0].float()
