"""The token tree: flat tensors in creation (BFS) order, and everything derived from them.

Node 0 is always the *root*: the last committed token, whose key/value rows are not in the
target's cache yet (the previous round only decided it). Putting it in the tree means the target
verifies the tree and produces the root's own KV rows in the same single forward pass, so no
committed token is ever run through the target twice. Drafted nodes are 1..n-1.

Invariants (checked by :func:`validate`):
    parent[0] == -1, depth[0] == 0, and for i >= 1: 0 <= parent[i] < i, depth[i] = depth[parent[i]] + 1.
Ancestors always come before descendants, which is what lets every derived quantity be computed
level by level instead of node by node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dynatree.errors import DynaTreeError


@dataclass(frozen=True)
class TokenTree:
    """A token tree as flat tensors (all on CPU, length n = 1 + number of drafted nodes).

    tokens:   token id of each node (node 0 = last committed token).
    parent:   index of the parent node, -1 for the root.
    depth:    distance from the root (root 0, first drafted level 1).
    logq:     draft log-probability of the node given its parent's context (0 for the root).
    cum_logq: sum of logq along the root-to-node path (log of the path probability under the draft).
    child_q:  what lossless sampling verification needs (None: every node's children are
              deterministic, i.e. chosen as top-B / greedy, which verification treats as drafts with
              q = 1). Otherwise one entry per node: the draft distribution ``[V]`` its children were
              *sampled* from, without replacement, in creation order (None for a node whose children
              are deterministic or that has none).
    """

    tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    logq: torch.Tensor
    cum_logq: torch.Tensor
    child_q: tuple[torch.Tensor | None, ...] | None = None

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    @property
    def num_drafted(self) -> int:
        return self.size - 1

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.size else 0


class TreeBuilder:
    """Mutable, append-only tree used by drafting policies; frozen into a :class:`TokenTree`.

    Python lists rather than tensors because policies add a handful of nodes per draft call and
    tensor appends would cost more than the arithmetic they store.
    """

    def __init__(self, root_token: int, max_rows: int | None = None, depth_limit: int | None = None) -> None:
        """``max_rows``: the most rows (root included) the engine can verify in one call (the
        static engine's largest bucket; None: no limit). Every policy and source sizes its tree
        with :meth:`cap`, so a default budget larger than the engine's bucket shrinks to it instead
        of failing mid-round; :meth:`add` refuses past it (a policy that ignored :meth:`cap`)."""
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        #: the deepest node worth drafting this round (None: no limit). The loop passes the tokens
        #: left minus one: a node at depth ``tokens left`` could be committed, but only in place of
        #: the bonus token the target gives at its parent anyway (the same token under greedy, the
        #: same distribution under sampling), so drafting and verifying it buys nothing
        self.depth_limit = depth_limit
        self.tokens: list[int] = [int(root_token)]
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self.logq: list[float] = [0.0]
        self.cum_logq: list[float] = [0.0]
        self.child_q: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def cap(self, nodes: int) -> int:
        """A drafted-node budget of ``nodes`` limited to what the engine can verify."""
        return nodes if self.max_rows is None else min(nodes, self.max_rows - 1)

    def deepens(self, node: int) -> bool:
        """Whether a child of ``node`` could still be committed this round (see ``depth_limit``)."""
        return self.depth_limit is None or self.depth[node] < self.depth_limit

    def add(self, parent: int, token: int, logq: float) -> int:
        """Append a child of ``parent``; returns the new node's index."""
        if self.max_rows is not None and len(self.tokens) >= self.max_rows:
            raise DynaTreeError(f"tree of more than {self.max_rows} rows: the engine verifies at most {self.max_rows} "
                                "(a drafting policy must size its tree with TreeBuilder.cap)")
        self.tokens.append(int(token))
        self.parent.append(int(parent))
        self.depth.append(self.depth[parent] + 1)
        self.logq.append(float(logq))
        self.cum_logq.append(self.cum_logq[parent] + float(logq))
        return len(self.tokens) - 1

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` nodes (root included). Ancestors precede descendants, so any prefix
        is a valid tree; used to cut a tree down to a cost-model budget after drafting."""
        n = max(1, int(n))
        for seq in (self.tokens, self.parent, self.depth, self.logq, self.cum_logq):
            del seq[n:]
        for node in [k for k in self.child_q if k >= n]:
            del self.child_q[node]

    def set_sampled(self, node: int, dist: torch.Tensor) -> None:
        """Declare that ``node``'s children are sampled from ``dist`` without replacement, in the
        order they are added. Call it before or when adding the first child; siblings must then be
        added in sampling order (the verifier replays the same residuals)."""
        self.child_q[node] = dist

    def freeze(self) -> TokenTree:
        child_q = tuple(self.child_q.get(i) for i in range(len(self.tokens))) if self.child_q else None
        return TokenTree(
            tokens=torch.tensor(self.tokens, dtype=torch.long),
            parent=torch.tensor(self.parent, dtype=torch.long),
            depth=torch.tensor(self.depth, dtype=torch.long),
            logq=torch.tensor(self.logq, dtype=torch.float32),
            cum_logq=torch.tensor(self.cum_logq, dtype=torch.float32),
            child_q=child_q,
        )


def validate(tree: TokenTree) -> None:
    """Raise ValueError if the tree breaks the ordering invariants the derived functions rely on."""
    n = tree.size
    if n == 0 or int(tree.parent[0]) != -1 or int(tree.depth[0]) != 0:
        raise ValueError("tree must start with a root node (parent -1, depth 0)")
    if n > 1:
        p = tree.parent[1:]
        idx = torch.arange(1, n)
        if bool((p < 0).any()) or bool((p >= idx).any()):
            raise ValueError("every non-root node's parent must precede it")
        if not torch.equal(tree.depth[1:], tree.depth[p] + 1):
            raise ValueError("depth must be parent's depth + 1")
    if tree.child_q is not None and len(tree.child_q) != n:
        raise ValueError("child_q must have one entry per node")


def ancestor_matrix(parent: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """``anc[i, j]`` is True iff node j is node i itself or one of its ancestors.

    Computed one depth level at a time (a node's row is its parent's row plus itself), so the cost
    is O(depth) tensor ops rather than O(n) Python steps.
    """
    n = parent.numel()
    anc = torch.eye(n, dtype=torch.bool)
    for d in range(1, int(depth.max()) + 1 if n else 0):
        nodes = (depth == d).nonzero().flatten()
        anc[nodes] |= anc[parent[nodes]]
    return anc


def attention_mask(
    anc_rows: torch.Tensor, prefix_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Additive 4D mask ``[1, 1, q, prefix_len + k]`` from a boolean ``[q, k]`` ancestor block.

    Every query sees the whole cached prefix plus the tree keys marked True. Masked entries use
    ``finfo.min`` rather than ``-inf`` so a fully masked row (never produced here, but cheap to
    guard) cannot turn softmax into NaN. Float masks work for both SDPA and eager attention.
    """
    q, k = anc_rows.shape
    mask = torch.zeros(q, prefix_len + k, dtype=dtype)
    mask[:, prefix_len:].masked_fill_(~anc_rows, torch.finfo(dtype).min)
    return mask.view(1, 1, q, prefix_len + k).to(device)


def position_ids(depth: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Positions ``prefix_len + depth`` ([1, n]): a node sits where it would in its own sequence.

    Using the flattened (BFS) index instead is the classic tree-decoding bug: siblings would get
    different rotary/learned positions and the target would no longer see the same context.
    """
    return (depth + prefix_len).view(1, -1)


def path_to(parent: torch.Tensor, node: int) -> list[int]:
    """Node indices from the root to ``node`` inclusive."""
    path = []
    while node != -1:
        path.append(node)
        node = int(parent[node])
    return path[::-1]


def committed_tokens(tree: TokenTree, accepted: list[int], bonus: int) -> list[int]:
    """The tokens a round commits: the accepted nodes' tokens (path order), then the bonus token."""
    return [int(t) for t in tree.tokens[list(accepted)].tolist()] + [int(bonus)]


def truncate_round(new: list[int], room: int, stop: set[int]) -> list[int]:
    """A round's tokens cut at the first stop token (kept, as HF does) and at the ``room`` left."""
    new = new[:room]
    for i, tok in enumerate(new):
        if tok in stop:
            return new[: i + 1]
    return new


def leaf_paths(tree: TokenTree) -> Iterator[list[int]]:
    """Every root-to-leaf path of ``tree`` (node indices, root first), depth first."""
    kids = children_lists(tree.parent)
    stack = [[0]]
    while stack:
        path = stack.pop()
        if not kids[path[-1]]:
            yield path
        stack.extend(path + [c] for c in reversed(kids[path[-1]]))


def children_lists(parent: torch.Tensor) -> list[list[int]]:
    """Children of every node, in creation order (which is sibling sampling order for DySpec)."""
    kids: list[list[int]] = [[] for _ in range(parent.numel())]
    for i, p in enumerate(parent.tolist()):
        if p >= 0:
            kids[p].append(i)
    return kids


def dfs_order(parent: torch.Tensor) -> torch.Tensor:
    """Pre-order depth-first permutation (children in creation order).

    Used to make the tree mask block-sparse-friendly (DySpec App. C): in DFS order every subtree is
    a contiguous range of rows/columns.
    """
    kids = children_lists(parent)
    order: list[int] = []
    stack = [0] if parent.numel() else []
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(kids[node]))
    return torch.tensor(order, dtype=torch.long)
