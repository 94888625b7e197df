"""B rows' KV caches in one unmodified HF ``DynamicCache`` (``[B, heads, W, head_dim]`` per layer).

Rows accept different numbers of tokens per round, so their caches grow raggedly. We keep every
row *left-aligned in its own columns with masked holes*: row ``b`` holds its committed tokens in
columns ``[0, length[b])`` (left padding of its prompt included, marked invalid), and columns
``[length[b], W)`` are holes no query sees (``valid[b]`` is False there). A verify call appends
``N`` tree columns to every row at ``W``; committing moves row ``b``'s root and accepted nodes
from there to ``length[b], length[b] + 1, ...``: one indexed copy per layer of the moved columns
alone, in place. So the cache is never re-aligned as a whole (the cost a study of
batched speculative decoding measured at up to 40% of the time); the holes cost attention reads
only, at most the spread between the longest and the shortest row, which a row finishing trims
(:meth:`BatchedKV.keep_rows`).

Positions are explicit per row (a row's ``n``-th real token sits at position ``n``, HF's
``cumsum(attention_mask) - 1`` for left padding), so neither padding nor holes move a token's
RoPE or learned position: each row's keys and values are those its own single-row decoding
computes, which is what makes a batched run exact.

Full-attention models on this dynamic cache only: the loop refuses sliding windows, KV eviction,
tensor parallelism and the static engine for batches in one line.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from dynatree.core.tree import TokenTree, ancestor_matrix
from dynatree.errors import DynaTreeError
from dynatree.options import LinearPlan
from dynatree.runtime.cache import CachedModel, few_row_layout, few_row_plan, head_argmax, head_layout, new_cache, plain_head
from dynatree.runtime.kernels.grouped_kv import applies as grouped_kv_applies, grouped_kv
from dynatree.runtime.window import attention_layout
from dynatree.tuning import BATCH_PREFILL_ROW_LENGTH, BATCH_PREFILL_ROW_PADDING


def ragged_prefill_applies(device: torch.device, lengths: Sequence[int]) -> bool:
    """Whether a batch's prompts are prefilled one by one, unpadded and causal (no mask), rather
    than in one call padded to the longest with a mask. On CPU, one by one wins once the padding
    outweighs the extra passes over the weights, or once the prompts are long enough that the
    masked attention over every padded row dominates (``tuning.BATCH_PREFILL_ROW_PADDING``,
    ``tuning.BATCH_PREFILL_ROW_LENGTH``, where the measurements are)."""
    rows = len(lengths)
    if device.type != "cpu" or rows < 2:
        return False
    longest = max(lengths)
    return longest >= BATCH_PREFILL_ROW_LENGTH or rows * longest - sum(lengths) > BATCH_PREFILL_ROW_PADDING * rows


def batch_cache(model: torch.nn.Module, needs: str) -> DynamicCache:
    """A fresh cache for one of a batch's models; a sliding-window model is refused in one line
    (``needs``: what the batch needs instead), before any model call."""
    if attention_layout(model) is not None:
        raise DynaTreeError(f"{type(model).__name__} uses sliding-window attention: {needs} "
                            "(call generate once per prompt)")
    return new_cache(model, layout=None)


class BatchedKV:
    """A causal LM and the KV caches of a batch of rows: prefill, verify every row's tree in ONE
    forward, commit each row's accepted path, drop finished rows."""

    engine = "hf"
    max_tree_rows: int | None = None

    def __init__(self, model: torch.nn.Module, vocab_size: int, cpu_linear: bool | LinearPlan = False) -> None:
        self.cache = batch_cache(model, "batches need a full-attention target")
        param = next(model.parameters())
        self.model, self.vocab_size = model, vocab_size
        self.device, self.dtype = param.device, param.dtype
        self.calls = 0
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [B, W]: which columns hold a real token
        self.lengths: list[int] = []  # per row: columns in use (its padding and holes included)
        self.pos = torch.zeros(0, dtype=torch.long)  # per row: real tokens cached = next position
        # The few-row linear kernels by the call's total rows (batch rows x tree share), as a single
        # prompt's model+cache runs them: on a 2-core AMD EPYC (Zen 4) F.linear over SmolLM2-135M's
        # weights takes 39.6 / 58.5 / 38.8 ms for 2 / 3 / 4 rows against 17.8 / 24.4 / 21.9 ms packed
        self.linear_plan: LinearPlan | None = few_row_plan(model, self.device, cpu_linear)

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def supports_lazy_head(self) -> bool:
        """Whether :meth:`verify` with ``hidden=True`` plus :attr:`head` reproduce its logits."""
        return plain_head(self.model)

    @property
    def head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def apply_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states ``[rows, H]`` (what lazy logits call), with the
        plan's kernels of that many rows for the head alone."""
        with head_layout(self.linear_plan, hidden.numel() // hidden.shape[-1]):
            return self.head(hidden)

    def head_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The argmax of the head's logits on each row of ``hidden`` ``[rows, H]``: through the
        head's int8 screen where it applies (as :meth:`CachedModel.head_argmax`), else from the logits."""
        return head_argmax(self, hidden)

    # ------------------------------------------------------------------------------ calls
    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        """Cache each row's ``prompts[b]`` (the loop passes every prompt token but the last),
        left-padded to the longest, with causal attention over each row's real tokens only."""
        width = max(len(p) for p in prompts)
        b = len(prompts)
        self.valid = torch.zeros(b, width, dtype=torch.bool)
        tokens = torch.zeros(b, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                self.valid[i, width - len(p):] = True
                tokens[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        self.lengths = [width] * b
        self.pos = self.valid.sum(1)
        if not width:
            return
        if self._ragged([len(p) for p in prompts]):
            self._prefill_rows(prompts, width)
            return
        positions = (self.valid.long().cumsum(1) - 1).clamp_(min=0)
        allowed = self.valid[:, None, :] & torch.ones(width, width, dtype=torch.bool).tril()
        self._call(tokens, positions, allowed, logits_to_keep=1)

    def _prefill_rows(self, prompts: Sequence[Sequence[int]], width: int) -> None:
        """Each prompt in a call of its own, unpadded, its keys and values written into its row's
        last ``len(prompt)`` columns (the left padding stays zeros, masked like any padding)."""
        for i, p in enumerate(prompts):
            if not p:
                continue
            own = CachedModel(self.model, self.vocab_size)  # (a single prompt's prefill: causal, no mask)
            own.prefill(p, hidden=True)  # (hidden: no LM head)
            self.calls += own.calls
            for layer, row in zip(self.cache.layers, own.cache.layers):
                if not layer.is_initialized:
                    layer.allocate(len(prompts), row.keys, row.values, width)
                layer.keys[i, :, width - len(p):] = row.keys[0]
                layer.values[i, :, width - len(p):] = row.values[0]

    def verify(self, trees: Sequence[TokenTree], hidden: bool = False) -> torch.Tensor:
        """ONE forward over every row's tree (root included), each node at its row's position plus
        its depth, seeing its row's valid columns and its own ancestors; returns float logits
        ``[B, N, V]`` (row ``b``'s first ``trees[b].size`` entries are its nodes, tree order), or
        with ``hidden`` the final hidden states ``[B, N, H]`` (the head is then applied to the rows
        acceptance reads: :func:`~dynatree.core.verify.batch_lazy_logits`)."""
        b, n = len(trees), max(t.size for t in trees)
        tokens = torch.zeros(b, n, dtype=torch.long)
        depth = torch.zeros(b, n, dtype=torch.long)
        tree_part = torch.eye(n, dtype=torch.bool).repeat(b, 1, 1)  # padding queries see themselves
        for i, t in enumerate(trees):
            tokens[i, : t.size] = t.tokens
            depth[i, : t.size] = t.depth
            tree_part[i, : t.size, : t.size] = ancestor_matrix(t.parent, t.depth)
        allowed = torch.cat([self.valid[:, None, :].expand(b, n, self.width), tree_part], dim=2)
        if hidden:
            return self._call(tokens, self.pos[:, None] + depth, allowed, base=True)
        logits = self._call(tokens, self.pos[:, None] + depth, allowed)
        return logits[..., : self.vocab_size].float()

    def _call(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
              logits_to_keep: int = 0, base: bool = False) -> torch.Tensor:
        self.calls += 1
        mask = torch.zeros(allowed.shape, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)  # (finite: a fully masked row stays NaN-free)
        inputs = dict(input_ids=tokens.to(self.device), attention_mask=mask[:, None].to(self.device),
                      position_ids=positions.to(self.device), past_key_values=self.cache, use_cache=True)
        # Several query rows per batch row (a tree share, the prefill) read the grouped keys and
        # values in place instead of HF's per-query-head copy (kernels/grouped_kv.py); one row per
        # batch row keeps HF's packed one-token path, the one HF's own batched generate takes.
        with grouped_kv(grouped_kv_applies(self.device, int(tokens.shape[1]))), \
                few_row_layout(self.linear_plan, tokens.numel()):
            if base:
                return self.model.base_model(**inputs).last_hidden_state
            return self.model(**inputs, logits_to_keep=logits_to_keep).logits

    # ------------------------------------------------------------------------- bookkeeping
    def commit(self, keep: Sequence[Sequence[int]]) -> None:
        """After :meth:`verify`: row ``b`` keeps tree nodes ``keep[b]`` (its root and accepted path,
        tree order), moved to its columns ``length[b], length[b] + 1, ...``; every other tree
        column becomes a hole or is cut off."""
        appended = self._cache_width() - self.width
        old = self.lengths
        new = [n + len(k) for n, k in zip(old, keep)]
        hi = max(new)
        in_place = all(n == self.width and list(k) == list(range(len(k))) for n, k in zip(old, keep))
        if in_place:  # (every row keeps a prefix of its tree and no row has holes: a plain step, say)
            self._trim(hi)
        elif appended and self.rows:
            # Only the kept nodes move: row b's node k[j] (tree column width + k[j]) goes to column
            # length[b] + j. Every other column keeps what it holds; the ones no row reads are holes.
            # (One indexed copy per layer of the moved columns alone: a gather of every row's columns
            # from the shortest row's length on cost ~10 ms a round at B = 16.)
            moved = [(i, self.width + int(c), n + j) for i, (n, k) in enumerate(zip(old, keep))
                     for j, c in enumerate(k) if self.width + int(c) != n + j]
            if moved:
                self._move(*torch.as_tensor(moved, dtype=torch.long, device=self.device).unbind(1))
            self._trim(hi)
        valid = torch.zeros(self.rows, hi, dtype=torch.bool)
        valid[:, : self.width] = self.valid  # (hi >= width: every row commits at least its root)
        for i, (n, m) in enumerate(zip(old, new)):
            valid[i, n:m] = True
        self.valid, self.lengths = valid, new
        self.pos = self.pos + torch.as_tensor([len(k) for k in keep], dtype=torch.long)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only batch rows ``rows`` (the others finished): they cost nothing in later calls.
        Columns no remaining row uses, at either end, are cut too."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        valid = self.valid[idx]
        lengths = [self.lengths[i] for i in rows]
        used = valid.any(0).nonzero()
        start = int(used[0]) if len(used) else 0
        end = max(lengths) if lengths else 0
        self._select(idx, start, end)
        self.valid = valid[:, start:end]
        self.lengths = [n - start for n in lengths]
        self.pos = self.pos[idx]

    # ------------------------------------------------------------------------------ storage
    # (what another engine's batch cache replaces: :mod:`dynatree.runtime.aot_batch`)
    def _ragged(self, lengths: list[int]) -> bool:
        """Whether prompts of these lengths are prefilled one by one (else padded, in one call)."""
        return ragged_prefill_applies(self.device, lengths)

    def _move(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy column ``src[i]`` of batch row ``rows[i]`` to its column ``dst[i]``, every layer."""
        for layer in self._layers():
            for t in (layer.keys, layer.values):
                t[rows, :, dst] = t[rows, :, src]  # (the right side is gathered before the write)

    def _trim(self, columns: int) -> None:
        """Drop the cache's columns from ``columns`` on (none is read any more)."""
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[:, :, :columns], layer.values[:, :, :columns]

    def _select(self, idx: torch.Tensor, start: int, end: int) -> None:
        """Keep batch rows ``idx`` and columns ``[start, end)`` only."""
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                setattr(layer, name, t[idx.to(t.device), :, start:end].contiguous())

    def _layers(self) -> list:
        return [x for x in self.cache.layers if x.is_initialized and x.keys is not None and x.keys.numel()]

    def _cache_width(self) -> int:
        layers = self._layers()
        return int(layers[0].keys.shape[2]) if layers else 0


__all__ = ["BatchedKV", "batch_cache"]
