"""A batch's target on the ahead-of-time compiled engine (``engine="aot"`` with several prompts).

Why: on a CPU a batch pays HF's modeling code op by op for every verify call, like one prompt on
the eager engine, while one AOTInductor step of the embedded 135M target costs about half an
eager one (:mod:`dynatree.runtime.aot_engine`). The batch loop's cache layout stays
:class:`~dynatree.runtime.batch_cache.BatchedKV`'s (each row left-aligned in its own columns, holes
masked, accepted nodes moved in place); only its storage and its calls change:

- the keys and values are plain tensors ``[B, heads, capacity, head_dim]`` per layer, grown by an
  eighth as they fill (``aot_engine.grown_columns``), the step writing its rows in place;
- every call (each prompt's prefill chunks, and every verify of all rows' trees) runs ONE frozen
  package whose batch and row counts are both dynamic (``aot_engine.batch_package``): weights
  packed for oneDNN inside it, built once per model and machine, like the package of dynamic rows.

Columns past the last one written are never read: the mask the package gets covers the whole
capacity, those columns masked. Prompts are prefilled one by one, unpadded (a row's keys and values
are those its own prefill computes), in chunks of ``PREFILL_CHUNK`` rows. Exactness: the same
masks, positions and rows as the eager batch, other kernels (float rounding differs; the tokens
are verified the same way, and tested equal to each prompt's own greedy decoding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dynatree.errors import DynaTreeError
from dynatree.options import LinearPlan
from dynatree.runtime import aot_engine, distributed
from dynatree.runtime.batch_cache import BatchedKV
from dynatree.tuning import PREFILL_CHUNK


def cached(model: torch.nn.Module, cpu_linear: bool | LinearPlan = False) -> bool:
    """Whether ``model``'s package of dynamic batches is on disk (what ``engine="auto"`` asks)."""
    from dynatree.runtime import aot_store
    from dynatree.runtime.cache import few_row_plan, plain_head

    plan = few_row_plan(model, next(model.parameters()).device, cpu_linear)
    return aot_store.cached(aot_engine.batch_key(model, plain_head(model), plan))


def prepare(model: torch.nn.Module, log: object = None) -> None:
    """Build (or load) ``model``'s package of dynamic batches, with the kernel plan ``generate``
    resolves for it (``dynatree build-engine --batches``)."""
    from dynatree.options import EngineOptions
    from dynatree.runtime.cache import vocab_size
    from dynatree.runtime.engines import resolve

    plan = resolve(EngineOptions(engine="aot"), model).linear_plan
    AOTBatchedKV(model, vocab_size(model), plan or False, log)


