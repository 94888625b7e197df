"""A cache layer that appends in place: HF's ``DynamicLayer`` with spare room at the end.

Why this exists: HF's ``DynamicLayer.update`` appends a call's keys and values with ``torch.cat``,
which copies the whole layer on every call. Per decoding step that is the whole KV cache once
(SmolLM2-135M, 1,500 cached tokens: 2.7 ms of a 65 ms step at batch 1; at batch 16 and 400 tokens
26 ms of a 187 ms step, measured on a 2-core Intel Xeon, Sapphire Rapids, fp32). Here the keys and
values live in a buffer with room for more columns; ``keys``/``values`` are views of its first
``length`` columns, and an append writes after them. The buffer grows (one copy) only when full,
by at least an eighth of its length, so the copying cost per step falls from the whole cache to a
few columns' worth.

Nothing else changes: attention reads the same numbers from a view instead of a fresh tensor,
and every other piece of code may keep treating ``keys``/``values`` as plain tensors. Cropping a
view (``layer.keys = layer.keys[..., :n, :]``) and writing into one in place (the compaction of
:func:`dynatree.runtime.cache.compact`) act on the buffer directly. Assigning any other tensor
(a batch row selection, a KV eviction's re-assembly) is noticed on the next append, which then
copies it into a fresh buffer.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

#: Spare columns a (re)allocated buffer gets beyond what it must hold: at least this many...
MIN_SPARE = 128
#: ...and at least this fraction of what it holds (so the copies stay a bounded share of a step)
SPARE_FRACTION = 8


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` whose ``keys``/``values`` are views of a buffer with spare columns.

    The views are ``[B, heads, length, head_dim]`` like HF's; only their strides differ (a row's
    head stride covers the buffer's capacity). Attention kernels take strided keys and values.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def _owned(self) -> bool:
        """True if ``keys``/``values`` are still views of the start of our buffers (nobody assigned
        other tensors since our last append)."""
        kb, vb = self._kbuf, self._vbuf
        if kb is None or vb is None:
            return False
        k, v = self.keys, self.values
        return (k.data_ptr() == kb.data_ptr() and v.data_ptr() == vb.data_ptr()
                and k.stride() == kb.stride() and v.stride() == vb.stride()
                and k.shape[:2] == kb.shape[:2] and v.shape[:2] == vb.shape[:2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.requires_grad or value_states.requires_grad:
            # (under autograd an in-place write would overwrite values a backward pass reads: copy, as HF does)
            self._kbuf = self._vbuf = None
            return super().update(key_states, value_states, *args, **kwargs)
        n = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        end = n + key_states.shape[-2]
        owned = self._owned()
        if not owned or end > self._kbuf.shape[-2]:
            self._kbuf = self._grown(self.keys, n, key_states, end)
            self._vbuf = self._grown(self.values, n, value_states, end)
        self._kbuf[:, :, n:end] = key_states
        self._vbuf[:, :, n:end] = value_states
        self.keys, self.values = self._kbuf[:, :, :end], self._vbuf[:, :, :end]
        return self.keys, self.values

    def allocate(self, batch: int, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Start as ``batch`` rows of ``length`` zero columns, heads and head size as ``keys`` /
        ``values`` (``[_, heads, _, head_dim]``), to be written row by row in place (a batch's
        prompts prefilled one at a time: :meth:`dynatree.runtime.batch_cache.BatchedKV.prefill`)."""
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        size = length + max(MIN_SPARE, length // SPARE_FRACTION)
        self._kbuf = keys.new_zeros(batch, keys.shape[1], size, keys.shape[3])
        self._vbuf = values.new_zeros(batch, values.shape[1], size, values.shape[3])
        self.keys, self.values = self._kbuf[:, :, :length], self._vbuf[:, :, :length]

    @staticmethod
    def _grown(old: torch.Tensor, n: int, new: torch.Tensor, end: int) -> torch.Tensor:
        """A buffer for ``end`` columns plus spare ones, its first ``n`` holding ``old``'s."""
        b, h, _, d = new.shape
        buf = new.new_empty(b, h, end + max(MIN_SPARE, end // SPARE_FRACTION), d)
        if n:
            buf[:, :, :n] = old
        return buf

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()


__all__ = ["GrowingLayer", "MIN_SPARE", "SPARE_FRACTION"]
