"""Sliding-window and hybrid attention (Mistral, Gemma 2/3, Qwen2/3 with ``use_sliding_window``, ...).

On a sliding-window layer of width ``W`` the token at position ``p`` attends only to keys at
positions ``p - W + 1 .. p`` (HF's ``sliding_window_overlay``: ``kv > q - W``); on a full layer to
everything before it. A tree node sits at position ``prefix + depth``, so on a sliding layer it
must see the prefix rows and the ancestors whose *positions* lie in that window, and on a full
layer everything the tree mask allows. transformers builds one mask per layer type for these
models and accepts a ready-made mapping ``{layer_type: 4D mask}`` as ``attention_mask`` (the
``isinstance(attention_mask, dict)`` branch of the model's forward); a model whose layers all
share one type takes a single 4D mask. We build those masks here and leave the modeling code as
it is.

Caches: HF's sliding-window cache layers (``DynamicSlidingWindowLayer``, ``StaticSlidingWindowLayer``)
keep only the last ``W - 1`` rows and roll them, which breaks the row bookkeeping that tree
verification and compaction rely on (row ``i`` = the ``i``-th committed token). We give sliding
layers full-length cache layers instead and let the mask do the windowing. Memory cost: a sliding
layer holds every token of the run instead of ``W``, i.e. the cache is as large as if every layer
were a full-attention layer (Gemma 3 with 5 of 6 layers sliding at W = 512 or 1024: the KV
memory of a run of ``T`` tokens grows from about ``(T + 5 W) / 6`` to ``T`` rows per layer
once ``T`` exceeds ``W``). Attention time grows likewise: SDPA/eager attention still reads the
keys the window masks out.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from dynatree.errors import DynaTreeError

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class AttentionLayout:
    """The attention type of every decoder layer of a model with at least one sliding layer.

    types:   per-layer type, ``"full_attention"`` or ``"sliding_attention"``.
    window:  the sliding window ``W`` (a key at distance ``d`` from the query is visible iff ``d < W``).
    """

    types: tuple[str, ...]
    window: int

    @property
    def mixed(self) -> bool:
        """Full and sliding layers interleaved: the model needs one mask per layer type."""
        return FULL in self.types

    def describe(self) -> str:
        sliding = sum(t == SLIDING for t in self.types)
        return f"{sliding} of {len(self.types)} layers sliding-window (W={self.window})"


def attention_layout(model: torch.nn.Module) -> AttentionLayout | None:
    """The model's sliding-window layout; None if every layer is full attention.

    Raises a one-line :class:`DynaTreeError` for layer types the tree mask cannot express
    (chunked attention, linear/recurrent layers, KV-sharing layers, ...).
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None
    cfg = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(cfg)
    name = type(model).__name__
    other = sorted(set(types) - {FULL, SLIDING})
    if other:
        raise DynaTreeError(
            f"{name} has {other[0]!r} layers; tree speculative decoding here supports full and sliding-window "
            "attention layers only (chunked, recurrent and shared-KV layers are not handled)"
        )
    if SLIDING not in types:
        return None
    windows = {int(kw["sliding_window"]) for t, kw in zip(types, kwargs) if t == SLIDING}
    if len(windows) != 1:
        raise DynaTreeError(f"{name} has sliding layers of different windows {sorted(windows)}; only one window "
                            "per model is supported (transformers builds one sliding mask per model)")
    layout = AttentionLayout(tuple(types), windows.pop())
    if layout.window < 1:
        raise DynaTreeError(f"{name} has a sliding window of {layout.window}; it must be at least 1")
    if layout.mixed and not _takes_mask_mapping(model):
        raise DynaTreeError(
            f"{name} mixes full and sliding-window layers but its forward does not accept a per-layer-type mask "
            "mapping, so a tree mask cannot be given to each layer type"
        )
    return layout


def _takes_mask_mapping(model: torch.nn.Module) -> bool:
    """Whether the decoder's forward accepts ``attention_mask={layer_type: mask}`` (transformers 5.x
    hybrid models skip their own mask creation when given a dict)."""
    base = getattr(model, "base_model", model)
    try:
        source = inspect.getsource(type(base).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict)" in source


def layer_masks(
    allowed: torch.Tensor,
    query_pos: torch.Tensor,
    key_pos: torch.Tensor,
    layout: AttentionLayout,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive 4D masks ``[1, 1, q, k]`` for each layer type, from the tree mask ``allowed`` ``[q, k]``.

    Full layers get ``allowed``; sliding layers get ``allowed`` and ``query_pos - key_pos < W``
    (positions, not cache rows: a tree's rows are not in position order). Returns a single tensor
    when every layer is sliding (Mistral: the model passes one mask to every layer), else the
    mapping by layer type.
    """
    near = (query_pos.view(-1, 1) - key_pos.view(1, -1)) < layout.window
    sliding = _additive(allowed & near, dtype, device)
    if not layout.mixed:
        return sliding
    return {FULL: _additive(allowed, dtype, device), SLIDING: sliding}


def _additive(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    q, k = allowed.shape
    mask = torch.zeros(q, k, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, q, k).to(device)
