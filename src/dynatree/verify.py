"""Acceptance: which drafted path the target agrees with, and the token it adds.

``target_logits[i]`` is the target's prediction after the root-to-node-i path, computed by the
single tree-masked verify pass.

Greedy (temperature 0): walk from the root, each step taking the child whose token equals the
target's argmax at the current node; the target's argmax at the last node reached is the bonus
token. Since the argmax is unique, at most one child can match, so the path is unique (if a policy
ever adds two equal siblings, the first one wins).

Sampling (temperature > 0), :func:`sample_accept`: multi-draft recursive rejection sampling
(SpecInfer/Sequoia; DySpec Alg. 3 with its typo fixed: c ~ U(0, 1), not N(0, 1)). At the current
node R starts as the target distribution p; each child x in creation order is a draft drawn from D:

* sampled children (DySpec): D = the draft distribution the siblings were sampled from, with the
  earlier siblings removed and renormalised (sampling without replacement);
* deterministic children (top-B of the fixed tree / DynaTree, linear's greedy chain): D = the point
  mass on x (q = 1), since the child was chosen by a rule, not drawn.

Accept x with probability min(1, R[x] / D[x]) and descend; otherwise R <- norm(max(R - D, 0)) (for a
point mass: R[x] <- 0, renormalised) and try the next sibling. When every child fails the round's
last token is drawn from R; at a fully accepted leaf it is drawn from p there (the bonus token;
Alg. 3 leaves this case undefined, Sequoia samples from the target). Each step outputs exactly R
whatever D is (the standard rejection-sampling identity applied recursively), so the committed
tokens follow the target distribution for any tree, deterministic or sampled.
"""

from __future__ import annotations

import torch

from .cache import CachedModel
from .sampling import SamplingConfig, draw, target_probs, uniform, without
from .tree import TokenTree, ancestor_matrix, children_lists, dfs_order, position_ids


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


def sample_accept(
    tree: TokenTree, target_logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator
) -> tuple[list[int], int]:
    """Lossless acceptance at ``cfg.temperature > 0``: (accepted drafted nodes in path order, last token)."""
    kids = children_lists(tree.parent)
    tokens = tree.tokens.tolist()
    path: list[int] = []
    node = 0
    while True:
        r = target_probs(target_logits[node], cfg)
        d = tree.child_q[node] if tree.child_q is not None else None
        if d is not None:
            d = d.to(r.device)  # the draft may live on another device than the target
        accepted = None
        for child in kids[node]:
            x = tokens[child]
            q = float(d[x]) if d is not None else 1.0
            if uniform(generator) * q < float(r[x]):
                accepted = child
                break
            r = residual(r, d, x)
            if d is not None:
                d = without(d, x)
                if d is None:  # the draft's support is used up: no later sibling can exist
                    break
        if accepted is None:
            return path, draw(r, generator)
        path.append(accepted)
        node = accepted


def residual(r: torch.Tensor, d: torch.Tensor | None, x: int) -> torch.Tensor:
    """Target residual after draft ``x`` ~ ``d`` (None: point mass on x) was rejected: norm(max(r - d, 0)).

    Guard for 0/0: max(r - d, 0) is all zero only if r <= d everywhere, i.e. r == d, where the
    rejection has probability 0 and can only come from float rounding; removing x from r is then
    the residual of the (equal) point-mass view, and if r is (up to rounding) the point mass on x,
    r itself is the only distribution consistent with the target.
    """
    if d is not None:
        rest = (r - d).clamp_(min=0)
        mass = float(rest.sum())
        if mass > 0:
            return rest / mass
    out = without(r, x)
    return out if out is not None else r


def tree_forward(kv: CachedModel, tree: TokenTree, order: str = "bfs") -> tuple[torch.Tensor, torch.Tensor]:
    """ONE target forward over every tree node; returns (float logits ``[n, V]``, cache rows ``[n]``).

    Each node sees the cached prefix, its ancestors and itself, at position ``prefix_len + depth``.
    ``order="dfs"`` feeds the nodes in depth-first order (DySpec App. C) so the tree mask is
    block-sparse-friendly for the Triton kernel; logits come back in tree order either way, and
    ``rows[i]`` is the cache row that node i's keys/values were written to.
    """
    prefix = kv.length
    visible = ancestor_matrix(tree.parent, tree.depth)
    positions = position_ids(tree.depth, prefix)[0]
    if order == "bfs":
        return kv.forward(tree.tokens, positions, visible, prefix), torch.arange(prefix, prefix + tree.size)
    perm = dfs_order(tree.parent)
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(tree.size)
    logits = kv.forward(tree.tokens[perm], positions[perm], visible[perm][:, perm], prefix)
    return logits[rank.to(logits.device)], rank + prefix
