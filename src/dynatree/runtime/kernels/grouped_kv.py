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

HF already has the switch: ``TRANSFORMERS_SDPA_FORCE_GQA=1``, read on every attention call by
``transformers.integrations.sdpa_attention.use_gqa_in_sdpa``. It is off by default because CUDA's
fused kernels take no mask with ``enable_gqa``. Writing the variable around our calls, as this
module first did, changed the process's environment while any other thread's model ran (not
thread-safe). So :func:`grouped_kv` sets a context variable instead (per thread and per asyncio
task), and HF's decision function is wrapped once to say yes while it is set: every other caller,
and every call outside our block, gets HF's own answer. (A transformers without that function
falls back to the variable.) It is not set for one-row calls: those
keep HF's packed path, which is the one autoregressive decoding takes. (The aot engine's packages
are exported under it at every row count: HF takes its packed path only outside a compiler, so an
exported one-row step would copy the cache too, which at 2,048 cached tokens cost about a third
of the step on the EPYC.) Both paths compute the
same attention. They differ at most in float summation order: ``enable_gqa`` gave bitwise the same
output as the copy in ``tests/runtime/kernels/test_grouped_kv.py``. Greedy exactness is tested end to end.

A package goes one step further (:class:`PackedGroupedAttention`, active while it is exported):
the query heads that share a KV head are stacked as rows of one product, computed by explicit
matrix products and a softmax that inductor fuses with the mask, so each KV head is read once per
layer. Against SDPA's CPU flash kernel with ``enable_gqa`` it gained little in the recorded run:
an 8-row step of the embedded target at 2,048 cached tokens took 41.6 ms packed and 42.4 with
SDPA, a one-row step 23.6 and 23.9; the copy per query head had cost 59.8 and 28.7 (medians of 25
interleaved calls, 2-core EPYC, ``benchmarks/cpu/aot_kv_read.jsonl``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

ENV = "TRANSFORMERS_SDPA_FORCE_GQA"
SUPPORTED = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)  # SDPA's enable_gqa


def applies(device: torch.device, rows: int) -> bool:
    """True for a call of several rows on CPU with a torch whose SDPA takes ``enable_gqa``."""
    return SUPPORTED and device.type == "cpu" and rows > 1


_FORCED: contextvars.ContextVar[bool] = contextvars.ContextVar("dynatree_grouped_kv", default=False)


@functools.cache
def _hooked() -> bool:
    """Wrap HF's ``use_gqa_in_sdpa`` once so that it also says yes inside :func:`grouped_kv`
    (in this thread or task only); False where this transformers has no such function."""
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return False
    decide = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if decide is None:
        return False

    @functools.wraps(decide)
    def use_gqa_in_sdpa(*args: object, **kwargs: object) -> bool:
        # (not under torch.compile, which would trace the context variable; a non-strict export
        # runs this Python as is, so the aot engine's packages take the flag from their build)
        if _FORCED.get() and (not torch.compiler.is_compiling() or torch.compiler.is_exporting()):
            return True
        return decide(*args, **kwargs)

    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa
    return True


@contextlib.contextmanager
def grouped_kv(enabled: bool) -> Iterator[None]:
    """Within the block, HF's SDPA attention reads grouped keys and values in place (when
    ``enabled``), for calls made by this thread (or asyncio task) only; nothing in the process's
    environment changes."""
    if not enabled:
        yield
        return
    if not _hooked():  # (an older transformers: its own switch, the process-wide variable)
        yield from _by_environment()
        return
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)


def _by_environment() -> Iterator[None]:
    before = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def packed_grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attn_mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention(query, key, value, attn_mask, scale=scale, enable_gqa=True)``
    with the ``n`` query heads of each KV head stacked as ``n * L`` rows of one product: query
    ``[B, H, L, D]`` becomes ``[B, H / n, n * L, D]`` (row ``r * L + i`` is query head ``g * n + r``,
    row ``i``), and a mask shared by all heads ``[B or 1, 1, L, S]`` is tiled ``n`` times along its
    rows to match. Explicit products and a softmax: the same attention, other summation order."""
    b, heads, rows, dim = query.shape
    n = heads // key.shape[1]
    q = query.reshape(b, heads // n, n * rows, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)) * (dim ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        scores = scores + attn_mask.repeat(1, 1, n, 1)
    return torch.matmul(torch.softmax(scores, dim=-1), value).reshape(b, heads, rows, dim)


#: ``F.scaled_dot_product_attention``'s positional parameters, in order
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _packable(call: dict[str, Any]) -> bool:
    """Whether an SDPA call (its arguments by name) is one :func:`packed_grouped_attention` computes."""
    q, k, v, mask = (call.get(n) for n in _SDPA_PARAMS[:4])
    return bool(call.get("enable_gqa")) and not call.get("dropout_p") and not call.get("is_causal") \
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() == 4 for t in (q, k, v)) \
        and k.shape[1] < q.shape[1] and q.shape[1] % k.shape[1] == 0 \
        and (mask is None or (isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1] == 1
                              and mask.dtype == q.dtype))


class PackedGroupedAttention(TorchFunctionMode):
    """Within the block, a float32 ``F.scaled_dot_product_attention`` call with ``enable_gqa``,
    no dropout, no ``is_causal`` and a mask shared by all heads (or none) runs as
    :func:`packed_grouped_attention`; every other call as it is. The aot engine exports its
    packages under it (other dtypes keep SDPA, whose kernel accumulates in float32)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            call = {**dict(zip(_SDPA_PARAMS, args)), **kwargs}
            if _packable(call):
                return packed_grouped_attention(call["query"], call["key"], call["value"], call.get("attn_mask"),
                                                call.get("scale"))
        return func(*args, **kwargs)
