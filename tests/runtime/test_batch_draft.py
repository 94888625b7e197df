"""The batch's shared draft cache (``runtime/batch_draft.py``): rows' draft calls gathered into one
forward must compute what each row's own cache computes.

Each row follows a script a model proposer would run: its prompt's prefill, then rounds of pending
committed tokens, two tree levels (nodes seeing only their own ancestors) and a compaction that keeps
some of them. Every step's calls of all rows run through :func:`run_calls` on the shared cache (in
one forward, or alone where the store decides so); each result is compared with the same call on a
single-prompt :class:`CachedModel` of that row. Rows have different lengths, some rows sit steps
out, one call is long enough to run alone, and a row leaves the batch halfway. Mutants of the
gathered inputs (a row seeing its neighbours' columns past its own length, a row's positions off by
one, a padding query seen by a real one) must fail the same comparison.
"""

from __future__ import annotations

import pytest
import torch

import dynatree.runtime.batch_draft as batch_draft
from dynatree.core.proposer import DraftCall, run_calls
from dynatree.errors import DynaTreeError
from dynatree.runtime.batch_draft import BatchDrafts, BatchedDraftKV
from dynatree.runtime.cache import CachedModel
from dynatree.tuning import BATCH_DRAFT_ALONE
from tiny import ARCHS, VOCAB, tiny_model
from tolerances import LOGIT_TOL, logit_atol

ROWS = 4
PROMPTS = (3, 11, 1, 7)


def causal(q: int) -> torch.Tensor:
    return torch.ones(q, q, dtype=torch.bool).tril()


class Row:
    """One row's script, run on its shared-cache handle and, step by step, on its own cache."""

    def __init__(self, kv, own: CachedModel, seed: int) -> None:
        self.kv, self.own = kv, own
        self.g = torch.Generator().manual_seed(seed)
        self.base = 0
        self.level: list[int] = []  # cache rows of the last level's nodes

    def tokens(self, n: int) -> list[int]:
        return torch.randint(1, VOCAB, (n,), generator=self.g).tolist()

    def prefill(self, n: int) -> tuple[DraftCall, DraftCall]:
        t = self.tokens(n)
        return (DraftCall(self.kv, t, torch.arange(n), causal(n), 0, prefill=True),
                DraftCall(self.own, t, torch.arange(n), causal(n), 0, prefill=True))

    def pending(self, p: int) -> tuple[DraftCall, DraftCall]:
        start, t = self.kv.length, self.tokens(p)
        assert start == self.own.length
        self.base = start + p
        args = (t, torch.arange(start, start + p), causal(p), start)
        return DraftCall(self.kv, *args, last_only=True), DraftCall(self.own, *args, last_only=True)

    def tree_level(self, q: int) -> tuple[DraftCall, DraftCall]:
        """``q`` nodes, each a child of one of the previous level's nodes (of the root at first):
        a node sees the pending tokens (before ``base``), its parent's row and itself."""
        n = self.kv.length
        visible = torch.zeros(q, n - self.base + q, dtype=torch.bool)
        for j in range(q):
            visible[j, n - self.base + j] = True
            if self.level:
                visible[j, self.level[j % len(self.level)] - self.base] = True
        depth = 1 + (1 if self.level else 0)
        positions = torch.full((q,), self.base - 1 + depth)
        self.level = list(range(n, n + q))
        args = (self.tokens(q), positions, visible, self.base)
        return DraftCall(self.kv, *args), DraftCall(self.own, *args)

    def compact(self, keep: list[int]) -> None:
        self.kv.compact(self.base, keep)
        self.own.compact(self.base, keep)
        self.level = []


def run_script(arch: str) -> None:
    """The script over ``ROWS`` rows (the comparison is inside: a mismatch raises)."""
    draft = tiny_model(arch, 3)
    drafts = BatchDrafts(ROWS, VOCAB)
    rows = [Row(drafts(draft), CachedModel(draft, VOCAB), seed=b) for b in range(ROWS)]
    store = next(iter(drafts.stores.values()))

    def step(pairs: dict[int, tuple[DraftCall, DraftCall]]) -> None:
        order = list(pairs)
        got = run_calls([pairs[b][0] for b in order])
        for b, g in zip(order, got):
            want = pairs[b][1].run()
            torch.testing.assert_close(g, want, rtol=LOGIT_TOL, atol=logit_atol(want))  # (logits after one forward)
            assert rows[b].kv.length == rows[b].own.length

    step({b: rows[b].prefill(n) for b, n in enumerate(PROMPTS) if b != 2})  # (row 2 prefills later)
    for rnd in range(3):
        live = range(len(rows))
        step({b: rows[b].prefill(PROMPTS[2]) if rnd == 0 and b == 2 else rows[b].pending(1 + (b + rnd) % 3)
              for b in live})
        step({b: rows[b].tree_level(2 + b % 2) for b in live})
        step({b: rows[b].tree_level(3) for b in live if b != 1})  # (row 1 grows one level only)
        for b in live:
            level = rows[b].level
            rows[b].compact([level[0]] if b % 2 else [])
        if rnd == 1:  # row 1 finishes: it leaves the batch
            drafts.keep_rows([0, 2, 3])
            with pytest.raises(DynaTreeError, match="left the batch"):
                rows[1].kv.length
            rows.pop(1)
    # A catch-up call longer than BATCH_DRAFT_ALONE runs alone beside short ones.
    step({b: rows[b].pending(BATCH_DRAFT_ALONE + 5 if b == 0 else 2) for b in range(len(rows))})
    step({b: rows[b].tree_level(2) for b in range(len(rows))})
    assert store.calls < sum(r.kv.calls for r in rows)  # (gathered: fewer forwards than calls)


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_of_a_shared_draft_cache_compute_what_their_own_caches_do(arch: str) -> None:
    run_script(arch)


def _mutant(kind: str):
    real = batch_draft.gathered_inputs

    def broken(lengths, width, rows, calls):
        tokens, positions, allowed = real(lengths, width, rows, calls)
        q_max = tokens.shape[1]
        for b, c in zip(rows, calls):
            s = q_max - len(c.tokens)
            if kind == "holes":  # a row sees every column of the cache, its neighbours' longer rows too
                allowed[b, s:, :width] = True
            elif kind == "position":
                positions[b, s:] += 1
            elif kind == "padding" and s:  # a real query sees a padding query's column
                allowed[b, s:, width] = True
        return tokens, positions, allowed

    return broken


@pytest.mark.parametrize("kind", ["holes", "position", "padding"])
def test_a_broken_gathered_call_is_caught(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_draft, "gathered_inputs", _mutant(kind))
    with pytest.raises(AssertionError, match="not close"):
        run_script("llama")


def test_a_store_refuses_two_calls_of_one_row_and_more_rows_than_it_has() -> None:
    draft = tiny_model("llama", 3)
    store = BatchedDraftKV(draft, VOCAB, 1)
    row = store.row()
    with pytest.raises(DynaTreeError, match="all handed out"):
        store.row()
    call = DraftCall(row, [1], torch.arange(1), causal(1), 0)
    with pytest.raises(DynaTreeError, match="same batch row"):
        store.run([call, call])
