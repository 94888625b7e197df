"""A batch's draft-model KV caches in one HF cache, so that a step's draft calls of every row run
as ONE forward.

Each row of a batch grows its own tree with its own model proposer, which calls its draft as a
single prompt's does: the pending committed tokens, then level after level. A draft model is
small, so such a call costs its fixed overhead more than its rows (on a 2-core AMD EPYC, Zen 4,
fp32, SmolLM2-135M's shipped 2-layer draft, 600 cached tokens: 3 pending tokens take 8.0 ms for
one row alone, 9.3 ms for 4 rows in one call, 22.3 ms for 16). The batch's loop therefore drives
the rows' proposers step by step (:meth:`dynatree.core.proposer.Proposer.drafting`) and hands a
step's calls of all rows to :meth:`BatchedDraftKV.run` at once.

Layout: ``[B, heads, W, head_dim]`` per layer (:class:`~dynatree.runtime.growing_layer.GrowingLayer`
buffers). Row ``b``'s cached rows sit in columns ``[0, length[b])``, in the order its proposer
cached them (its logical rows: a row's :class:`RowDraftKV` is a single prompt's cache to it);
columns from ``length[b]`` on are holes no query of that row sees. A gathered call appends ``Q``
columns to every row at ``W`` (HF's cache appends at its end) with each row's queries
right-aligned in them, so that a row's last real query is the call's last (what a pending-token
call keeps); padding queries see only themselves. Each row's new columns then move to
``length[b], length[b] + 1, ...`` (one indexed copy per layer of the moved columns alone) and the
width is cut to the longest row. Every row's keys and values are those its own cache would hold:
same tokens, same positions, same visible rows; only float summation order in the batched matmuls
may differ, which a greedy run's output never depends on (the target decides every token).

Run alone instead (the row's columns copied out, the call run unpadded, its new keys and values
written back): a prompt's prefill, a call of more than :data:`dynatree.tuning.BATCH_DRAFT_ALONE`
tokens (a draft catching up after sitting rounds out), and a step with a single call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from dynatree.core.proposer import DraftCall
from dynatree.errors import DynaTreeError
from dynatree.options import LinearPlan
from dynatree.runtime.batch_cache import batch_cache
from dynatree.runtime.cache import CachedModel, few_row_layout, few_row_plan
from dynatree.runtime.growing_layer import GrowingLayer
from dynatree.runtime.kernels.grouped_kv import applies as grouped_kv_applies, grouped_kv
from dynatree.tuning import BATCH_DRAFT_ALONE


def gathered_inputs(lengths: Sequence[int], width: int, rows: Sequence[int], calls: Sequence[DraftCall]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens ``[B, Q]``, positions ``[B, Q]``, allowed ``[B, Q, width + Q]``) of one gathered
    forward over a cache of ``len(lengths)`` rows ``width`` columns wide, row ``rows[i]`` running
    ``calls[i]``: its queries right-aligned in its ``Q`` (the longest call's), each seeing its row's
    columns before the call's ``since``, those from there to the row's length its ``visible``
    marks, and among the appended columns its own call's as ``visible`` marks; padding queries
    (and every query of a row without a call) see only themselves."""
    q_max = max(len(c.tokens) for c in calls)
    b_all = len(lengths)
    tokens = torch.zeros(b_all, q_max, dtype=torch.long)
    positions = torch.zeros(b_all, q_max, dtype=torch.long)
    allowed = torch.zeros(b_all, q_max, width + q_max, dtype=torch.bool)
    allowed[:, torch.arange(q_max), width + torch.arange(q_max)] = True
    for b, c in zip(rows, calls):
        n, q, since = lengths[b], len(c.tokens), c.since
        s = q_max - q
        tokens[b, s:] = torch.as_tensor(list(c.tokens), dtype=torch.long)
        positions[b, s:] = c.positions.flatten()
        allowed[b, s:, :since] = True
        allowed[b, s:, since:n] = c.visible[:, : n - since]
        allowed[b, s:, width + s:] = c.visible[:, n - since:]
    return tokens, positions, allowed


