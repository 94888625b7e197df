"""Block-sparse tree attention in Triton: skip the mask blocks that are entirely masked out.

A verify pass attends ``n`` tree queries to ``prefix + n`` keys under the tree mask. Split into
``BLOCK x BLOCK`` tiles, every prefix tile is dense but most tree tiles are empty: a node only sees
its ancestors. DySpec (App. C) orders the tree depth-first so each subtree is a contiguous
range, which concentrates the non-empty tiles near the diagonal; this kernel then visits only the
non-empty tiles (a per-query-block list of key blocks), FlashAttention-style with an online softmax.

SDPA with the additive mask (``verify.tree_forward``'s default path) stays the reference: the kernel
is tested against it on CPU with ``TRITON_INTERPRET=1`` and only becomes the default where a
benchmark shows it faster (on an NVIDIA H200 it was slower than SDPA at every tree size measured;
see the documentation's Performance notes).

Hand-written because no library kernel takes an arbitrary per-call mask and skips empty blocks
without recompiling (FlexAttention compiles per block mask; xFormers/FA2 have no custom masks).
"""

from __future__ import annotations

import torch

from dynatree.tuning import TREE_ATTENTION_BLOCK

try:  # Triton is optional: CPU users and CI without it still have SDPA.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

BLOCK = TREE_ATTENTION_BLOCK


def block_map(mask: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """``[ceil(q/b), ceil(k/b)]`` bool: which tiles of a boolean ``[q, k]`` mask have any True."""
    q, k = mask.shape
    qb, kb = -(-q // block), -(-k // block)
    padded = torch.zeros(qb * block, kb * block, dtype=torch.bool, device=mask.device)
    padded[:q, :k] = mask
    return padded.view(qb, block, kb, block).any(dim=3).any(dim=1)


def count_blocks(mask: torch.Tensor, block: int = BLOCK) -> int:
    """Number of non-empty tiles: the work a block-skipping kernel does (DySpec Table 5's metric)."""
    return int(block_map(mask, block).sum())


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _tree_attn_fwd(
        Q, K, V, M, KIdx, KCnt, Out,
        scale, n_q, n_k, group,
        sqh, sqm, skh, skn, svh, svn, soh, som, smq, smk, sib,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    ):
        qb = tl.program_id(0)
        h = tl.program_id(1)
        kvh = h // group
        rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + h * sqh + rows[:, None] * sqm + dims[None, :], mask=rows[:, None] < n_q, other=0.0)
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        count = tl.load(KCnt + qb)
        for i in range(0, count):
            kb = tl.load(KIdx + qb * sib + i)
            cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
            k = tl.load(K + kvh * skh + cols[:, None] * skn + dims[None, :], mask=cols[:, None] < n_k, other=0.0)
            v = tl.load(V + kvh * svh + cols[:, None] * svn + dims[None, :], mask=cols[:, None] < n_k, other=0.0)
            allowed = tl.load(
                M + rows[:, None] * smq + cols[None, :] * smk,
                mask=(rows[:, None] < n_q) & (cols[None, :] < n_k),
                other=0,
            )
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32))) * scale
            s = tl.where(allowed != 0, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # Rows with nothing allowed yet keep m = -inf; use 0 there so exp() stays finite.
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(Out + h * soh + rows[:, None] * som + dims[None, :], out.to(Out.dtype.element_ty), mask=rows[:, None] < n_q)


def tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Attention of ``q [1, H, n_q, D]`` over ``k, v [1, H_kv, n_k, D]`` under a bool ``mask [n_q, n_k]``.

    Returns ``[1, H, n_q, D]``. Only tiles with an allowed entry are computed. A head dim that is
    not a power of two >= 16 (Triton's block shapes) is zero-padded, which changes neither q·k nor
    the kept output columns (Pythia-2.8B has 80). Grouped-query attention by head grouping.
    """
    if triton is None:
        raise RuntimeError("triton is not installed: pip install triton")
    _, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    padded = max(16, 1 << (d - 1).bit_length())
    if padded != d:
        pad = (0, padded - d)
        q, k, v = (torch.nn.functional.pad(t, pad) for t in (q, k, v))
        return tree_attention(q, k, v, mask, scale)[..., :d]
    tiles = block_map(mask, BLOCK)
    counts = tiles.sum(1).to(torch.int32)
    # Per query block, the indices of its non-empty key blocks (padded rows are never read).
    order = torch.argsort((~tiles).to(torch.int8), dim=1, stable=True).to(torch.int32).contiguous()
    d = padded
    qf, kf, vf = q[0].contiguous(), k[0].contiguous(), v[0].contiguous()
    m = mask.to(torch.int8).contiguous()
    out = torch.empty_like(qf)
    grid = (tiles.shape[0], h)
    _tree_attn_fwd[grid](
        qf, kf, vf, m, order, counts, out,
        scale, n_q, n_k, h // h_kv,
        qf.stride(0), qf.stride(1), kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1),
        out.stride(0), out.stride(1), m.stride(0), m.stride(1), order.stride(0),
        BLOCK_M=BLOCK, BLOCK_N=BLOCK, HEAD_DIM=d,
    )
    return out.unsqueeze(0)


def tree_block_counts(parent: torch.Tensor, depth: torch.Tensor, prefix_len: int, block: int = BLOCK) -> dict[str, int]:
    """Non-empty tiles of a verify pass's mask in creation (BFS) order vs DFS order.

    DFS order is a permutation of queries and tree keys alike; the prefix columns are dense either
    way, so only the tree part can improve.
    """
    from dynatree.core.tree import ancestor_matrix, dfs_order

    anc = ancestor_matrix(parent, depth)
    n = anc.shape[0]
    full = torch.ones(n, prefix_len + n, dtype=torch.bool)
    full[:, prefix_len:] = anc
    perm = dfs_order(parent)
    dfs = torch.ones_like(full)
    dfs[:, prefix_len:] = anc[perm][:, perm]
    return {"bfs": count_blocks(full, block), "dfs": count_blocks(dfs, block), "dense": count_blocks(torch.ones_like(full), block)}
