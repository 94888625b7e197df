"""A faster layout for the few-row linear layers of decoding on CPU.

Why this exists: decoding multiplies every weight matrix by 1 row (autoregressive step) or a few
(a tree of 2-64 nodes). On the project's CPU (2-core AMD EPYC, torch's MKL) ``F.linear(x, W)``
(``x @ W.T``) costs about twice as much for 2-8 rows as for one, which made verifying a 5-node
tree cost 1.7x an autoregressive step (2-core AMD EPYC VM); and compiled one-row calls are
slower still (inductor turns a one-row matmul into its own loop). The same product computed as
``(W @ x.T).T`` -- the weight as the left operand, the rows as a transposed right operand -- is a
different BLAS kernel that streams each weight once for all rows: for 2-8 rows it costs *less*
than the one-row ``F.linear``. So one-row calls are padded to two (their answer is the first
row), and every call of up to ``max_rows`` rows takes this layout. The result is copied back to row-major
order: left as the transposed view, every elementwise op after it (norms, rotary embeddings) and
SDPA's fused CPU kernel (which needs a unit last-dim stride) ran on a column-major tensor, and a
3-row verify cost 2.2x a one-row step instead of 1.5x. Measured side by side on that CPU, layers
alone and end to end; results differ from ``F.linear`` only by float summation order (greedy
exactness is unaffected and tested).

From ``CPU_PACKED_MIN_ROWS`` rows (4) the product uses weights pre-packed for oneDNN
(``torch.ops.mkldnn``), the blocked layout oneDNN's own kernels read: for 8-24 rows it computes
the linear layers in about 60% of the time of ``(W @ x.T).T``, so a verify pass of a 16-node
tree costs 1.8 one-row steps instead of 2.5. A packed copy is made once per weight tensor (and
again if the weight is changed in place), kept on the tensor itself, and only where a second copy
of the weights fits (:func:`packing_applies`): it doubles their weight memory. Like the layout, it
changes results only by float summation order.

For models too big for a copy within that bound, and for bf16 models, the same oneDNN kernels
read the weights in place (``"onednn"``: no copy, the weight's own row-major layout) or from a
packed copy where memory allows one (:func:`packing_applies`: at most ``CPU_PACKED_MEMORY_SHARE`` of
the memory available when the model is first run). On the 2-core EPYC, over the linear weights of
a Qwen2.5-1.5B-shaped model (hidden 1536, MLP 8960; four layers, 0.75 GB fp32), ``F.linear`` cost
1.9 / 3.7 / 3.6 / 3.7 / 4.3 passes of reading the weights for 1 / 2 / 4 / 8 / 16 rows, oneDNN on
the plain weights 1.2 / 1.3 / 1.4 / 1.7 / 2.3 and on packed weights 1.3 / 1.5 / 0.7 / 1.0 / 1.5:
a packed verify of 8 rows reads each weight once, where ``F.linear`` reads it almost four times
(``benchmarks/cpu/kernels/``). In bf16, packed: 1.1 / 1.3 / 0.9 / 1.2 / 1.9, ``F.linear`` 2.3 /
1.8 / 2.1 / 2.4 / 3.1. Which kernel a row count takes is measured per machine and model
(:mod:`~dynatree.runtime.kernels.linear_plan`).

It is applied through a :class:`~torch.overrides.TorchFunctionMode` around our own model calls,
not by editing the user's model: every ``F.linear`` inside the ``with`` block (``nn.Linear`` uses
it) is rerouted, nothing else changes, and ``torch.compile`` traces it like any other code. Calls
of more rows (prefill chunks), non-CPU tensors and anything needing autograd keep ``F.linear``.
Whether it pays off depends on the CPU's BLAS, and by row count: on a 2-core Intel Sapphire
Rapids the one-row ``F.linear`` is about twice as fast as this layout, which wins there only from
~16 rows. So by default (``cpu_linear=None``) the kernel per row count is measured on the user's
CPU (:mod:`dynatree.runtime.kernels.linear_plan`); ``cpu_linear=True`` forces the EPYC-tuned
layout and ``cpu_linear=False`` is the plain path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dynatree import tuning
from dynatree.options import LinearPlan
from dynatree.tuning import CPU_LINEAR_MAX_ROWS as MAX_ROWS  # 64 (measured: dynatree.tuning)

_PACKED_ATTR = "_dynatree_onednn_packed"


@functools.cache
def packing_available() -> bool:
    """Whether this torch build has oneDNN's linear ops (CPU builds for x86 and ARM do)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise") \
        and hasattr(ops, "_reorder_linear_weight")