class BatchedDraftKV:
    """One draft model's KV caches for a batch of ``rows`` rows; :meth:`row` hands each row's
    proposer its part, :meth:`run` runs several rows' calls together."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, rows: int,
                 cpu_linear: bool | LinearPlan = False) -> None:
        self.cache = batch_cache(model, "a batch's draft model needs full attention")
        param = next(model.parameters())
        self.model, self.vocab_size = model, vocab_size
        self.device, self.dtype = param.device, param.dtype
        self.lengths = [0] * rows  # per batch row: columns in use
        self.handles: list[RowDraftKV] = []
        self.calls = 0  # forwards run (gathered or alone)
        self.linear_plan = few_row_plan(model, self.device, cpu_linear)
        self._single: CachedModel | None = None  # runs the calls that run alone, on a row's columns

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def row(self) -> "RowDraftKV":
        """The next row's draft cache (rows are handed out in batch order)."""
        if len(self.handles) >= self.rows:
            raise DynaTreeError(f"this batch's draft cache has {self.rows} rows, all handed out")
        handle = RowDraftKV(self, len(self.handles))
        self.handles.append(handle)
        return handle

    # ------------------------------------------------------------------------------ calls
    def run(self, calls: Sequence[DraftCall]) -> list[torch.Tensor]:
        """Each call's result (as :meth:`DraftCall.run` would give it), calls on distinct rows of
        this cache: the small ones in one forward, the rest alone (module docstring)."""
        rows = [self._index(c) for c in calls]
        if len(set(rows)) != len(rows):
            raise DynaTreeError("one gathered step holds two calls of the same batch row")
        together = [i for i, c in enumerate(calls) if not c.prefill and len(c.tokens) <= BATCH_DRAFT_ALONE]
        if len(together) < 2:
            together = []
        out: list[torch.Tensor | None] = [None] * len(calls)
        for i, call in enumerate(calls):
            if i not in together:
                out[i] = self._alone(rows[i], call)
        if together:
            for i, result in zip(together, self._together([rows[i] for i in together], [calls[i] for i in together])):
                out[i] = result
        return out  # type: ignore[return-value]

    def _index(self, call: DraftCall) -> int:
        kv = call.kv
        if not isinstance(kv, RowDraftKV) or kv.shared is not self or kv.index is None:
            raise DynaTreeError("a draft call on another cache, or on a batch row that has left the batch")
        return kv.index

    def _alone(self, b: int, call: DraftCall) -> torch.Tensor:
        """One row's call unpadded: its cached columns copied into a single-row cache, the call
        run there as a single prompt's is, its new keys and values written back to the row."""
        n, q = self.lengths[b], len(call.tokens)
        if self._single is None:  # (made once: a model+cache reads the model's layout, ~0.6 ms)
            self._single = CachedModel(self.model, self.vocab_size, self.linear_plan or False)
        own = self._single
        layers = self._layers()
        own.calls = 0
        own.cache = DynamicCache(ddp_cache_data=[(x.keys[b: b + 1, :, :n], x.values[b: b + 1, :, :n]) for x in layers]
                                 if n and layers else None)
        if call.prefill:
            result = own.prefill(call.tokens, logits=True)
        else:
            result = own.forward(call.tokens, call.positions, call.visible, call.since, last_only=call.last_only)
        assert result is not None
        self.calls += own.calls
        new = [x for x in own.cache.layers if x.is_initialized]
        self._reserve(n + q, new)
        for mine, theirs in zip(self._layers(), new):
            mine.keys[b, :, n: n + q] = theirs.keys[0, :, n: n + q]
            mine.values[b, :, n: n + q] = theirs.values[0, :, n: n + q]
        self._grown(b, q)
        return result

    def _together(self, rows: list[int], calls: list[DraftCall]) -> list[torch.Tensor]:
        """Several rows' calls in one forward: every row of the cache takes ``Q`` query columns
        (the longest call's), a call's queries right-aligned in its row's, the rest padding."""
        b_all, width = self.rows, self.width
        tokens, positions, allowed = gathered_inputs(self.lengths, width, rows, calls)
        q_max = int(tokens.shape[1])
        keep = 1 if all(c.last_only for c in calls) else 0
        mask = torch.zeros(b_all, 1, q_max, width + q_max, dtype=self.dtype)
        mask.masked_fill_(~allowed[:, None], torch.finfo(self.dtype).min)  # (finite: no NaN rows)
        self.calls += 1
        with grouped_kv(grouped_kv_applies(self.device, q_max)), few_row_layout(self.linear_plan, b_all * q_max):
            logits = self.model(input_ids=tokens.to(self.device), attention_mask=mask.to(self.device),
                                position_ids=positions.to(self.device), past_key_values=self.cache, use_cache=True,
                                logits_to_keep=keep).logits
        out = []
        for b, c in zip(rows, calls):
            q = len(c.tokens)
            rows_out = logits[b, -1:] if c.last_only else logits[b, q_max - q:]
            out.append(rows_out[:, : self.vocab_size].float())
        # Each row's new columns move from the appended block to right after its cached ones.
        moved = [(b, width + q_max - len(c.tokens) + j, self.lengths[b] + j)
                 for b, c in zip(rows, calls) for j in range(len(c.tokens))]
        moved = [m for m in moved if m[1] != m[2]]
        if moved:
            idx, src, dst = torch.as_tensor(moved, dtype=torch.long, device=self.device).unbind(1)
            for layer in self._layers():
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t[idx, :, dst] = t[idx, :, src]  # (the right side is gathered before the write)
        for b, c in zip(rows, calls):
            self._grown(b, len(c.tokens))
        self._cut()
        return out

    # ------------------------------------------------------------------------- bookkeeping
    def compact(self, b: int, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        """Row ``b`` keeps its columns ``keep`` (ascending, all >= start) at ``start, start + 1, ...``
        and drops the rest from ``start`` on (:func:`dynatree.runtime.cache.compact` for one row)."""
        keep_t = torch.as_tensor(keep, dtype=torch.long)
        k = int(keep_t.numel())
        if k and not (int(keep_t[0]) == start and int(keep_t[-1]) == start + k - 1):
            idx = keep_t.to(self.device)
            for layer in self._layers():
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t[b, :, start: start + k] = t[b, :, idx]
        self.lengths[b] = start + k
        self._cut()

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only batch rows ``rows`` (the others finished): they cost nothing in later calls."""
        rows = list(rows)
        lengths = [self.lengths[i] for i in rows]
        hi = max(lengths, default=0)
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        for layer in self._layers():
            for name in ("keys", "values"):
                setattr(layer, name, getattr(layer, name)[idx, :, :hi].contiguous())
        handles = self.handles
        for h in handles:
            h.index = None
        self.handles = [handles[i] for i in rows]
        for j, h in enumerate(self.handles):
            h.index = j
        self.lengths = lengths

    @property
    def width(self) -> int:
        layers = self._layers()
        return int(layers[0].keys.shape[2]) if layers else 0

    def _layers(self) -> list[Any]:
        return [x for x in self.cache.layers if x.is_initialized and x.keys is not None and x.keys.dim() == 4]

    def _grown(self, b: int, q: int) -> None:
        self.lengths[b] += q
        self.handles[b].calls += 1

    def _reserve(self, width: int, like: list[Any]) -> None:
        """At least ``width`` columns in every layer, heads and head size as ``like``'s layers."""
        while len(self.cache.layers) < len(like):
            self.cache.layers.append(GrowingLayer())
        for mine, theirs in zip(self.cache.layers, like):
            if not mine.is_initialized or mine.keys is None or mine.keys.dim() != 4:
                mine.allocate(self.rows, theirs.keys, theirs.values, width)
            elif mine.keys.shape[2] < width:
                extra = width - int(mine.keys.shape[2])
                k, v = mine.keys, mine.values
                mine.update(k.new_zeros(k.shape[0], k.shape[1], extra, k.shape[3]),
                            v.new_zeros(v.shape[0], v.shape[1], extra, v.shape[3]))

    def _cut(self) -> None:
        """Drop the columns past the longest row (views of the same buffers: no copy)."""
        hi = max(self.lengths, default=0)
        for layer in self._layers():
            if layer.keys.shape[2] > hi:
                layer.keys, layer.values = layer.keys[:, :, :hi], layer.values[:, :, :hi]


class RowDraftKV:
    """One row's part of a :class:`BatchedDraftKV`: to its proposer, a single prompt's draft cache
    (:class:`~dynatree.core.kv.KVModel`'s logits calls); ``shared`` tells
    :func:`~dynatree.core.proposer.run_calls` that its calls can run with the other rows'."""

    engine = "hf"
    max_tree_rows: int | None = None

    def __init__(self, shared: BatchedDraftKV, index: int) -> None:
        self.shared = shared
        self.index: int | None = index  # the row in the shared cache; None once the row has left
        self.model, self.vocab_size = shared.model, shared.vocab_size
        self.device, self.dtype = shared.device, shared.dtype
        self.calls = 0

    @property
    def length(self) -> int:
        return self.shared.lengths[self._row()]

    def _row(self) -> int:
        if self.index is None:
            raise DynaTreeError("this batch row has left the batch: its draft cache is gone")
        return self.index

    def prefill(self, tokens: Sequence[int], hidden: bool = False, layers: Sequence[int] = (),
                logits: bool = False) -> torch.Tensor | None:
        if hidden or layers:
            raise DynaTreeError("a batch's shared draft cache runs logits calls only (no features)")
        if not len(tokens):
            return None
        out = self.shared.run([DraftCall.prompt(self, tokens)])[0]
        return out if logits else None

    def forward(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                since: int, last_only: bool = False) -> torch.Tensor:
        tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        return self.shared.run([DraftCall(self, tokens, positions, visible, since, last_only)])[0]

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        self.shared.compact(self._row(), start, keep)

    def supports_lazy_head(self) -> bool:
        return False


class BatchDrafts:
    """The draft caches of a batch of ``rows`` rows, as :attr:`RunContext.draft_kv
    <dynatree.core.proposer.RunContext.draft_kv>` hands them out: calling it with a draft model
    gives the next row its part of that model's shared :class:`BatchedDraftKV` (rows open their
    proposers in batch order, one store per draft model)."""

    def __init__(self, rows: int, vocab_size: int, cpu_linear: bool | LinearPlan = False) -> None:
        self.rows, self.vocab_size, self.cpu_linear = rows, vocab_size, cpu_linear
        self.stores: dict[int, BatchedDraftKV] = {}

    def __call__(self, model: torch.nn.Module) -> RowDraftKV:
        store = self.stores.get(id(model))
        if store is None:
            store = self.stores[id(model)] = BatchedDraftKV(model, self.vocab_size, self.rows, self.cpu_linear)
        return store.row()

    @property
    def calls(self) -> int:
        """Draft forwards run so far, over every store."""
        return sum(s.calls for s in self.stores.values())

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only batch rows ``rows`` in every store (the others finished)."""
        for store in self.stores.values():
            store.keep_rows(rows)


__all__ = ["BatchDrafts", "BatchedDraftKV", "RowDraftKV", "gathered_inputs"]
