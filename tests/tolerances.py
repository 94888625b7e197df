"""Float tolerances derived from what float32 can promise, for comparisons whose two sides are
computed by different kernels (or in a different order) and so round differently.

``pytest.approx``'s default (relative 1e-6) is about 8 float32 ulps: it holds only while both sides
happen to be summed in the same order, which depends on the CPU (AVX-512 vs AVX2 kernels, MKL vs
oneDNN, the thread count). A tolerance here is a bound, not an observation from one machine.
"""

from __future__ import annotations

import torch

#: float32 unit roundoff (2**-24): the relative error of one rounded operation.
FP32_U = torch.finfo(torch.float32).eps / 2

#: Two forward passes of the same tiny model over the same tokens with different row counts (a
#: tree-masked batch against one row at a time) take different BLAS kernels: each logit is a dot
#: product of ``d`` terms per layer, whose order may differ, so it carries about ``d * u`` absolute
#: error per unit of magnitude per layer (Higham's bound for a length-``d`` dot product). The suite's
#: models have d <= 64 and <= 4 layers with logits of order 1, so logits agree to about
#: 4 * 64 * 6e-8 = 1.5e-5 (``LOGIT_TOL``: a logit compared after one forward, absolute and relative).
#: Observed differences are ~1e-6 (AMD EPYC: 0; Intel Sapphire Rapids: 1.3e-6).
LOGIT_TOL = 4 * 64 * FP32_U


def logit_atol(reference: torch.Tensor) -> float:
    """The absolute bound for logits compared after one forward: ``LOGIT_TOL`` per unit of the
    row's magnitude (its largest logit; at least 1). The dot products' error scales with their
    terms, and the suite's tiny models reach logits of a few units (a 1.75e-5 difference seen on
    logits near 3, on the 2-core EPYC)."""
    return LOGIT_TOL * max(1.0, float(reference.abs().max()))
#: A probability from a softmax of such logits moves by at most ``2 * LOGIT_TOL`` relative (its own
#: logit's error and the normaliser's); a path's probability is a product of ``depth`` of them:
#: :func:`path_rel`. ``KERNEL_REL`` is that bound for the deepest paths the suite builds (~30
#: factors), for checks that do not know their depth.
KERNEL_REL = 1e-3


def path_rel(depth: int) -> float:
    """Relative agreement of a path probability (a product of ``depth`` softmax probabilities)
    computed by two kernels: ``2 * depth * LOGIT_TOL``."""
    return 2 * max(depth, 1) * LOGIT_TOL


def sum_rel(n: int) -> float:
    """Worst-case relative error of a float32 sum of ``n`` non-negative terms in any order
    (Higham, Accuracy and Stability of Numerical Algorithms, eq. 4.4: ``(n - 1) u``)."""
    return max(n - 1, 1) * FP32_U