class AOTBatchedKV(BatchedKV):
    """:class:`BatchedKV` whose calls run the aot engine's package of dynamic batches."""

    engine = "aot"

    def __init__(self, model: torch.nn.Module, vocab_size: int, cpu_linear: bool | LinearPlan = False,
                 log: object = None) -> None:
        super().__init__(model, vocab_size, cpu_linear)
        if self.device.type != "cpu":
            raise DynaTreeError(f"engine='aot' runs on a CPU; on {self.device.type} use engine='hf' for batches")
        if distributed.is_sharded(model):
            raise DynaTreeError("engine='aot' does not run a tensor-parallel (sharded) model; use engine='hf'")
        from dynatree.runtime.kernels.cpu_linear import packing_budget

        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        if weights > packing_budget():  # (the package holds its own packed copy of the weights)
            raise DynaTreeError(f"engine='aot' for batches holds a packed copy of {type(model).__name__}'s weights "
                                f"({weights / 2**30:.1f} GiB), more than this machine's budget for one; use engine='hf'")
        self.cache = None  # (the KV lives in self.keys / self.values)
        self._hidden = self.supports_lazy_head()
        self._package = aot_engine.batch_package(model, self._hidden, self.linear_plan, log)
        self._kv_shape = aot_engine.kv_shape(model)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._written = 0  # columns [0, _written) hold what the last call left (the tree's included)

    # ------------------------------------------------------------------------------ calls
    def _ragged(self, lengths: list[int]) -> bool:
        return True  # (a package call costs the rows it gets: padding would only add rows)

    def _prefill_rows(self, prompts: Sequence[Sequence[int]], width: int) -> None:
        """Each prompt on its own (a batch of one: its row of the cache, a contiguous view), causal,
        in chunks, written into the row's last ``len(prompt)`` columns."""
        self._ensure(len(prompts), width)
        for i, p in enumerate(prompts):
            if not p:
                continue
            n, pad = len(p), width - len(p)
            tokens = torch.as_tensor(list(p), dtype=torch.long)
            keys, values = [k[i : i + 1] for k in self.keys], [v[i : i + 1] for v in self.values]
            for s in range(0, n, PREFILL_CHUNK):
                e = min(s + PREFILL_CHUNK, n)
                allowed = torch.zeros(e - s, pad + e, dtype=torch.bool)  # (the left padding never seen)
                allowed[:, pad:] = torch.ones(e - s, e, dtype=torch.bool).tril(s)
                self._step(tokens[None, s:e], torch.arange(s, e)[None], allowed[None], pad + s, keys, values)
        self._written = width

    def _call(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
              logits_to_keep: int = 0, base: bool = False) -> torch.Tensor:
        """One package call: ``tokens`` ``[B, n]`` written at the columns after the ``S - n`` that
        ``allowed`` ``[B, n, S]`` covers before them; hidden states with ``base``, else logits."""
        b, n = tokens.shape
        start = int(allowed.shape[2]) - n
        self._ensure(b, start + n)
        out = self._step(tokens, positions, allowed, start, self.keys, self.values)
        self._written = start + n
        if logits_to_keep:
            out = out[:, -logits_to_keep:]
        if base:
            if not self._hidden:
                raise DynaTreeError(f"{type(self.model).__name__}'s logits are not head(hidden states) (lazy head off)")
            return out
        return self.apply_head(out) if self._hidden else out

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, start: int,
              keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        """The package on ``keys``/``values`` (whole tensors: the mask spans their capacity)."""
        self.calls += 1
        b, n = tokens.shape
        mask = torch.full((b, 1, n, keys[0].shape[2]), torch.finfo(self.dtype).min, dtype=self.dtype)
        mask[:, 0, :, : allowed.shape[2]].masked_fill_(allowed, 0.0)
        return self._package.runner(tokens.contiguous(), mask, positions.contiguous(),
                                    torch.arange(start, start + n), keys, values)

    # ------------------------------------------------------------------------------ storage
    def _ensure(self, rows: int, columns: int) -> None:
        """At least ``columns`` columns for ``rows`` batch rows, keeping what is written."""
        if self.keys and self.keys[0].shape[0] == rows and self.keys[0].shape[2] >= columns:
            return
        layers, heads, dim = self._kv_shape
        capacity = aot_engine.grown_columns(columns)
        keep = min(self._written, columns) if self.keys and self.keys[0].shape[0] == rows else 0
        old = self.keys + self.values
        self.keys = [torch.zeros(rows, heads, capacity, dim, dtype=self.dtype) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        for new, t in zip(self.keys + self.values, old if keep else []):
            new[:, :, :keep] = t[:, :, :keep]

    def _move(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        for t in self.keys + self.values:
            t[rows, :, dst] = t[rows, :, src]

    def _trim(self, columns: int) -> None:
        self._written = columns  # (the columns after it are never read: masked, then overwritten)

    def _select(self, idx: torch.Tensor, start: int, end: int) -> None:
        self.keys = [t[idx, :, start:end].contiguous() for t in self.keys]
        self.values = [t[idx, :, start:end].contiguous() for t in self.values]
        self._written = end - start

    def _cache_width(self) -> int:
        return self._written


__all__ = ["AOTBatchedKV", "cached", "prepare"]
