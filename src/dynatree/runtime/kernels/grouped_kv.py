"""Grouped-query attention that reads the KV cache in place, for our multi-row calls on CPU.

Why this exists: in a model whose query heads share key/value heads (grouped-query attention:
SmolLM2-135M has 9 query heads on 3 KV heads), HF's SDPA path copies every cached key and value
once per query head that reads it (``repeat_kv``) whenever a call carries a mask. That covers every
verify pass, every draft level and the prefill. A one-row call avoids the copy by packing its
query heads (HF's ``pack_gqa``). So the copy grew with the context, and only multi-row calls paid
it.

On the project's CPU (2-core AMD EPYC, SmolLM2-135M, 700 cached tokens, 2 threads) the copy was
about 70% of a verify of 3 rows. Such a verify cost 2.2x a one-row step. Reading the cache in
place (SDPA's ``enable_gqa``) brings it to 1.2x; a 16-row verify falls from 2.5x to 2.1x.

HF already has the switch: ``TRANSFORMERS_SDPA_FORCE_GQA=1``, read on every attention call. It is
off by default because CUDA's fused kernels take no mask with ``enable_gqa``. :func:`grouped_kv`
sets it only around our own calls of several rows on CPU. It is not set for one-row calls: those
keep HF's packed path, which is the one autoregressive decoding takes. Both paths compute the
same attention. They differ at most in float summation order: ``enable_gqa`` gave bitwise the same
output as the copy in ``tests/runtime/kernels/test_grouped_kv.py``. Greedy exactness is tested end to end.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

ENV = "TRANSFORMERS_SDPA_FORCE_GQA"
SUPPORTED = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)  # SDPA's enable_gqa


def applies(device: torch.device, rows: int) -> bool:
    """True for a call of several rows on CPU with a torch whose SDPA takes ``enable_gqa``."""
    return SUPPORTED and device.type == "cpu" and rows > 1


@contextlib.contextmanager
def grouped_kv(enabled: bool) -> Iterator[None]:
    """Within the block, HF's SDPA attention reads grouped keys and values in place (when
    ``enabled``). The variable is restored afterwards, even if the user had set it."""
    if not enabled:
        yield
        return
    before = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