@functools.cache
def onednn_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes oneDNN's kernels take here: fp32, and bf16 where the CPU has bf16
    instructions (AVX-512 BF16 or AMX; elsewhere oneDNN would emulate them slowly)."""
    if not packing_available():
        return ()
    bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return (torch.float32, torch.bfloat16) if bf16 is not None and bf16() else (torch.float32,)


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation now (Linux's MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def packing_budget(already: int = 0) -> int:
    """The most bytes of packed copies a model may hold: ``CPU_PACKED_MEMORY_SHARE`` of the memory
    available now plus the ``already`` packed bytes it holds (so a model's copies, once made, do
    not count against it), capped at ``CPU_PACKED_MAX_BYTES`` (the bound where the available memory
    cannot be read)."""
    free = available_memory()
    cap = tuning.CPU_PACKED_MAX_BYTES
    return cap if free is None else min(cap, int(tuning.CPU_PACKED_MEMORY_SHARE * (free + already)))


def packing_applies(model: torch.nn.Module) -> bool:
    """Whether ``model``'s few-row layers may use packed weights: every parameter of one dtype
    oneDNN takes here (:func:`onednn_dtypes`), none an inference tensor, and a second copy of
    them within :func:`packing_budget`. A 1.5B-parameter fp32 model (6 GB) gets its copies on a
    24 GB machine; a 7B bf16 model (14 GB) on a 32 GB one reads its weights in place instead."""
    params = list(model.parameters())
    if not params or params[0].dtype not in onednn_dtypes():
        return False
    if any(p.dtype != params[0].dtype or p.is_inference() for p in params):
        return False
    already = sum(hit[1].numel() * hit[1].element_size() for p in params
                  if (hit := getattr(p, _PACKED_ATTR, None)) is not None)
    return sum(p.numel() * p.element_size() for p in params) <= packing_budget(already)


def drop_packed(weights: Iterable[torch.Tensor]) -> None:
    """Free the packed copies :func:`packed_weight` left on ``weights`` (remade on next use)."""
    for w in weights:
        if hasattr(w, _PACKED_ATTR):
            delattr(w, _PACKED_ATTR)


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` packed for oneDNN, made on first use and remade when the weight's storage or
    version (an in-place change, also one made under ``torch.inference_mode()``) differs from the
    packed copy's. Never called for an inference tensor (see :func:`small_batch_linear`)."""
    key = (weight.data_ptr(), weight._version)
    hit = getattr(weight, _PACKED_ATTR, None)
    if hit is None or hit[0] != key:
        hit = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        setattr(weight, _PACKED_ATTR, hit)
    return hit[1]


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       kernel: str = "rowmajor") -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by one of the few-row kernels, same result up to rounding:

    - ``"rowmajor"``: ``(weight @ x.T).T``; a single row is duplicated (two-row product, first row
      kept), cheaper than the one-row kernels on the CPU this layout was tuned on;
    - ``"onednn"``: oneDNN's product reading the weight as it is (no copy);
    - ``"packed"``: oneDNN's product on a packed copy of the weight (:func:`packed_weight`).

    A oneDNN kernel on a dtype oneDNN does not take here falls back to ``"rowmajor"``; ``"packed"``
    on an inference-tensor weight reads it in place (``"onednn"``). Which kernel a call of so many rows takes is the
    :class:`~dynatree.runtime.kernels.linear_plan.LinearPlan`'s decision.
    """
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    onednn = kernel in ("onednn", "packed") and x.dtype == weight.dtype and weight.dtype in onednn_dtypes() \
        and weight.is_contiguous() and (bias is None or bias.dtype == weight.dtype)
    # An inference tensor (a weight created under torch.inference_mode()) has no version counter, so
    # an in-place change to it (an RL loop copying new weights in) could not be told from the packed
    # copy's: such weights are read as they are, every call.
    if onednn and kernel == "packed" and weight.is_inference():
        kernel = "onednn"
    if onednn:
        w = packed_weight(weight) if kernel == "packed" else weight
        out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), w, bias, "none", [], "")
        return out.reshape(*x.shape[:-1], weight.shape[0])
    if rows == 1:  # a real copy: a stride-0 (expanded) operand would make torch.mm copy into the slow layout
        flat = torch.cat((flat, flat))
    out = torch.mm(weight, flat.t()).t()[:rows].contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _applies(x: Any, weight: Any, max_rows: int) -> bool:
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if x.device.type != "cpu" or weight.dim() != 2 or x.dim() < 1 or x.shape[-1] == 0:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    return 1 <= x.numel() // x.shape[-1] <= max_rows


class SmallBatchLinear(TorchFunctionMode):
    """Within ``with SmallBatchLinear(plan=...):``, each CPU ``F.linear`` call of few rows takes the
    kernel the plan names for its row count (:mod:`dynatree.runtime.kernels.linear_plan`).

    Without a plan: :func:`small_batch_linear` for up to ``max_rows`` rows, with packed weights from
    ``CPU_PACKED_MIN_ROWS`` rows if ``packed`` (see :func:`packing_applies`): the layout as tuned on
    the 2-core EPYC."""

    def __init__(self, max_rows: int = MAX_ROWS, packed: bool = False, plan: LinearPlan | None = None) -> None:
        super().__init__()
        if plan is None:
            low = min(tuning.CPU_PACKED_MIN_ROWS - 1, max_rows)
            plan = LinearPlan(((low, "rowmajor"),) + (((max_rows, "packed" if packed else "rowmajor"),)
                                                      if max_rows > low else ()))
        self.plan = plan
        self.max_rows = plan.max_rows

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            if _applies(x, weight, self.max_rows):
                kernel = self.plan.kernel(x.numel() // x.shape[-1])
                if kernel != "linear":
                    bias = args[2] if len(args) > 2 else kwargs.get("bias")
                    # (never oneDNN while compiling: a compiled graph keeps its own weights' layout)
                    return small_batch_linear(x, weight, bias,
                                              "rowmajor" if torch.compiler.is_compiling() else kernel)
        return func(*args, **kwargs)
