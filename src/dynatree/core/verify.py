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

from collections.abc import Callable, Sequence

import torch

from dynatree.core.kv import KVModel
from dynatree.core.sampling import SamplingConfig, draw, target_probs, uniform, without
from dynatree.core.tree import TokenTree, ancestor_matrix, children_lists, dfs_order, position_ids
from dynatree.tuning import LAZY_HEAD_BATCH_ROWS


class LazyLogits:
    """Target logits per tree node, computed from the final hidden states only when read.

    Acceptance reads the logits of the nodes on its walk (about L of them), not of every node.
    On a CPU the LM head over a large vocabulary is a big share of a forward (SmolLM2: 49152 x 576,
    about a fifth of a one-token step per node), so computing it for only those rows saves most of
    a wide tree's head cost. On a GPU reading the head's weights once for all rows is cheaper, so
    the engine uses full logits there.
    """

    # A tree of at most this many rows gets the head of all its rows in ONE call on the first read:
    # the greedy walk reads L rows (L = committed tokens, about 1.4 for the CPU's small trees), so
    # one batched call replaces L memory-bound passes over the head's weights (dynatree.tuning).
    BATCH_ROWS = LAZY_HEAD_BATCH_ROWS

    def __init__(self, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], vocab_size: int,
                 eager: bool = False, features: torch.Tensor | None = None, batch_rows: int | None = None,
                 argmax: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.hidden, self.head, self.vocab_size = hidden, head, vocab_size
        #: the argmax of the head on rows of hidden states without their logits (the KV cache's
        #: screened head), or None: :meth:`argmax` reads the row's logits
        self.head_argmax = argmax
        self._argmax: dict[int, int] = {}
        #: trees up to this many rows get every row's head in one call on the first read (0: never)
        self.batch_rows = self.BATCH_ROWS if batch_rows is None else batch_rows
        # what a feature draft reads of each node: the final hidden states, or fused layer outputs
        self.features = hidden if features is None else features
        self._rows: dict[int, torch.Tensor] = {}
        # eager: every row's head in one call now (a GPU reads the head's weights once for all rows)
        self._all: torch.Tensor | None = head(hidden)[:, :vocab_size].float() if eager else None

    def __len__(self) -> int:
        return int(self.hidden.shape[0])

    def prefetch(self, nodes: Sequence[int]) -> None:
        """The head of ``nodes`` in ONE call, kept for later reads: the rows a walk is likely to
        read (the draft's most likely chain) cost one pass over the head's weights instead of one
        pass each. Rows already computed are skipped. With a screened head, their argmaxes."""
        if self._all is not None or len(self) <= self.batch_rows:
            return
        if self.head_argmax is not None:
            todo = [n for n in dict.fromkeys(nodes) if n not in self._argmax and n not in self._rows]
            if len(todo) >= 2:
                self._argmax.update(zip(todo, self.head_argmax(self.hidden[todo]).tolist()))
            return
        todo = [n for n in dict.fromkeys(nodes) if n not in self._rows]
        if len(todo) < 2:
            return
        rows = self.head(self.hidden[todo])[:, : self.vocab_size].float()
        for n, row in zip(todo, rows):
            self._rows[n] = row

    def argmax(self, node: int) -> int:
        """The argmax of node ``node``'s logits (the first on ties), what greedy acceptance reads:
        through the screened head where there is one and the row's logits are not computed yet
        (a tree of at most ``batch_rows`` rows: every row's argmax in one call), else from the
        row's logits."""
        if self.head_argmax is None or self._all is not None or node in self._rows:
            return int(self[node].argmax())
        if node not in self._argmax:
            if len(self) <= self.batch_rows:
                self._argmax.update(enumerate(self.head_argmax(self.hidden).tolist()))
            else:
                self._argmax[node] = int(self.head_argmax(self.hidden[node : node + 1])[0])
        return self._argmax[node]

    def __getitem__(self, node: int) -> torch.Tensor:
        if node in self._rows:  # (computed ahead: prefetch, or a batch's one head call)
            return self._rows[node]
        if self._all is None and len(self) <= self.batch_rows:
            self._all = self.head(self.hidden)[:, : self.vocab_size].float()
        if self._all is not None:
            return self._all[node]
        row = self._rows.get(node)
        if row is None:
            row = self._rows[node] = self.head(self.hidden[node])[: self.vocab_size].float()
        return row


