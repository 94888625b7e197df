"""Every few-row linear kernel against the exact product, at the tolerance the operation's own float
error allows (not a fixed 1e-5): a kernel that drops or swaps a row, or multiplies by a stale
packed copy of a weight changed in place, is outside it.

The bound. An output ``y = sum_k x_k w_k (+ b)`` accumulated in fp32 in any order, from inputs
whose pairwise products are exact in fp32 (fp32 inputs: up to one rounding each, bf16 inputs:
exact), is within ``gamma_n * S`` of the exact sum, ``S = sum_k |x_k w_k| (+ |b|)``,
``gamma_n = n u / (1 - n u)``, ``u = 2**-24``, ``n = K + 2`` (the products' roundings, the sum's
and the bias's; Higham, *Accuracy and Stability of Numerical Algorithms*, eq. 3.5). A bf16 result
is rounded to bf16 at most twice (the row-major layout rounds the product, then adds the bias):
``+ 2**-8 * (|y| + sum_k |x_k w_k| + 2 gamma_n S)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dynatree.runtime.kernels import cpu_linear

KERNELS = ("rowmajor", "onednn", "packed")
DTYPES = [torch.float32] + ([torch.bfloat16] if torch.bfloat16 in cpu_linear.onednn_dtypes() else [])


def error_bound(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The per-element bound above, from the inputs as the kernel saw them (in float64)."""
    x64, w64 = x.double(), w.double()
    s = x64.abs() @ w64.abs().t() + (b.double().abs() if b is not None else 0.0)
    n = x.shape[-1] + 2
    u = 2.0**-24
    bound = (n * u / (1 - n * u)) * s
    if dtype == torch.bfloat16:
        product = x64 @ w64.t()
        y = product + (b.double() if b is not None else 0.0)
        bound = bound + 2.0**-8 * (y.abs() + (x64.abs() @ w64.abs().t()) + 2 * bound)
    return bound + 1e-30  # (an all-zero row's bound is 0: any difference there is a bug)


def exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x.double() @ w.double().t() + (b.double() if b is not None else 0.0)


def within(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    return bool(((got.double() - exact(x, w, b)).abs() <= error_bound(x, w, b, got.dtype)).all())


def case(rows: int, fan_in: int, fan_out: int, bias: bool, seed: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=g).to(dtype)
    w = torch.randn(fan_out, fan_in, generator=g).to(dtype)
    b = torch.randn(fan_out, generator=g).to(dtype) if bias else None
    return x, w, b


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 70), fan_in=st.integers(1, 300), fan_out=st.integers(1, 48), bias=st.booleans(),
       seed=st.integers(0, 2**16))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_each_kernel_is_within_the_float_error_of_the_exact_product(kernel: str, dtype: torch.dtype, rows: int,
                                                                    fan_in: int, fan_out: int, bias: bool,
                                                                    seed: int) -> None:
    x, w, b = case(rows, fan_in, fan_out, bias, seed, dtype)
    assert within(F.linear(x, w, b), x, w, b)  # (the bound holds for what HF runs too)
    with torch.inference_mode():
        got = cpu_linear.small_batch_linear(x, w, b, kernel)
    assert got.shape == (rows, fan_out) and got.dtype == dtype and got.is_contiguous()
    assert within(got, x, w, b)
    cpu_linear.drop_packed([w])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernel_that_drops_or_swaps_a_row_is_outside_the_bound(kernel: str, dtype: torch.dtype) -> None:
    """Controls: the same check catches a row lost (zeros in its place) or two rows swapped."""
    x, w, b = case(6, 96, 24, True, 5, dtype)
    with torch.inference_mode():
        good = cpu_linear.small_batch_linear(x, w, b, kernel)
    dropped = good.clone()
    dropped[3] = 0
    swapped = good[[0, 2, 1, 3, 4, 5]]
    assert within(good, x, w, b)
    assert not within(dropped, x, w, b) and not within(swapped, x, w, b)


@pytest.mark.skipif(not cpu_linear.packing_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_stale_packed_copy_is_outside_the_bound(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight changed in place gets a fresh packed copy (its version moved); the control, a cache
    that ignores the version, multiplies by the old values and fails the same check."""
    x, w, b = case(8, 64, 16, False, 9, dtype)
    with torch.inference_mode():
        cpu_linear.small_batch_linear(x, w, b, "packed")  # packs the current values
    with torch.no_grad():
        w.add_(0.25)
    with torch.inference_mode():
        assert within(cpu_linear.small_batch_linear(x, w, b, "packed"), x, w, b)
    stale = cpu_linear.packed_weight(w)
    with torch.no_grad():
        w.mul_(-1.0)
    monkeypatch.setattr(cpu_linear, "packed_weight", lambda weight: stale)  # the mutant: never repacked
    with torch.inference_mode():
        assert not within(cpu_linear.small_batch_linear(x, w, b, "packed"), x, w, b)
