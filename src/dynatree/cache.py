"""KV-cache bookkeeping on unmodified HuggingFace ``DynamicCache`` objects.

After a verify pass the cache holds ``[committed prefix | every tree node]``. Committing a path
means keeping the accepted nodes' rows, moved to sit right after the prefix, and dropping the rest.
We move rows instead of cropping and re-running the accepted tokens (what the DynaTree seeds do):
the rows were computed with exactly the positions and ancestors they would have had in sequential
decoding, so they are the rows sequential decoding would have produced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .errors import DynaTreeError


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """A fresh dynamic cache for ``model``; refuses layer types we cannot compact safely."""
    cache = DynamicCache(config=getattr(model, "config", None))
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise DynaTreeError(
                f"{type(model).__name__} uses {type(layer).__name__} cache layers (sliding window or "
                "similar); tree speculative decoding here supports full-attention caches only"
            )
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def compact(cache: DynamicCache, start: int, keep: Sequence[int] | torch.Tensor) -> None:
    """Keep cache rows ``keep`` (absolute, ascending, all >= start) at ``start, start+1, ...``; drop the rest.

    In place on every layer. The right-hand side of an advanced-index assignment is materialised
    before the write, so overlapping source/destination ranges are safe.
    """
    keep_t = torch.as_tensor(keep, dtype=torch.long)
    k = int(keep_t.numel())
    contiguous = k == 0 or (int(keep_t[0]) == start and int(keep_t[-1]) == start + k - 1)
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            continue
        if not contiguous:
            idx = keep_t.to(layer.keys.device)
            layer.keys[..., start : start + k, :] = layer.keys[..., idx, :]
            layer.values[..., start : start + k, :] = layer.values[..., idx, :]
        layer.keys = layer.keys[..., : start + k, :]
        layer.values = layer.values[..., : start + k, :]


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop every row at or after ``length``."""
    compact(cache, length, [])
