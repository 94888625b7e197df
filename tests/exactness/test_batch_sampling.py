"""Sampled batches: every row's tokens follow the target's distribution given that row's prompt.

The batch's rows (prompts of different lengths, so one is left-padded) are sampled at T = 0.6 with
a seed per row, RUNS times; each row's first POSITIONS tokens are compared with the target's EXACT
marginals for that prompt alone (by enumeration, :func:`test_sampling.exact_marginals`), with the
Pearson chi-square of test_sampling.py: a check fails below ALPHA = 1e-4, so the stated
false-failure probability over the choice of seeds is at most 1e-4 per check, <= 1.2e-3 for the
12 checks here. The same statistic must reject a biased verifier (the residual skipped after a
rejection) run on the same batches. Trees stay within a 2-row batch's share of the verify budget
(``tuning.BATCH_TREE_ROWS // 2`` rows per row).
"""

from __future__ import annotations

import pytest
import torch
from test_sampling import ALPHA, POSITIONS, V, chi_square_pvalue, exact_marginals
from tiny import perturbed, tiny_model

import dynatree
from dynatree.core import verify
from dynatree.core.sampling import SamplingConfig
from dynatree.options import StoppingConfig

ROWS = [[2], [5, 9, 3]]  # row 0 is left-padded to row 1's length
RUNS = 300
T = 0.6
STOP = StoppingConfig(eos_token_id=(), pad_token_id=0)
CASES = [  # tree sampled children (DySpec) and deterministic children (DynaTree), each <= 7 nodes
    ("dyspec", {"max_nodes": 6}),
    ("dynatree", {"max_nodes": 6, "root_branching": True}),
]


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model("llama", 3, vocab=V, layers=1, init=0.3)
    return target, perturbed(target, 0.2, 7)


def row_pvalues(pair, strategy: str, opts: dict) -> list[float]:
    """p-values of every (row, position): RUNS seeded batch calls, row b seeded RUNS * b + run."""
    target, draft = pair
    cfg = SamplingConfig(T)
    width = max(map(len, ROWS))
    counts = torch.zeros(len(ROWS), POSITIONS, V)
    for run in range(RUNS):
        out = dynatree.generate(target, draft, ROWS, strategy, text=False, max_new_tokens=POSITIONS + 1,
                                stopping=STOP, sampling=cfg, seed=[RUNS * b + run for b in range(len(ROWS))],
                                **opts)
        for b in range(len(ROWS)):
            counts[b, torch.arange(POSITIONS), out.sequences[b, width:width + POSITIONS]] += 1
    return [chi_square_pvalue(counts[b, i], exact)[2]
            for b, row in enumerate(ROWS)
            for i, exact in enumerate(exact_marginals(target, cfg, POSITIONS, row))]


@pytest.mark.parametrize("strategy, opts", CASES, ids=[c[0] for c in CASES])
def test_each_row_of_a_sampled_batch_follows_the_target(pair, strategy: str, opts: dict) -> None:
    ps = row_pvalues(pair, strategy, opts)
    assert min(ps) >= ALPHA, f"{strategy}: p-values per (row, position) {ps}"


def test_a_biased_verifier_is_rejected_in_a_batch(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the residual skipped after a rejection (R stays the target distribution) biases
    every row towards drafted tokens; the per-row check above must catch it."""
    monkeypatch.setattr(verify, "residual", lambda r, d, x: r)
    ps = row_pvalues(pair, *CASES[0])
    assert min(ps) < ALPHA, f"biased verifier not detected: p-values {ps}"
