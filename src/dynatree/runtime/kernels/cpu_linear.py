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
again if the weight is changed in place), kept on the tensor itself, and only for fp32 models of
at most ``CPU_PACKED_MAX_BYTES``: it doubles their weight memory. Like the layout, it changes
results only by float summation order.

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

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dynatree import tuning
from dynatree.options import LinearPlan
from dynatree.tuning import CPU_LINEAR_MAX_ROWS as MAX_ROWS  # 64 (measured: dynatree.tuning)

_PACKED_ATTR = "_dynatree_onednn_packed"


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear ops (CPU builds for x86 and ARM do)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise") \
        and hasattr(ops, "_reorder_linear_weight")


def packing_applies(model: torch.nn.Module) -> bool:
    """Whether ``model``'s few-row layers of ``CPU_PACKED_MIN_ROWS``+ rows use packed weights:
    an fp32 model small enough that a second copy of its weights is affordable."""
    params = list(model.parameters())
    return bool(params) and packing_available() and all(p.dtype == torch.float32 for p in params) \
        and not any(p.is_inference() for p in params) \
        and sum(p.numel() * p.element_size() for p in params) <= tuning.CPU_PACKED_MAX_BYTES


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
                       packed: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x.T).T``, or with ``packed`` by oneDNN
    on the packed weight: same result up to rounding. Which one a call of so many rows takes is the
    :class:`~dynatree.runtime.kernels.linear_plan.LinearPlan`'s decision.

    A single row is duplicated (two-row product, first row kept): cheaper than the one-row kernels
    on the CPU this layout was tuned on.
    """
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    # An inference tensor (a weight created under torch.inference_mode()) has no version counter, so
    # an in-place change to it (an RL loop copying new weights in) could not be told from the packed
    # copy's: such weights keep the row-major layout, which reads the weight itself every call.
    if packed and x.dtype == weight.dtype == torch.float32 and not weight.is_inference():
        out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), packed_weight(weight), bias, "none", [], "")
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
                    # (never packed while compiling: a compiled graph keeps its own weights' layout)
                    return small_batch_linear(x, weight, bias,
                                              packed=kernel == "packed" and not torch.compiler.is_compiling())
        return func(*args, **kwargs)