def batch_lazy_logits(hidden: torch.Tensor, trees: Sequence[TokenTree], head: Callable[[torch.Tensor], torch.Tensor],
                      vocab_size: int, argmax: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[LazyLogits]:
    """A batch's verify output ``hidden`` ``[B, N, H]`` as one :class:`LazyLogits` per row, with the
    rows acceptance most likely reads (each tree's :func:`likely_chain`) computed in ONE head
    call for the whole batch: the head's weights are read once, not once per row (SmolLM2's head
    is 113 MB in fp32, a large part of a batched step on a CPU). A walk that leaves the likely
    chain computes its other rows when it reads them. With ``argmax`` (a screened head), the
    chains' argmaxes in that one call instead, and an off-chain row's argmax when read."""
    chains = [likely_chain(t) for t in trees]
    flat = torch.cat([torch.as_tensor(c) + j * hidden.shape[1] for j, c in enumerate(chains)])
    picked = hidden.reshape(-1, hidden.shape[-1])[flat.to(hidden.device)]
    if argmax is not None:
        best, k, out = argmax(picked).tolist(), 0, []
        for j, (t, c) in enumerate(zip(trees, chains)):
            lazy = LazyLogits(hidden[j, : t.size], head, vocab_size, batch_rows=0, argmax=argmax)
            for node in c:
                lazy._argmax[node] = best[k]
                k += 1
            out.append(lazy)
        return out
    rows = head(picked)[:, :vocab_size].float()
    out, k = [], 0
    for j, (t, c) in enumerate(zip(trees, chains)):
        lazy = LazyLogits(hidden[j, : t.size], head, vocab_size, batch_rows=0)  # (off the chain: row by row)
        for node in c:
            lazy._rows[node] = rows[k]
            k += 1
        out.append(lazy)
    return out


def greedy_accept(tree: TokenTree, target_logits: torch.Tensor | LazyLogits) -> tuple[list[int], int]:
    """Return (accepted drafted nodes in path order, bonus token).

    Walks from the root: at each node the target's argmax either names a child (descend) or is the
    bonus token (stop). Only the nodes on the walk are read, which is what lets
    :class:`LazyLogits` skip the others.
    """
    kids = children_lists(tree.parent)
    tokens = tree.tokens.tolist()
    if isinstance(target_logits, LazyLogits):
        target_logits.prefetch(likely_chain(tree, kids))
    path: list[int] = []
    node = 0
    while True:
        best = target_logits.argmax(node) if isinstance(target_logits, LazyLogits) else int(target_logits[node].argmax())
        node = next((c for c in kids[node] if tokens[c] == best), -1)
        if node < 0:
            return path, best
        path.append(node)


def likely_chain(tree: TokenTree, kids: list[list[int]] | None = None) -> list[int]:
    """The root and, level by level, its most likely child under the draft (largest ``logq``,
    the first on ties): the walk acceptance most likely takes, whose rows
    :meth:`LazyLogits.prefetch` computes together."""
    kids = children_lists(tree.parent) if kids is None else kids
    logq = tree.logq.tolist()
    chain, node = [0], 0
    while kids[node]:
        node = max(kids[node], key=lambda c: logq[c])  # (max keeps the first of equal values)
        chain.append(node)
    return chain


def sample_accept(
    tree: TokenTree, target_logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator
) -> tuple[list[int], int]:
    """Lossless acceptance at ``cfg.temperature > 0``: (accepted drafted nodes in path order, last token)."""
    kids = children_lists(tree.parent)
    tokens = tree.tokens.tolist()
    if isinstance(target_logits, LazyLogits):
        target_logits.prefetch(likely_chain(tree, kids))
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


def tree_forward(
    kv: KVModel, tree: TokenTree, order: str = "bfs", lazy_head: bool = False, keep_hidden: bool = False,
    feature_layers: Sequence[int] = (), screen: bool = False,
) -> tuple[torch.Tensor | LazyLogits, torch.Tensor]:
    """ONE target forward over every tree node; returns (logits ``[n, V]``, cache rows ``[n]``).

    Each node sees the cached prefix, its ancestors and itself, at position ``prefix_len + depth``.
    ``order="dfs"`` feeds the nodes in depth-first order (DySpec App. C) so the tree mask is
    block-sparse-friendly for the Triton kernel; logits come back in tree order either way, and
    ``rows[i]`` is the cache row that node i's keys/values were written to. ``lazy_head`` returns
    :class:`LazyLogits` (LM head applied per node on demand) instead of a full tensor;
    ``keep_hidden`` returns :class:`LazyLogits` too, with every row's logits computed at once
    unless ``lazy_head``, so that ``.features`` holds the nodes' features for a feature draft
    (their final hidden states, or the outputs of ``feature_layers`` concatenated). ``screen``
    (with ``lazy_head``): a greedy walk reads each row's argmax through the cache's screened head
    (:meth:`KVModel.head_argmax`) instead of the row's logits.
    """
    prefix = kv.length
    argmax = kv.head_argmax if screen and lazy_head else None
    visible = ancestor_matrix(tree.parent, tree.depth)
    positions = position_ids(tree.depth, prefix)[0]
    if order == "bfs":
        perm, rank = None, torch.arange(tree.size)
    else:
        perm = dfs_order(tree.parent)
        rank = torch.empty_like(perm)
        rank[perm] = torch.arange(tree.size)
    args = (tree.tokens, positions, visible) if perm is None else (tree.tokens[perm], positions[perm], visible[perm][:, perm])
    if keep_hidden:
        hidden, feats = kv.forward_features(*args, prefix, layers=feature_layers)
        r = rank.to(hidden.device)
        return LazyLogits(hidden[r], kv.apply_head, kv.vocab_size, eager=not lazy_head, features=feats[r],
                          argmax=argmax), rank + prefix
    if lazy_head:
        hidden = kv.forward_hidden(*args, prefix)
        return LazyLogits(hidden[rank.to(hidden.device)], kv.apply_head, kv.vocab_size, eager=False,
                          argmax=argmax), rank + prefix
    logits = kv.forward(*args, prefix)
    return logits[rank.to(logits.device)], rank + prefix
