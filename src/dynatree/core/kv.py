"""The KV protocol: what the decoding loop, the draft sources, the verifier and the cost model use
of a model together with its KV cache. The caches of :mod:`dynatree.runtime` implement it, so the
core never imports them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch


class KVModel(Protocol):
    """What the decoding loop, the drafter, the verifier and the cost model use of a model and its
    KV cache. :class:`CachedModel` (dynamic HF cache), :class:`StaticCachedModel` (pre-allocated,
    bucketed, compilable) and :class:`~dynatree.runtime.streaming.StreamingKV` (sink + window eviction)
    implement it; rows are addressed by logical index (``length`` counts every cached token)."""

    engine: str
    model: torch.nn.Module
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    calls: int
    #: the most rows (tree root included) one verify call can take; None: no limit. The loop
    #: hands it to every round's tree (:class:`~dynatree.core.tree.TreeBuilder`), so drafting
    #: policies and sources size their trees to it.
    max_tree_rows: int | None

    @property
    def length(self) -> int: ...

    def prefill(self, tokens: Sequence[int], hidden: bool = False, layers: Sequence[int] = (),
                logits: bool = False) -> torch.Tensor | None: ...

    def forward(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                since: int, last_only: bool = False) -> torch.Tensor: ...

    def forward_hidden(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                       since: int) -> torch.Tensor: ...

    def forward_features(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                         since: int, layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]: ...

    def call(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
             base: bool = False, **inputs: Any) -> Any: ...

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None: ...

    def apply_head(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def head_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The argmax over the vocabulary of :meth:`apply_head` on each row of ``hidden`` (LongTensor
        ``[R]``), which need not compute the logits (a screened head)."""
        ...

    def supports_lazy_head(self) -> bool: ...
