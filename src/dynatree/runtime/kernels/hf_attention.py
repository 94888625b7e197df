"""Plug the Triton tree-attention kernel into unmodified HF models as an attention implementation.

``register()`` adds ``"dynatree_tree"`` to transformers' attention registry; a model switched to
it (``model.set_attn_implementation("dynatree_tree")``) runs the block-skipping kernel whenever a
call carries our 4D tree mask and several queries, and plain SDPA otherwise (prefill with no mask,
one-token steps). The additive mask convention is the engine's: 0 = attend.
"""

from __future__ import annotations

import torch

from dynatree.runtime.kernels.tree_attention import available, tree_attention

NAME = "dynatree_tree"


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    usable = (
        attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.dtype.is_floating_point
        and query.shape[0] == 1
        and query.shape[2] > 1
    )
    if not usable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    allowed = attention_mask[0, 0] == 0
    out = tree_attention(query, key, value, allowed, scaling)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the kernel with transformers (idempotent); returns the implementation name."""
    if not available():
        raise RuntimeError("triton is not installed: pip install triton")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, tree_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
