"""The argmax of the LM head read through an int8 copy of its weights, exact by a bound: an int8
screen rules out every token that cannot be the argmax, and the fp32 head decides among the few
that remain.

Why: a decoding step of a small model on a CPU is bound by memory, and the head is a large share
of what it reads (SmolLM2-135M: 49,152 x 576 fp32 weights, 113 MB of the 540 a one-row step
reads, about 4 ms of a 24 ms step on a 2-core Intel Xeon). Greedy acceptance reads only the
argmax of the rows it walks (:func:`~dynatree.core.verify.greedy_accept`), and an int8 copy is a
quarter of the bytes.

How, for each row ``x`` of final hidden states (fp32, ``d`` wide), with the head ``W`` ``[V, d]``:

1. The head's copy is ``Q`` (int8, one scale ``s_j`` per row: ``W_j ~ s_j Q_j``), made once per
   weights, with ``E_j >= ||W_j - s_j Q_j||``.
2. ``x`` is written in two int8 levels, ``x = s1 q1 + s2 q2 + rho``: ``q1`` quantizes ``x``,
   ``q2`` what ``q1`` leaves.
3. First level: ``torch._int_mm`` (oneDNN's s8 x s8 -> s32 product) computes ``a1 = q1 Q^T``
   exactly, reading ``Q`` once; ``y_j = s_j s1 a1_j``.
4. Every fp32 logit ``z_j`` (HF's head, any summation order) is within ``B_j`` of ``y_j``:
   ``|z_j - y_j| <= ||x|| E_j + ||rho|| (||W_j|| + E_j) + gamma_d ||x|| ||W_j|| + rounding of
   y's fp32 evaluation`` (Cauchy-Schwarz on ``x (W_j - s_j Q_j)`` and ``rho s_j Q_j``; the
   standard bound ``gamma_d = d u / (1 - d u)`` of an fp32 dot product), ``rho = x - s1 q1``. So
   the argmax is among the candidates ``{j : y_j + B_j >= max_k (y_k - B_k)}``.
5. Second level, where the first leaves more than ``FINE_FROM`` candidates: the same on their rows
   alone (a gather of their int8 rows) with ``y_j = s_j (s1 a1_j + s2 a2_j)`` and the smaller
   ``rho = x - s1 q1 - s2 q2``. One level alone is often coarse: the final hidden states of SmolLM2
   have channels 20-50 times the typical one, so ``s1`` is large (288 steps of Spec-Bench prompts:
   a median of 60 candidates after the first level, a tenth of the rows over 1,600; after both,
   a median of 3, at most 196).
6. The fp32 head on the candidates' rows alone picks the argmax, the first one on ties, as
   ``torch.argmax`` over the whole row does.

Exactness: the token is the argmax of fp32 logits computed from the same weights, as far as float
summation order allows (the candidates' logits are computed by a smaller product than the whole
head's; every kernel choice of this project differs from HF's the same way). Where there are more
than ``MAX_CANDIDATES`` candidates the whole row is computed in fp32 instead.

Refused (None: the caller keeps the fp32 head) where the weights are not fp32 on a CPU, the head
has a bias, or the int8 product is not exact on this machine: a self-test at build compares
``torch._int_mm`` with an exact product on inputs at the int8 extremes (a kernel that saturates
16-bit intermediate sums, as int8 kernels without VNNI may, fails it).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch

#: A row whose first level leaves more candidates than this takes the second level on them.
FINE_FROM = 32
#: A row whose screen leaves more candidates than this computes its whole fp32 row instead.
MAX_CANDIDATES = 2048
#: The bound's safety factor (1 + this) and absolute slack, for the fp32 arithmetic that evaluates
#: the bound and the comparison themselves (a few roundings of numbers of the logits' size).
_SLACK_REL, _SLACK_ABS = 1e-3, 1e-4
_ROWS = 8192  # rows of the head converted at a time at build (float64 temporaries stay small)


class ScreenedHead:
    """The int8 copy of a head's weights ``[V, d]`` and what the bound needs of each row."""

    def __init__(self, weight: torch.Tensor) -> None:
        w = weight.detach()
        self.weight = w
        self.vocab, self.dim = w.shape
        d, u = self.dim, 2.0**-24
        scale = torch.empty(self.vocab, dtype=torch.float32)
        q = torch.empty(self.vocab, d, dtype=torch.int8)
        err = torch.empty(self.vocab, dtype=torch.float32)
        norm = torch.empty(self.vocab, dtype=torch.float32)
        loud = torch.empty(self.vocab, dtype=torch.float32)  # about ||Q_j||_1 (the self-test's row)
        # fp32 norms of d terms: within (d + 2) u of their value; rounded up by twice that
        up = 1 + 2 * (d + 4) * u
        for a in range(0, self.vocab, _ROWS):
            rows = w[a : a + _ROWS].float()
            s = (rows.abs().amax(1) / 127).clamp_(min=1e-30)
            qs = torch.round(rows / s[:, None]).clamp_(-127, 127)
            scale[a : a + _ROWS], q[a : a + _ROWS] = s, qs.to(torch.int8)
            # E_j >= ||W_j - s_j Q_j|| exactly: fl(s q) is within u |s q| <= 127 u s of s q, and the
            # subtraction rounds once more
            diff = torch.linalg.vector_norm(rows - qs * s[:, None], dim=1)
            err[a : a + _ROWS] = diff * up * (1 + u) + 1.01 * u * 127 * s * math.sqrt(d)
            norm[a : a + _ROWS] = torch.linalg.vector_norm(rows, dim=1) * up
            loud[a : a + _ROWS] = rows.abs().sum(1) / s
        self.scale, self.q, self.q_t, self.err, self.norm = scale, q, q.t(), err, norm
        self.loudest = int(loud.argmax())
        self._gamma = d * u / (1 - d * u)

    # -------------------------------------------------------------------------------- screen
    @staticmethod
    def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q1, s1, q2, s2): rows ``x`` ``[R, d]`` in two int8 levels (as float tensors of integers),
        ``x ~ s1 q1 + s2 q2``, one scale per row and level."""
        s1 = (x.abs().amax(1, keepdim=True) / 127).clamp_(min=1e-30)
        q1 = torch.round(x / s1).clamp_(-127, 127)
        rest = x - q1 * s1
        s2 = (rest.abs().amax(1, keepdim=True) / 127).clamp_(min=1e-30)
        q2 = torch.round(rest / s2).clamp_(-127, 127)
        return q1, s1, q2, s2

    def _bound(self, x: torch.Tensor, q1: torch.Tensor, s1: torch.Tensor, q2: torch.Tensor | None, s2: torch.Tensor | None,
               rows: torch.Tensor | slice) -> torch.Tensor:
        """``B`` ``[R, len(rows)]`` for the head's ``rows``: every fp32 logit ``z_j`` (any summation
        order) is within ``B_j`` of ``s_j (s1 a1_j + s2 a2_j)`` (``s2 a2`` left out where ``q2`` is
        None), as computed in fp32 by :meth:`coarse` and :meth:`fine`."""
        xd = x.double()
        approx = q1.double() * s1.double() + (0.0 if q2 is None else q2.double() * s2.double())
        rho = torch.linalg.vector_norm(xd - approx, dim=1)
        xn = torch.linalg.vector_norm(xd, dim=1)
        # the fp32 evaluation of y: about 6 roundings of numbers at most (||x||_inf + 127 s2)
        # sqrt(d) (||W_j|| + E_j) in size (the int32 sums convert exactly below 2^24)
        top = x.abs().amax(1).double() + (0.0 if s2 is None else 127 * s2.double().flatten())
        ev = 12 * 2.0**-24 * top * math.sqrt(self.dim) * (2 if 127 * 127 * self.dim >= 1 << 24 else 1)
        alpha = ((xn + rho + ev) * (1 + _SLACK_REL)).float()[:, None]
        beta = ((rho + self._gamma * xn + ev) * (1 + _SLACK_REL)).float()[:, None]
        return (self.err[rows] * alpha).add_(self.norm[rows] * beta).add_(_SLACK_ABS)

    def coarse(self, x: torch.Tensor, q1: torch.Tensor, s1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``y``, ``B``) ``[R, V]`` from the first level alone: ONE int8 product over the whole head
        (a one-row product takes oneDNN's matrix-vector path: 1.6 ms for SmolLM2's head against 2.1
        for two rows, 2-core Intel Xeon, weights not in the cache)."""
        acc = torch._int_mm(q1.to(torch.int8), self.q_t)
        return acc.float().mul_(s1).mul_(self.scale), self._bound(x, q1, s1, None, None, slice(None))

    def fine(self, x: torch.Tensor, q1: torch.Tensor, s1: torch.Tensor, q2: torch.Tensor, s2: torch.Tensor,
             rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``y``, ``B``) ``[1, len(rows)]`` from both levels, for the head's ``rows`` of one row of
        hidden states (the candidates the first level left: a gather of their int8 rows)."""
        acc = torch._int_mm(torch.cat([q1, q2]).to(torch.int8), self.q[rows].t())
        y = (acc[:1].float() * s1).add_(acc[1:].float() * s2).mul_(self.scale[rows])
        return y, self._bound(x, q1, s1, q2, s2, rows)

    def candidates(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per row of ``x`` ``[R, d]`` (fp32, contiguous), the head's rows that the screen cannot
        rule out as the argmax, in increasing order: the first level's, narrowed by the second
        where the first leaves more than ``FINE_FROM``."""
        q1, s1, q2, s2 = self.split(x)
        y, bound = self.coarse(x, q1, s1)
        keep = (y + bound) >= (y - bound).amax(1, keepdim=True)
        out = []
        for i in range(x.shape[0]):
            cand = keep[i].nonzero().flatten()
            if cand.numel() > FINE_FROM:  # (the second level on the first's candidates only)
                r = slice(i, i + 1)
                yc, bc = self.fine(x[r], q1[r], s1[r], q2[r], s2[r], cand)
                cand = cand[((yc + bc) >= (yc - bc).max())[0]]
            out.append(cand)
        return out

    def argmax(self, hidden: torch.Tensor, full: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The argmax over the vocabulary of the fp32 head on each row of ``hidden`` ``[R, d]``
        (LongTensor ``[R]``). ``full(rows)`` returns whole fp32 logit rows, for a row the screen
        leaves too many candidates."""
        x = hidden.reshape(-1, self.dim).float().contiguous()
        out = torch.empty(x.shape[0], dtype=torch.long)
        for i, cand in enumerate(self.candidates(x)):
            if cand.numel() > MAX_CANDIDATES or not cand.numel():  # (none: a row that is not finite)
                out[i] = int(full(x[i : i + 1])[0, : self.vocab].argmax())
            elif cand.numel() == 1:
                out[i] = cand[0]
            else:
                out[i] = cand[int(torch.nn.functional.linear(x[i : i + 1], self.weight[cand]).argmax())]
        return out


def _exact(head: ScreenedHead) -> bool:
    """Whether ``torch._int_mm`` computes this head's products exactly here: rows at the int8
    extremes, signed to make each product of the head's largest row as large as it gets (the
    inputs on which 16-bit intermediate sums would saturate), against an exact product (sums of
    integers below 2^24, exact in fp32)."""
    sign = torch.where(head.q[head.loudest] >= 0, 1, -1).to(torch.int8)
    probe = torch.stack([sign, -sign, torch.ones_like(sign), -torch.ones_like(sign)]) * 127
    try:
        got = torch._int_mm(probe.to(torch.int8), head.q_t)
    except (RuntimeError, AttributeError):
        return False
    if head.dim * 127 >= 1 << 24:
        return False
    unit = probe.float() / 127
    for a in range(0, head.vocab, _ROWS):
        want = (unit @ head.q[a : a + _ROWS].float().t()).long() * 127
        if not torch.equal(got[:, a : a + _ROWS].long(), want):
            return False
    return True


#: The screened copy per head module (weakly: never keeps a model alive), with the stamp of the
#: weights it was made from (storage, in-place version, rows used).
_HEADS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, ScreenedHead | None]]" = weakref.WeakKeyDictionary()


def for_head(head: torch.nn.Module, vocab_size: int) -> ScreenedHead | None:
    """The screened copy of ``head``'s first ``vocab_size`` rows, made once per weights (about
    0.5 s for SmolLM2-135M's head), or None where it does not apply (see the module's doc)."""
    weight = getattr(head, "weight", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or weight is None \
            or weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.shape[0] < vocab_size \
            or not hasattr(torch, "_int_mm"):
        return None
    stamp = (weight.data_ptr(), -1 if weight.is_inference() else weight._version, tuple(weight.shape), vocab_size)
    hit = _HEADS.get(head)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    with torch.inference_mode(False), torch.no_grad():
        screened = ScreenedHead(weight[:vocab_size])
        screened = screened if _exact(screened) else None
    _HEADS[head] = (stamp, screened)
    return screened
