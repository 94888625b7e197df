"""Batches: ``generate`` on ``[B, L]`` left-padded ids + ``attention_mask`` (or a list of prompts).

A batch shares one target forward per round and one cache (``BatchedKV``: per-row positions and
valid-column masks), so what can go wrong is a row seeing another row's columns, a row at the wrong
position, or a row's random stream or stopping depending on its neighbours. Greedy batches must
equal HF's own batched greedy ``generate`` on the same left-padded ids and mask token for token, and
each row must equal a single-prompt run of that row alone, for every architecture, every strategy of
the registry and every kind of draft (a model, the text, both in one tree); sampled rows must equal
the single-prompt run with the row's seed. Mutants of the cache (a row reading another row's valid
columns, a row's position off by one, every row at row 0's position) must be caught by the same
comparison. EOS inside accepted paths makes rows finish at different rounds (finished rows leave
the batch); inputs a batch cannot honour are refused in one line before any model call.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math

import pytest
import torch

import dynatree
import dynatree.loop.batch as batch_loop
from dynatree import STRATEGIES, DynaTreeError, EngineOptions, SamplingConfig, StoppingConfig
from dynatree.core import costmodel
from dynatree.core.stats import BatchStats
from dynatree.drafts.model import ModelProposer
import dynatree.runtime.batch_cache as batch_cache
from dynatree.runtime.batch_cache import BatchedKV
from tiny import ARCHS, SMALL_TREES, VOCAB, hf_greedy, perturbed, tiny_model

OPTIONS = SMALL_TREES
DRAFTS = ("perturbed", "text", "both")  # a draft model, draft=None (the text), TextDraft(model=...)
LENGTHS = (1, 5, 13, 8)
N = 24


@pytest.fixture(autouse=True)
def whole_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here verifies the trees its proposers grow (a flat cost curve: no share cut), so
    the exactness checks exercise deep trees and ragged rows; the share tests set their own costs.
    (Under the CPU's measured costs, tiny models' trees rarely pay and most rounds are plain.)"""
    flat_curve(monkeypatch)


@functools.lru_cache(maxsize=None)
def models(arch: str) -> dict[str, torch.nn.Module]:
    target = tiny_model(arch, 0)
    return {"target": target, "self": target, "perturbed": perturbed(target)}


def draft_for(arch: str, kind: str):
    m = models(arch)
    if kind == "text":
        return None
    if kind == "both":
        return dynatree.TextDraft(model=m["perturbed"])
    return m[kind]


def prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in lengths]


def padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's layout for decoder-only batches: left padding, mask 0 there."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(rows):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    return ids, mask


def stopping(eos=()) -> StoppingConfig:
    return StoppingConfig(eos_token_id=tuple(eos), pad_token_id=0)


@functools.lru_cache(maxsize=None)
def hf_batch(arch: str, lengths: tuple[int, ...], seed: int, n: int, eos: int | None = None) -> torch.Tensor:
    """Reference: HF's own batched greedy generate on the same left-padded ids and mask."""
    ids, mask = padded(prompts(lengths, seed))
    return models(arch)["target"].generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                           pad_token_id=0, min_new_tokens=0, eos_token_id=eos)


def run_batch(arch: str, strategy: str, draft: str, lengths: tuple[int, ...], seed: int, n: int, eos=(), **kw):
    ids, mask = padded(prompts(lengths, seed))
    return dynatree.generate(models(arch)["target"], draft_for(arch, draft), ids, strategy, max_new_tokens=n,
                             attention_mask=mask, stopping=stopping(eos), **OPTIONS.get(strategy, {}), **kw, text=False)


@functools.lru_cache(maxsize=None)
def single(arch: str, strategy: str, draft: str, row: tuple[int, ...], n: int, eos: tuple[int, ...] = ()) -> list[int]:
    """The new tokens of a greedy single-prompt run of ``row`` alone."""
    out = dynatree.generate(models(arch)["target"], draft_for(arch, draft), torch.tensor([row]), strategy,
                            max_new_tokens=n, stopping=stopping(eos), **OPTIONS.get(strategy, {}), text=False)
    return out.sequences[0, len(row):].tolist()


def row_tokens(result, b: int, width: int) -> list[int]:
    """Row ``b``'s new tokens in a batch result (the answers start after the longest prompt)."""
    return result.sequences[b, width: width + result.stats[b].new_tokens].tolist()


def mismatches(arch: str, strategy: str, draft: str, lengths: tuple[int, ...] = LENGTHS, seed: int = 0,
               n: int = N, eos: int | None = None) -> list[str]:
    """Every way a greedy batch differs from HF's batched greedy generate and from single-prompt runs
    of its rows (empty: exact). Shared by the exactness tests and the mutant tests."""
    out = run_batch(arch, strategy, draft, lengths, seed, n, eos=() if eos is None else (eos,))
    ref = hf_batch(arch, lengths, seed, n, eos)
    bad = []
    if out.sequences.shape != ref.shape or not torch.equal(out.sequences, ref):
        bad.append(f"batch != HF batched generate: {out.sequences.tolist()} vs {ref.tolist()}")
    width = max(lengths)
    for b, row in enumerate(prompts(lengths, seed)):
        alone = single(arch, strategy, draft, tuple(row), n, () if eos is None else (eos,))
        if row_tokens(out, b, width) != alone:
            bad.append(f"row {b} != its single-prompt run: {row_tokens(out, b, width)} vs {alone}")
    return bad


# ------------------------------------------------------------------------------ 1. greedy exactness

# Every strategy on llama with every draft; on the other architectures every strategy with one
# draft kind each (rotating, so each arch sees every draft kind and each strategy several kinds).
CASES = [("llama", s, d) for s in sorted(STRATEGIES) for d in DRAFTS] + [
    (arch, s, DRAFTS[(i + j) % len(DRAFTS)])
    for j, arch in enumerate(a for a in ARCHS if a != "llama")
    for i, s in enumerate(sorted(STRATEGIES))
]


def test_cases_cover_every_arch_strategy_and_draft() -> None:
    assert {a for a, _, _ in CASES} == set(ARCHS)
    assert {s for _, s, _ in CASES} == set(STRATEGIES)
    for arch in ARCHS:
        assert {d for a, _, d in CASES if a == arch} == set(DRAFTS), arch


@pytest.mark.parametrize(("arch", "strategy", "draft"), CASES)
def test_greedy_batch_equals_hf_batch_and_single_runs(arch: str, strategy: str, draft: str) -> None:
    assert mismatches(arch, strategy, draft) == []


def test_a_greedy_batch_reads_its_argmaxes_through_the_screened_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU default: each round's likely chains get their argmaxes from the screened head in one
    call for the batch (counted at the batch's own call), and the batch stays exact."""
    screened: list[bool] = []
    real = batch_loop.batch_lazy_logits

    def spy(hidden, trees, head, vocab, argmax=None):
        screened.append(argmax is not None)
        return real(hidden, trees, head, vocab, argmax)

    monkeypatch.setattr(batch_loop, "batch_lazy_logits", spy)
    assert mismatches("llama", "dynatree", "perturbed") == []
    assert screened and all(screened)


def test_batch_rows_really_speculate() -> None:
    """Guards the setup: with a draft model the rows commit several tokens per round (deep trees are
    verified, not plain steps), and not in lockstep."""
    for arch in ARCHS:
        s = run_batch(arch, "dynatree", "perturbed", LENGTHS, 0, N).stats
        assert s.mean_committed > 1.3, (arch, s.summary())
        assert len({r.num_rounds for r in s}) > 1, arch


# ---------------------------------------------------------------------------- 2. EOS, ragged finish


def flat_curve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify cost that does not grow with the rows: a greedy batch keeps every row's whole tree."""
    monkeypatch.setattr(batch_loop, "BATCH_SHARE_COST", {"cpu": {128: ((1, 2), (1.0, 1.0))}})


def round_ends(stats) -> set[int]:
    ends, total = set(), 0
    for r in stats.rounds:
        total += r.committed
        ends.add(total)
    return ends


def eos_case(arch: str, strategy: str, lengths: tuple[int, ...], seed: int, n: int) -> tuple[int, list[int]]:
    """An EOS token the reference emits early in some row, strictly inside one of that row's accepted
    paths (not the last token of a round, with the target as its own draft), and a token no earlier
    in that row; returns it and each row's expected new-token count (HF's: through the first EOS)."""
    ref = hf_batch(arch, lengths, seed, n)[:, max(lengths):].tolist()
    full = run_batch(arch, strategy, "self", lengths, seed, n)
    for b, new in enumerate(ref):
        ends = round_ends(full.stats[b])
        for i in range(2, n // 2):
            if (i + 1) in ends or new[i] in new[:i]:
                continue
            counts = [row.index(new[i]) + 1 if new[i] in row else n for row in ref]
            if len(set(counts)) > 1:
                return new[i], counts
    raise AssertionError("no EOS candidate: the setup no longer exercises EOS inside a path")


# every strategy on Llama, DynaTree and DySpec on every architecture (the suite's time: the full
# cross product took 21 s and added no code path)
EOS_CASES = [("llama", s) for s in ("linear", "fixed", "dynatree", "dyspec")] + [
    (a, s) for a in ARCHS if a != "llama" for s in ("dynatree", "dyspec")]


@pytest.mark.parametrize("arch, strategy", EOS_CASES)
def test_eos_inside_tree_rows_finish_at_different_rounds(arch: str, strategy: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # (trees as a single prompt's: on a flat cost curve the batch's share cuts no tree below an
    # accepted EOS)
    flat_curve(monkeypatch)
    lengths, seed, n = (4, 9, 1, 6), 3, 32
    eos, counts = eos_case(arch, strategy, lengths, seed, n)
    for draft in ("self", "perturbed"):
        out = run_batch(arch, strategy, draft, lengths, seed, n, eos=(eos,))
        assert torch.equal(out.sequences, hf_batch(arch, lengths, seed, n, eos)), (draft, eos)
        assert [s.new_tokens for s in out.stats] == counts, draft
        rounds = [s.num_rounds for s in out.stats]
        assert len(set(rounds)) > 1, rounds
        if draft == "self":  # some row's EOS is a drafted node its round accepted (not the bonus token)
            last = [out.stats[b].rounds[-1] for b, c in enumerate(counts) if c < n]
            assert any(r.accepted == r.committed > 1 for r in last), last
        for b, c in enumerate(counts):
            if c < n:
                assert out.sequences[b, max(lengths) + c - 1].item() == eos
                assert (out.sequences[b, max(lengths) + c:] == 0).all()  # right-padded with the pad token
    assert mismatches(arch, strategy, "perturbed", lengths, seed, n, eos) == []


# ----------------------------------------------------------------------------------- 3. input forms


@contextlib.contextmanager
def no_model_calls(*models: torch.nn.Module):
    """Records every forward of any module of ``models`` (a lazy head calls the base model, not the
    top module, so every submodule is hooked)."""
    calls = []
    hooks = [sub.register_forward_pre_hook(lambda mod, args: calls.append(type(mod).__name__))
             for m in models for sub in m.modules()]
    try:
        yield calls
    finally:
        for h in hooks:
            h.remove()


def test_ragged_list_equals_padded_tensor() -> None:
    m = models("llama")
    rows = prompts(LENGTHS, 4)
    ids, mask = padded(rows)
    a = dynatree.generate(m["target"], m["perturbed"], rows, "dynatree", max_new_tokens=N, stopping=stopping(),
                          **OPTIONS["dynatree"], text=False)
    b = dynatree.generate(m["target"], m["perturbed"], ids, "dynatree", max_new_tokens=N, attention_mask=mask,
                          stopping=stopping(), **OPTIONS["dynatree"], text=False)
    assert torch.equal(a.sequences, b.sequences)
    assert [s.new_tokens for s in a.stats] == [N] * len(rows)


def test_padding_content_is_never_seen_and_returned_as_given() -> None:
    """Junk under mask 0 changes nothing (HF's contract), and the prompts come back as given."""
    m = models("llama")
    rows = prompts(LENGTHS, 5)
    ids, mask = padded(rows)
    junk = torch.where(mask.bool(), ids, torch.randint(2, VOCAB, ids.shape, generator=torch.Generator().manual_seed(9)))
    clean = dynatree.generate(m["target"], m["perturbed"], ids, "fixed", max_new_tokens=N, attention_mask=mask,
                              stopping=stopping(), **OPTIONS["fixed"], text=False)
    dirty = dynatree.generate(m["target"], m["perturbed"], junk, "fixed", max_new_tokens=N, attention_mask=mask,
                              stopping=stopping(), **OPTIONS["fixed"], text=False)
    width = ids.shape[1]
    assert torch.equal(dirty.sequences[:, :width], junk)
    assert torch.equal(dirty.sequences[:, width:], clean.sequences[:, width:])
    hf = m["target"].generate(junk, attention_mask=mask, do_sample=False, max_new_tokens=N, pad_token_id=0,
                              min_new_tokens=0, eos_token_id=None)
    assert torch.equal(dirty.sequences, hf)


def test_pad_token_of_a_list_batch() -> None:
    """A list of prompts is left-padded, and finished answers right-padded, with stopping.pad_token_id."""
    m = models("llama")
    rows = prompts((3, 7), 6)
    ref = [hf_greedy(m["target"], torch.tensor([p]), 12)[0, len(p):].tolist() for p in rows]
    eos = ref[0][4]
    cut = [r[: r.index(eos) + 1] if eos in r else r for r in ref]
    out = dynatree.generate(m["target"], m["perturbed"], rows, "linear", max_new_tokens=12, k=3,
                            stopping=StoppingConfig(eos_token_id=(eos,), pad_token_id=77), text=False)
    longest = max(map(len, cut))
    assert min(map(len, cut)) < longest  # the setup: one answer is right-padded
    for b, (p, new) in enumerate(zip(rows, cut)):
        want = [77] * (7 - len(p)) + p + new + [77] * (longest - len(new))
        assert out.sequences[b].tolist() == want, b


@pytest.mark.parametrize("case", ["right_padded", "wrong_shape", "all_zero_row", "mask_with_list"])
def test_bad_masks_are_refused_before_any_model_call(case: str) -> None:
    m = models("llama")
    ids, mask = padded(prompts((3, 6, 4), 7))
    if case == "right_padded":
        mask = mask.flip(1)  # ones first, then zeros
    elif case == "wrong_shape":
        mask = mask[:, 1:]
    elif case == "all_zero_row":
        mask[1] = 0
    inputs = [r.tolist() for r in ids] if case == "mask_with_list" else ids
    if case == "mask_with_list":
        inputs[0] = inputs[0][2:]  # ragged
    with no_model_calls(m["target"], m["perturbed"]) as calls, pytest.raises(DynaTreeError) as err:
        dynatree.generate(m["target"], m["perturbed"], inputs, "linear", max_new_tokens=8, attention_mask=mask,
                          stopping=stopping(), k=3, text=False)
    assert calls == []
    assert "\n" not in str(err.value) and str(err.value)


@pytest.mark.parametrize("setting", [
    {"options": EngineOptions(kv_window=16)},
    {"options": EngineOptions(engine="static")},
    {"on_round": lambda event: None},
])
def test_unsupported_settings_are_refused(setting: dict) -> None:
    m = models("llama")
    ids, mask = padded(prompts((3, 6), 8))
    with no_model_calls(m["target"], m["perturbed"]) as calls, pytest.raises(DynaTreeError) as err:
        dynatree.generate(m["target"], m["perturbed"], ids, "linear", max_new_tokens=8, attention_mask=mask,
                          stopping=stopping(), k=3, **setting, text=False)
    assert calls == []
    assert str(err.value).startswith("batches do not support"), str(err.value)
    assert "\n" not in str(err.value)


def test_a_sliding_window_draft_model_is_refused_for_batches() -> None:
    """A batch's draft caches share one HF cache (runtime/batch_draft.py), full attention only."""
    from tiny import window_model

    target, draft = models("llama")["target"], window_model("mistral", 0)
    with no_model_calls(target) as calls, no_model_calls(draft) as draft_calls, pytest.raises(DynaTreeError) as err:
        dynatree.generate(target, draft, [[5, 6, 7], [8, 9]], max_new_tokens=4, stopping=stopping(), text=False)
    assert calls == [] and draft_calls == []
    assert "sliding-window attention: a batch's draft model needs full attention" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_sliding_window_target_is_refused_for_batches() -> None:
    from tiny import window_model

    target = window_model("mistral", 0)
    with no_model_calls(target) as calls, pytest.raises(DynaTreeError) as err:
        dynatree.generate(target, None, [[5, 6, 7], [8, 9]], max_new_tokens=4, stopping=stopping())
    assert calls == []
    assert "sliding-window attention: batches need a full-attention target" in str(err.value)
    assert "\n" not in str(err.value)


# -------------------------------------------------------------------------------------- 4. mutants


def roll_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: in the verify forward, row b sees row b-1's valid columns (row 1 reads row 0's)."""
    real = BatchedKV.verify

    def verify(self, *args, **kwargs):
        valid = self.valid
        self.valid = valid.roll(1, dims=0)
        try:
            return real(self, *args, **kwargs)
        finally:
            self.valid = valid

    monkeypatch.setattr(BatchedKV, "verify", verify)


def pos_one_too_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: every commit moves the last running row's position one too far."""
    real = BatchedKV.commit

    def commit(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.pos[-1] += 1

    monkeypatch.setattr(BatchedKV, "commit", commit)


def shared_pos(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: every row takes row 0's position after a commit."""
    real = BatchedKV.commit

    def commit(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.pos = self.pos[:1].expand_as(self.pos).clone()

    monkeypatch.setattr(BatchedKV, "commit", commit)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # RoPE and learned positions
@pytest.mark.parametrize("mutant", [roll_valid, pos_one_too_far, shared_pos])
def test_exactness_check_catches_mutant(arch: str, mutant, monkeypatch: pytest.MonkeyPatch) -> None:
    assert mismatches(arch, "dynatree", "perturbed") == []  # the same case passes unmutated
    mutant(monkeypatch)
    assert mismatches(arch, "dynatree", "perturbed") != []


def test_prompts_prefilled_one_by_one_give_the_same_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the prompts prefilled one at a time, unpadded (forced: the tiny prompts' padding is
    under the threshold), every architecture's batch still equals HF's batched greedy and each row
    alone; a mutant that writes each row's prompt into its neighbour's row is caught."""
    monkeypatch.setattr(batch_cache, "BATCH_PREFILL_ROW_PADDING", -1)
    real, seen = BatchedKV._prefill_rows, []

    def spy(self, rows, width):
        seen.append(len(rows))
        return real(self, rows, width)

    monkeypatch.setattr(BatchedKV, "_prefill_rows", spy)
    for arch in ARCHS:
        assert mismatches(arch, "dynatree", "perturbed") == [], arch
    assert len(seen) >= len(ARCHS)
    monkeypatch.setattr(BatchedKV, "_prefill_rows", lambda self, rows, width: real(self, rows[1:] + rows[:1], width))
    assert mismatches("llama", "dynatree", "perturbed") != []


def test_when_prompts_are_prefilled_one_by_one() -> None:
    """One by one on CPU once the padding a batched call would compute passes the threshold per
    row, or the longest prompt the length threshold; never for one row or on a GPU (where rows run
    in parallel)."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    pad, long = batch_cache.BATCH_PREFILL_ROW_PADDING, batch_cache.BATCH_PREFILL_ROW_LENGTH
    short = long - 1
    assert not batch_cache.ragged_prefill_applies(cpu, [short, short, short])
    assert not batch_cache.ragged_prefill_applies(cpu, [short, short - pad])  # (pad / 2 per row)
    assert batch_cache.ragged_prefill_applies(cpu, [short, short - 2 * pad - 2])
    assert batch_cache.ragged_prefill_applies(cpu, [long, long])
    assert not batch_cache.ragged_prefill_applies(cuda, [2000, 10])
    assert not batch_cache.ragged_prefill_applies(cpu, [2000])


# ------------------------------------------------------------------------------------- 5. sampling

SAMPLED = SamplingConfig(temperature=1.0)
# The rows of a batch share a verify budget: a sampled row's tree is capped at BATCH_TREE_ROWS //
# (the batch's rows), which a single-prompt run does not do. A sampled row's draws follow its tree,
# so the contract below (a row equals its single-prompt run) holds for trees inside the budget of
# the widest batch here (4 rows: root + max_nodes rows each);
# test_a_sampled_row_with_a_capped_tree_does_not_depend_on_its_neighbours covers trees beyond it.
ROW_BUDGET = dynatree.tuning.BATCH_TREE_ROWS // 4 - 1
SAMPLED_TREES = {s: {k: min(v, ROW_BUDGET) if k in ("max_nodes", "k") else v for k, v in o.items()}
                 for s, o in OPTIONS.items()}


def sample_batch(arch: str, strategy: str, draft: str, rows: list[list[int]], seed, n: int, trees=SAMPLED_TREES):
    return dynatree.generate(models(arch)["target"], draft_for(arch, draft), rows, strategy, max_new_tokens=n,
                             sampling=SAMPLED, seed=seed, stopping=stopping(), **trees.get(strategy, {}), text=False)


def sample_single(arch: str, strategy: str, draft: str, row: list[int], seed: int, n: int, trees=SAMPLED_TREES):
    out = dynatree.generate(models(arch)["target"], draft_for(arch, draft), torch.tensor([row]), strategy,
                            max_new_tokens=n, sampling=SAMPLED, seed=seed, stopping=stopping(),
                            **trees.get(strategy, {}), text=False)
    return out.sequences[0, len(row):].tolist()


@pytest.mark.parametrize("strategy", ["linear", "dynatree", "dyspec"])
@pytest.mark.parametrize("draft", ["perturbed", "text"])
def test_sampled_rows_equal_single_runs_with_their_seeds(strategy: str, draft: str) -> None:
    n, seeds = 20, [11, 12, 13]
    rows = prompts((4, 9, 1), 10)
    out = sample_batch("llama", strategy, draft, rows, seeds, n)
    width = max(map(len, rows))
    got = [row_tokens(out, b, width) for b in range(len(rows))]
    for b, (row, s) in enumerate(zip(rows, seeds)):
        assert got[b] == sample_single("llama", strategy, draft, row, s, n), b
    assert len({tuple(g) for g in got}) == len(got)
    assert any(g != single("llama", strategy, draft, tuple(row), n) for g, row in zip(got, rows)), "not sampled"
    # the same row with the same seed, among other rows at another index: the same tokens
    others = prompts((6, 2, 11), 20)
    batch = [others[0], others[1], rows[1], others[2]]
    mixed = sample_batch("llama", strategy, draft, batch, [5, 6, 12, 7], n)
    assert row_tokens(mixed, 2, max(map(len, batch))) == got[1]
    # seed=s: row b draws as a single run with seed s + b
    base = sample_batch("llama", strategy, draft, rows, 11, n)
    assert [row_tokens(base, b, width) for b in range(len(rows))] == got


def test_a_sampled_row_with_a_capped_tree_does_not_depend_on_its_neighbours() -> None:
    """DySpec with a node budget above a 3-row batch's share of the verify budget: the row's trees
    are cut to the share (so it is not a single-prompt run), but the share is fixed by the batch's
    size, so the row's output stays the same when its neighbours stop early (an EOS token only they
    emit). A share that followed the rows still running made it depend on when they finish."""
    trees = {"dyspec": {"max_nodes": dynatree.tuning.BATCH_TREE_ROWS // 3 + 3}}
    rows, seeds = prompts((9, 4, 6), 10), [12, 40, 41]
    plain = sample_batch("llama", "dyspec", "perturbed", rows, seeds, 20, trees)
    width = max(map(len, rows))
    mine = row_tokens(plain, 0, width)
    early = [t for t in row_tokens(plain, 1, width)[:6] + row_tokens(plain, 2, width)[:6] if t not in mine]
    assert early, "no neighbour token the row never emits: pick other prompts"
    stopped = dynatree.generate(models("llama")["target"], draft_for("llama", "perturbed"), rows, "dyspec",
                                max_new_tokens=20, sampling=SAMPLED, seed=seeds,
                                stopping=dynatree.StoppingConfig(eos_token_id=early[0], pad_token_id=0),
                                **trees["dyspec"], text=False)
    assert [r.active for r in stopped.stats.rounds][-1] < 3  # a neighbour did stop early
    assert row_tokens(stopped, 0, width) == mine


def test_sampled_rows_use_their_own_streams() -> None:
    """Guards the sampling test: another seed for a row changes that row's tokens only."""
    rows = prompts((4, 9, 1), 10)
    a = sample_batch("llama", "dynatree", "perturbed", rows, [11, 12, 13], 20)
    b = sample_batch("llama", "dynatree", "perturbed", rows, [11, 99, 13], 20)
    w = max(map(len, rows))
    assert row_tokens(a, 0, w) == row_tokens(b, 0, w) and row_tokens(a, 2, w) == row_tokens(b, 2, w)
    assert row_tokens(a, 1, w) != row_tokens(b, 1, w)


# ----------------------------------------------------------------------------------- 6. BatchStats


@pytest.mark.parametrize("arch", ["llama", "neox"])
def test_batch_stats(arch: str) -> None:
    lengths, seed, n = (4, 9, 1, 6), 3, 32
    eos, counts = eos_case(arch, "dynatree", lengths, seed, n)
    out = run_batch(arch, "dynatree", "perturbed", lengths, seed, n, eos=(eos,))
    stats = out.stats
    assert isinstance(stats, BatchStats) and len(stats) == len(lengths)
    assert [s.new_tokens for s in stats] == counts
    assert stats.new_tokens == sum(s.new_tokens for s in stats) == sum(counts)
    for s in stats:
        assert s.new_tokens == sum(r.committed for r in s.rounds)
    active = [r.active for r in stats.rounds]
    assert active[0] == len(lengths) and active[-1] >= 1
    assert all(a >= b for a, b in itertools.pairwise(active)), active
    assert len(set(active)) > 1, active  # rows finished at different rounds
    # a row takes part in exactly the rounds it was active in; the batch's commits are the rows'
    assert sum(active) == sum(s.num_rounds for s in stats)
    assert sum(r.committed for r in stats.rounds) == stats.new_tokens
    assert stats.num_rounds == max(s.num_rounds for s in stats)
    assert all(r.verified_rows >= r.active and r.t_realign >= 0 for r in stats.rounds)


# --------------------------------------------------------------------------- 7. the verify share


def share_costs(monkeypatch: pytest.MonkeyPatch, tables: dict[int, tuple[tuple[int, ...], tuple[float, ...]]]) -> None:
    """The cost of each share (rows per row) relative to a plain step, per batch size."""
    monkeypatch.setattr(batch_loop, "BATCH_SHARE_COST", {"cpu": tables})


def drafted(result) -> list[int]:
    return [r.drafted for s in result.stats for r in s.rounds]


EIGHT = (4, 9, 1, 6, 3, 7, 2, 5)


def test_a_greedy_share_follows_the_cost_curve_and_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy: one share per round from the cost of each share at the batch's size. Where a second
    row per row is free at 4 rows and a third costs 100 steps, 4 rows draft trees of at most 2 rows
    each; where a second row per row costs 100 steps at 8 rows, 8 rows decode plain. On a flat
    curve the trees are the proposers' own; where every row costs a step, no tree can pay and
    every round is plain. Every variant is exact."""
    flat_curve(monkeypatch)
    whole = run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16)
    assert max(drafted(whole)) > 2  # (the setup: trees wider than the cut below)

    share_costs(monkeypatch, {4: ((1, 2, 3), (1.0, 1.0, 100.0)), 8: ((1, 2), (1.0, 100.0))})
    four = run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16)
    assert max(drafted(four)) == 1
    assert all(r.verified_rows <= 8 for r in four.stats.rounds)
    eight = run_batch("llama", "dynatree", "perturbed", EIGHT, 3, 16)
    assert max(drafted(eight)) == 0 and eight.stats.rounds[0].verified_rows == 8
    assert mismatches("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16) == []
    assert mismatches("llama", "dynatree", "perturbed", EIGHT, 3, 16) == []

    share_costs(monkeypatch, {128: ((1, 2), (1.0, 2.0))})  # every verify row costs a whole step
    assert max(drafted(run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16))) == 0


def test_the_share_weighs_each_rows_calibrated_gains(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft that is sure of itself and always wrong: its path probabilities say each node is
    accepted (about 0.99 each), the target takes none. A row's calibration (accepted over expected
    nodes of its recent trees, on a prior that counts a fresh row's probabilities at a third)
    keeps its gains low, so the batch decodes plain but for a few probes, on a curve where 2 rows
    per row cost 60% more than a plain step (4 rows per row: 180% more). Without the calibration
    (the mutant) the batch keeps paying for trees."""
    share_costs(monkeypatch, {4: ((1, 2, 4), (1.0, 1.6, 2.8))})
    sure = tiny_model("llama", 7, init=1.0)
    with torch.no_grad():
        sure.lm_head.weight.mul_(10.0)  # peaked, and unrelated to the target
    ids, mask = padded(prompts((4, 9, 1, 6), 5))

    def verified_rows() -> list[int]:
        out = dynatree.generate(models("llama")["target"], sure, ids, "linear", k=3, max_new_tokens=24,
                                attention_mask=mask, stopping=stopping(), text=False, backoff=False)
        assert torch.equal(out.sequences, hf_batch("llama", (4, 9, 1, 6), 5, 24))
        return [r.verified_rows for r in out.stats.rounds]

    calibrated = verified_rows()  # plain steps, at most a few probes of 2 rows per row
    assert max(calibrated) <= 8 and calibrated.count(4) >= 0.75 * len(calibrated), calibrated
    monkeypatch.setattr(batch_loop._Row, "rate", property(lambda self: 1.0))
    mutant = verified_rows()
    assert sum(v > 8 for v in mutant[1:]) > len(mutant) // 2, mutant


def test_a_rows_weight_follows_its_remaining_rounds_and_the_devices_row_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's remaining rounds are its tokens still to write at its pace so far; its weight comes
    from them and the part of a plain step each row costs on the device (``BATCH_ROW_COST``: on
    CPU about a tenth of a one-row step per row, so about 30% of a 4-row step is per row; CUDA:
    1%, 4%)."""
    row = batch_loop._Row([1, 2], None, torch.Generator(), dynatree.core.stats.GenerationStats(strategy="linear", prompt_tokens=2))
    assert row.remaining_rounds(50) == 50.0
    row.out = list(range(10))
    row.stats.rounds = [None] * 4  # (10 tokens in 4 rounds)
    assert row.remaining_rounds(50) == pytest.approx(40 * 5 / 11)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert batch_loop.row_weights(cpu, [7.0]) == [1.0]
    assert batch_loop.row_weights(cpu, [30.0] * 4) == pytest.approx([1.0] * 4)
    r = batch_loop.BATCH_ROW_COST["cpu"]
    share = 4 * r / (1 + r * 3)
    assert batch_loop.row_weights(cpu, [900.0, 10.0, 10.0, 10.0]) == pytest.approx([share + (1 - share) * 4] + [share] * 3)
    assert batch_loop.row_weights(cuda, [900.0, 10.0, 10.0, 10.0])[1] == pytest.approx(4 * 0.01 / 1.03)
    # The spread grows with the rounds left: 4 rounds apart weigh little early, much near the end.
    early, late = batch_loop.row_weights(cpu, [90.0, 86.0]), batch_loop.row_weights(cpu, [6.0, 2.0])
    assert early[0] - early[1] < 0.5 * (late[0] - late[1])
    monkeypatch.setattr(batch_loop, "BATCH_ROW_COST", {"cpu": 1.0})  # (a step is its rows, nothing else)
    assert batch_loop.row_weights(cpu, [90.0, 10.0]) == pytest.approx([1.0, 1.0])


def test_the_share_is_chosen_with_the_rows_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop hands choose_share the weights of its running rows' remaining rounds, before the
    rows draft (whether any tree could pay) and after (the cut)."""
    flat_curve(monkeypatch)
    seen, weights = [], []
    real_share, real_weights = batch_loop.choose_share, batch_loop.row_weights

    def spy_weights(device, remaining):
        weights.append(real_weights(device, remaining))
        return weights[-1]

    monkeypatch.setattr(batch_loop, "row_weights", spy_weights)
    monkeypatch.setattr(batch_loop, "choose_share", lambda *a, **kw: seen.append(kw.get("weights")) or real_share(*a, **kw))
    run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16)
    assert seen and all(any(w is x for x in weights) for w in seen)
    assert weights[0] == pytest.approx([1.0] * 4)  # (a fresh batch: every row tied)
    assert any(max(w) - min(w) > 0.1 for w in weights)  # (rows that accepted more fell behind in weight)


def test_a_sampled_share_is_fixed_by_the_batch_size() -> None:
    """Sampled: each row's tree gets BATCH_TREE_ROWS // rows verify rows for the whole run: 4 rows
    draft trees of at most that size; 8 rows get a share under BATCH_MIN_SHARE and decode plain."""
    share = dynatree.tuning.BATCH_TREE_ROWS // 4
    assert share >= dynatree.tuning.BATCH_MIN_SHARE > dynatree.tuning.BATCH_TREE_ROWS // 8  # (the setup)
    trees = {"dynatree": {"max_nodes": 2 * share, "tau": 0.0}}
    four = sample_batch("llama", "dynatree", "perturbed", prompts((4, 9, 1, 6), 3), 3, 16, trees)
    assert max(drafted(four)) == share - 1  # root + drafted nodes fill the share
    eight = sample_batch("llama", "dynatree", "perturbed", prompts(EIGHT, 3), 3, 16, trees)
    assert max(drafted(eight)) == 0


def test_a_batch_takes_the_share_costs_of_the_next_tabulated_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of 3 rows pays what 4 rows do (a wider batch's shares cost relatively more: the
    error leans toward plain steps); past the largest table, the largest; an unknown device, the
    CPU's. The cost is over the forward's total rows: rows x share."""
    share_costs(monkeypatch, {2: ((1, 2), (1.0, 1.2)), 4: ((1, 2), (1.0, 1.5))})
    cpu = torch.device("cpu")
    assert batch_loop.share_cost(cpu, 2)[0].cost(4) == pytest.approx(1.2)
    assert batch_loop.share_cost(cpu, 3)[0].cost(6) == pytest.approx(1.5)
    assert batch_loop.share_cost(cpu, 9)[0].cost(18) == pytest.approx(1.5)
    assert batch_loop.share_cost(torch.device("meta"), 2)[0].cost(4) == pytest.approx(1.2)
    assert batch_loop.share_cost(cpu, 2)[1] == dynatree.tuning.BATCH_MAX_ROWS["cpu"]


def test_the_cut_pause_schedule() -> None:
    """Drafting that bought nothing and cost more than ``material`` of the verify pauses 1, 2, 4
    ... rounds up to ``longest``; a round that keeps a tree resets the length; cheap drafting
    (a text lookup) never pauses."""
    pause = batch_loop.CutPause(material=0.1, longest=4)
    lengths = []
    for _ in range(4):
        pause.observe(False, t_draft=0.5, t_verify=1.0)
        lengths.append(pause.left)
        while pause.take():
            pass
    assert lengths == [1, 2, 4, 4] and pause.paused == 11
    pause.observe(True, t_draft=0.5, t_verify=1.0)
    pause.observe(False, t_draft=0.5, t_verify=1.0)
    assert pause.left == 1
    assert pause.take() and not pause.take()
    pause.observe(False, t_draft=0.1, t_verify=1.0)  # (not more than material)
    assert pause.left == 0 and not pause.take()


@pytest.mark.parametrize("material", [0.0, math.inf])
def test_a_batch_pauses_drafting_whose_trees_are_all_cut(material: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft with a flat distribution (each node's probability 1 / vocabulary), on a curve where
    a second row per row costs 20% more than a plain step: the prior lets the rows draft (a third
    of a token per node would pay), their trees' own gains do not, and every tree is cut to its
    root. Where drafting counts as material (``material=0``, the back-off on) the draft model runs
    in a few rounds only, on the 1, 2, 4 ... schedule; where it never does (``material=inf``), in
    every round. Both exact."""
    share_costs(monkeypatch, {4: ((1, 2, 4), (1.0, 1.2, 1.5))})
    monkeypatch.setattr(batch_loop, "BATCH_PAUSE_MATERIAL", material)
    flat = tiny_model("llama", 7)
    with torch.no_grad():
        flat.lm_head.weight.zero_()
    calls = []
    begin = ModelProposer._begin  # (a round's first draft steps: the rows' rounds that draft)
    monkeypatch.setattr(ModelProposer, "_begin", lambda self, b: calls.append(1) or begin(self, b))
    ids, mask = padded(prompts((4, 9, 1, 6), 5))
    out = dynatree.generate(models("llama")["target"], flat, ids, "linear", k=3, max_new_tokens=24,
                            attention_mask=mask, stopping=stopping(), text=False,
                            backoff=dynatree.Backoff(margin=1e-9, probe_plain=1))  # (its rate pause: never)
    assert torch.equal(out.sequences, hf_batch("llama", (4, 9, 1, 6), 5, 24))
    assert max(drafted(out)) == 0  # (the setup: every tree cut)
    rounds = out.stats.num_rounds
    if material == 0.0:
        assert 0 < len(calls) <= 4 * 5, len(calls)  # 4 rows, in rounds 1, 3, 6, 11, 20 at most
    else:
        assert len(calls) >= 4 * (rounds - 2), (len(calls), rounds)  # (every round but the back-off's probe)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batch_runs_the_few_row_kernels_and_equals_hf_batched_greedy(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the few-row linear kernels on (``cpu_linear=True``, the layout a measured plan picks on
    an AMD EPYC), the target's batched verify calls and its LM head run them, by the call's total
    rows (batch rows x share), and every row of every strategy still equals HF's batched greedy.
    (A batch that ran F.linear while the single-prompt path ran the plan made a B = 2 step on the
    EPYC cost 94 ms against 57 ms.)"""
    import dynatree.runtime.kernels.cpu_linear as cpu_linear
    from dynatree.options import fixed_plan

    target = models(arch)["target"]
    head = target.get_output_embeddings().weight
    body = {id(p) for p in target.parameters()} - {id(head)}
    linear_body = any(isinstance(m, torch.nn.Linear) and id(m.weight) in body for m in target.modules())
    calls: list[tuple[str, int]] = []
    real = cpu_linear.small_batch_linear

    def counted(x, weight, bias=None, kernel="rowmajor"):
        kind = "head" if weight is head else "body" if id(weight) in body else "draft"
        calls.append((kind, x.numel() // x.shape[-1]))
        return real(x, weight, bias, kernel=kernel)

    monkeypatch.setattr(cpu_linear, "small_batch_linear", counted)
    ref = hf_batch(arch, LENGTHS, 0, N)
    for strategy in sorted(STRATEGIES):
        draft = "text" if strategy == "autoregressive" else "perturbed"
        calls.clear()
        # (the fp32 head on the rows read: the screened head reads the head's rows only where its
        #  int8 screen cannot decide; test_a_greedy_batch_reads_its_argmaxes_through_the_screened_head)
        out = run_batch(arch, strategy, draft, LENGTHS, 0, N, options=EngineOptions(cpu_linear=True, screened_head=False))
        assert torch.equal(out.sequences, ref), strategy
        # (every verify call within the plan's rows; GPT-2's layers are Conv1D, no F.linear)
        verified = {r.verified_rows for r in out.stats.rounds if r.verified_rows <= fixed_plan().max_rows}
        if linear_body:
            assert verified and verified <= {rows for kind, rows in calls if kind == "body"}, (strategy, verified)
        assert sum(kind == "head" for kind, _ in calls) >= out.stats.num_rounds, strategy  # (every round's head)


def test_measure_shares_times_each_share_on_a_batched_cache() -> None:
    """The batch's verify + commit per share, timed by the clock it is given (here: one ms per
    verified row per batch row), interleaved after one warm-up each; the median by share."""
    kv = BatchedKV(models("llama")["target"], VOCAB)
    now, verify = [0.0], kv.verify

    def timed(trees, hidden=False):
        now[0] += 1e-3 * trees[0].size
        return verify(trees, hidden=hidden)

    kv.verify = timed
    with torch.inference_mode():
        profile = costmodel.measure_shares(kv, 3, (1, 2, 4, 8), lazy_head=True, reps=2, clock=lambda: now[0])
    assert profile.rows == (1, 2, 4, 8) and profile.ms == pytest.approx((1.0, 2.0, 4.0, 8.0))
    assert profile.meta["batch_rows"] == 3
    assert kv.rows == 3 and kv.width == costmodel.BATCH_CONTEXT + 4 * 3  # (a root kept per call)


def test_a_batch_reads_this_machines_measured_share_costs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """By default (``DYNATREE_BATCH_SHARES=measure``) a greedy batch times its shares once (cached
    on disk) and cuts its trees by them: a second row per row free, a fourth costly, so trees of
    at most 2 rows each; the next run reads the file. Pinned to ``table``, it reads the tuning
    table; a batch that never drafts measures nothing. Every run exact."""

    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(costmodel.BATCH_ENV_SWITCH)  # (the suite pins the table: the default here)
    measured = []

    def fake(kv, rows, shares, lazy_head, reps=3, clock=None):
        measured.append((rows, tuple(shares)))
        return costmodel.CostProfile(tuple(shares), tuple(1.0 if m <= 2 else 100.0 * m for m in shares),
                                     meta={"batch_rows": rows})

    monkeypatch.setattr(costmodel, "measure_shares", fake)
    for _ in range(2):
        out = run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16)
        assert out.stats.share_costs["source"] == "measured at 4 rows"
        assert max(drafted(out)) == 1 and all(r.verified_rows <= 8 for r in out.stats.rounds)
    assert measured == [(4, (1, 2, 4, 8, 16, 32))]  # (once: the second run read the cache)
    assert mismatches("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16) == []
    plain = run_batch("llama", "autoregressive", "text", (4, 9, 1, 6, 2), 3, 16)
    assert measured == [(4, (1, 2, 4, 8, 16, 32))]  # (a batch of 5 that never drafts: nothing timed)
    assert plain.stats.share_costs is None  # (and it names no costs: it never chose a share)
    monkeypatch.setenv(costmodel.BATCH_ENV_SWITCH, "table")
    off = run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16)
    assert off.stats.share_costs["source"].startswith("tuning.BATCH_SHARE_COST") and max(drafted(off)) > 1
    monkeypatch.setenv(costmodel.BATCH_ENV_SWITCH, "sometimes")
    with pytest.raises(DynaTreeError, match="DYNATREE_BATCH_SHARES must be 'measure' or 'table'"):
        run_batch("llama", "dynatree", "perturbed", (4, 9, 1, 6), 3, 16)


@pytest.mark.parametrize("strategy", ["linear", "dynatree", "dyspec"])
def test_a_batch_runs_each_step_of_its_rows_draft_calls_as_one_forward(strategy: str) -> None:
    """Every row drafts every round (a flat cost curve keeps its tree, the back-off off): each
    step's draft calls of all rows (the pending tokens, then each level) run as one draft forward
    on the rows' shared draft cache, so the batch runs about a row count fewer draft forwards than
    its rows make calls (each row's prompt prefill runs alone), and still equals HF's batched
    greedy. Rows drafting one after another, as before, would run one forward per call."""
    ids, mask = padded(prompts(LENGTHS, 5))
    out = dynatree.generate(models("llama")["target"], models("llama")["perturbed"], ids, strategy,
                            max_new_tokens=N, attention_mask=mask, stopping=stopping(), text=False, backoff=False,
                            **OPTIONS.get(strategy, {}))
    assert torch.equal(out.sequences, hf_batch("llama", LENGTHS, 5, N))
    calls = sum(r.draft_calls for s in out.stats for r in s.rounds)
    assert calls > 3 * len(LENGTHS)
    assert out.stats.draft_forwards - len(LENGTHS) <= calls / 2, (out.stats.draft_forwards, calls)


class _BuildOnly(dynatree.DraftPolicy):
    """A policy written against ``build`` alone: a chain of the draft's top tokens, each level run
    with ``drafter.forward`` itself (no ``grow``)."""

    name = "build-only"
    Config = dict

    def build(self, tree, drafter, root_logits) -> None:
        node, logits = 0, root_logits
        for _ in range(min(3, tree.cap(3))):
            token = int(logits.argmax())
            node = tree.add(node, token, float(torch.log_softmax(logits, -1)[token]))
            logits = drafter.forward([node])[0]

    def max_depth(self) -> int:
        return 3


def test_a_policy_that_overrides_only_build_still_drafts_alone_and_in_a_batch() -> None:
    target, draft = models("llama")["target"], models("llama")["perturbed"]
    ids, mask = padded(prompts(LENGTHS, 5))
    out = dynatree.generate(target, draft, ids, _BuildOnly({}), max_new_tokens=N, attention_mask=mask,
                            stopping=stopping(), text=False, backoff=False)
    assert torch.equal(out.sequences, hf_batch("llama", LENGTHS, 5, N))
    assert max(drafted(out)) >= 3
    one = dynatree.generate(target, draft, [prompts(LENGTHS, 5)[1]], _BuildOnly({}), max_new_tokens=N,
                            stopping=stopping(), text=False, backoff=False)
    assert sum(r.drafted for r in one.stats.rounds) > 0
