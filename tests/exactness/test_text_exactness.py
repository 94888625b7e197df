"""Greedy exactness of speculation from the text: ``draft=None`` (TextProposer) and
``TextDraft(model=draft)`` (HybridProposer, the text merged into the model's tree).

Every strategy, the four tiny architectures, a prompt that repeats (so the suffix index proposes
deep, branching continuations) and one that never does; EOS on a node inside an accepted text
branch; ``max_new_tokens`` reached inside an accepted text branch. The reference is the target's
argmax by full forwards (no cache, no HF ``generate``: ``tiny.hf_greedy`` infers an attention mask
from the pad id 0, which these prompts, taken from the target's own output, may contain).

Greedy verification is exact for *any* valid tree, so what these tests can catch is a verifier or
loop that mishandles the trees the text produces; each claim has a control below that breaks the
engine on purpose (monkeypatch) and must be caught. Setup guards check that the trees really are
deep, branching and accepted: the fixtures (prompt seeds) were chosen so they are, and a library
change that makes them shallow fails a guard instead of silently weakening the tests.

The cut of the text's proposal to what pays for its rows (``TextDraft.trim``, on by default)
leaves the tiny random models, whose output the text rarely predicts, almost no text nodes; what
it keeps is a best-first prefix of the whole proposal, a tree of the same kind. So the cases and
controls run the whole proposals (``trim=False``), the deep, branching trees the verifier must
handle, and the matrix runs both: the default, cut, and the whole proposals.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest
import torch
from tiny import ARCHS, SMALL_TREES, VOCAB, perturbed, tiny_model

import dynatree
import dynatree.core.verify
import dynatree.loop.generate
from dynatree import STRATEGIES, StoppingConfig
from dynatree.core.tree import children_lists
from dynatree.drafts import hybrid
from dynatree.drafts.suffix import TextDraft

# text: draft=None (TextDraft()); hybrid: TextDraft(model=draft), where the model sits out the rounds the text is
# confident about; hybrid-merge: the model drafts every round and the text is merged into its tree.
# The model source alone: tests/exactness/test_exactness.py.
SOURCES = ("text", "hybrid", "hybrid-merge")
STRATEGY_NAMES = sorted(STRATEGIES)
# Seed of each architecture's repeating prompt: one whose 60-token run has, with every source, an
# accepted text node with more accepted after it, an accepted text node inside a longer branch whose
# token is new to the output, and (hybrid-merge) an accepted node the merge added; test_setup_*
# checks all of it.
PROMPT_SEEDS = {"llama": 21, "gpt2": 15, "neox": 1, "qwen2": 2}
# A call's last token is a plain target step, so a run ends inside an accepted text branch only
# when its last round has 2+ tokens left and the target takes 3+ text nodes in a row there. The
# tiny qwen2 target follows its repeating prompt too briefly for that, and with the model drafting
# every round (hybrid-merge) only neox's does: no budget up to N_CASES makes such a cut for the
# others (nor, for qwen2, any prompt seed up to 60). The budget cases are the pairs where it happens.
BUDGET_CASES = [(a, s) for a in ARCHS for s in SOURCES if a != "qwen2" and (s != "hybrid-merge" or a == "neox")]
N_REPEAT, N_FRESH, N_CASES = 30, 24, 80  # tokens generated per run: matrix (two prompts), cases
REAL_MERGE = hybrid.merge
REAL_TRUNCATE = dynatree.loop.generate._truncate


# ------------------------------------------------------------------------------- fixtures
@functools.lru_cache(maxsize=None)
def models(arch: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model(arch, 0)
    return target, perturbed(target)


@functools.lru_cache(maxsize=None)
def reference(arch: str, prompt: tuple[int, ...], n: int, eos: int | None = None) -> tuple[int, ...]:
    """The target's greedy continuation, one full forward per token; stops after ``eos``."""
    target = models(arch)[0]
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(target(torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[-1] == eos:
                break
    return tuple(seq)


@functools.lru_cache(maxsize=None)
def repeating_prompt(arch: str) -> tuple[int, ...]:
    """6 random tokens, the target's 12 greedy tokens after them, then the first 9 again: the
    text's continuation is known to the index, and the output soon repeats itself too."""
    g = torch.Generator().manual_seed(PROMPT_SEEDS[arch])
    start = (torch.randperm(VOCAB - 2, generator=g)[:6] + 2).tolist()
    text = reference(arch, tuple(start), 12)
    return text + text[:9]


@functools.lru_cache(maxsize=None)
def fresh_prompt(arch: str) -> tuple[int, ...]:
    """10 distinct tokens: nothing in the prompt repeats."""
    g = torch.Generator().manual_seed(100 + ARCHS.index(arch))
    return tuple((torch.randperm(VOCAB - 2, generator=g)[:10] + 2).tolist())


def draft_for(arch: str, source: str, trim: bool = False) -> TextDraft | None:
    if source == "text":
        return None if trim else TextDraft(trim=False)
    merge_all = source == "hybrid-merge"  # the model drafts every round, whatever it earns
    return TextDraft(model=models(arch)[1], confident=1e9 if merge_all else TextDraft.confident,
                     model_min_gain=0.0 if merge_all else TextDraft.model_min_gain, trim=trim)


class Recorder:
    """``on_round`` callback that also wraps :func:`hybrid.merge`: per round, the tree nodes that
    came from the text (every node of a round the model sat out; else the nodes the merged
    proposal maps to, added or shared with the model's tree) and the nodes merge added (None when
    the model sat out)."""

    def __init__(self, merge=REAL_MERGE) -> None:
        self.rounds: list[tuple[object, set[int], set[int] | None]] = []
        self._merge = merge
        self._pending: tuple[set[int], set[int]] | None = None

    def merge(self, builder, proposal, max_rows=None) -> int:
        start = len(builder)
        added = self._merge(builder, proposal, max_rows)
        kids = {(p, t): i for i, (p, t) in enumerate(zip(builder.parent, builder.tokens)) if i}
        where: list[int | None] = []
        for parent, token in zip(proposal.parents, proposal.tokens):
            at = 0 if parent < 0 else where[parent]
            where.append(None if at is None else kids.get((at, token)))
        self._pending = ({n for n in where if n is not None}, set(range(start, len(builder))))
        return added

    def __call__(self, event) -> None:
        if event.stats.draft_calls == 0:  # the text alone drafted this round
            text, added = set(range(1, event.tree.size)), None
        else:
            text, added = self._pending or (set(), set())
        self.rounds.append((event, text, added))
        self._pending = None


@contextlib.contextmanager
def recording(merge=REAL_MERGE) -> Iterator[Recorder]:
    rec = Recorder(merge)
    hybrid.merge = rec.merge  # HybridProposer.propose looks merge up in its module
    try:
        yield rec
    finally:
        hybrid.merge = REAL_MERGE


def run(arch: str, source: str, strategy: str, prompt: tuple[int, ...], n: int, eos: int | None = None,
        merge=REAL_MERGE, trim: bool = False, **kw) -> tuple[tuple[int, ...], Recorder, object]:
    with recording(merge) as rec:
        out = dynatree.generate(models(arch)[0], draft_for(arch, source, trim), list(prompt), strategy, max_new_tokens=n,
                                stopping=StoppingConfig(eos_token_id=() if eos is None else (eos,)), on_round=rec,
                                **SMALL_TREES.get(strategy, {}), **kw)
    return tuple(out.sequences[0].tolist()), rec, out.stats


@functools.lru_cache(maxsize=None)
def full_run(arch: str, source: str) -> tuple[tuple[int, ...], Recorder]:
    """The repeating prompt, N_CASES tokens, DynaTree's tree (+ the text): where the cases come from."""
    seq, rec, _ = run(arch, source, "dynatree", repeating_prompt(arch), N_CASES)
    return seq, rec


def accepted_text_nodes(rec: Recorder) -> Iterator[tuple[int, int, int]]:
    """(output position, round index, position in the accepted path) of every accepted node that
    came from the text."""
    done = 0
    for i, (event, text, _) in enumerate(rec.rounds):
        for j, node in enumerate(event.path):
            if node in text:
                yield done + j, i, j
        done += len(event.tokens)


# ------------------------------------------------------------------- the matrix (claim 1)
@pytest.mark.parametrize("trim", [True, False], ids=["cut", "whole"])
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_autoregressive(arch: str, source: str, strategy: str, trim: bool) -> None:
    for prompt, n in ((repeating_prompt(arch), N_REPEAT), (fresh_prompt(arch), N_FRESH)):
        seq, _, stats = run(arch, source, strategy, prompt, n, trim=trim)
        assert seq == reference(arch, prompt, n), (arch, source, strategy, prompt, trim)
        assert stats.new_tokens == n


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", ARCHS)
def test_setup_text_trees_are_deep_branching_and_accepted(arch: str, source: str) -> None:
    """Guards the fixtures: the text proposes deep trees with siblings, and an accepted text node
    has more accepted after it; with a model, both kinds of rounds happen (hybrid) or text nodes
    the model did not draft are merged into its trees and accepted (hybrid-merge)."""
    seq, rec = full_run(arch, source)
    assert seq == reference(arch, repeating_prompt(arch), N_CASES)
    text_trees = [e.tree for e, text, _ in rec.rounds if text]
    assert max(t.max_depth for t in text_trees) >= 4
    assert any(any(len(k) > 1 for k in children_lists(t.parent)) for t in text_trees)
    assert any(j < len(rec.rounds[i][0].path) - 1 for _, i, j in accepted_text_nodes(rec)), \
        "no accepted text node with more accepted after it"
    called = [added for e, _, added in rec.rounds if e.stats.draft_calls]
    if source == "hybrid":  # the model sits some rounds out and drafts others
        assert 0 < len(called) < len(rec.rounds)
    if source == "hybrid-merge":  # text nodes the model did not draft were merged in and accepted
        # (every round but a call's last token, which is a plain target step)
        assert len(called) == len([e for e, _, _ in rec.rounds if e.tree.size > 1])
        assert any(set(e.path) & (added or set()) for e, _, added in rec.rounds), "no merged text node was accepted"


# ------------------------------------------------------------- EOS and max_new_tokens (claim 1)
def eos_case(arch: str, source: str) -> tuple[int, int, tuple[int, ...], Recorder]:
    """EOS = the token of an accepted text node that has drafted children (the branch goes on
    below it), at its first occurrence in the output; returns (eos, its output position, the
    output of a run with that EOS, its recorder)."""
    seq, rec = full_run(arch, source)
    prompt = repeating_prompt(arch)
    new = seq[len(prompt):]
    for pos, i, j in accepted_text_nodes(rec):
        tree = rec.rounds[i][0].tree
        node = rec.rounds[i][0].path[j]
        if int(tree.parent.eq(node).sum()) and new.index(new[pos]) == pos:
            out, rec2, _ = run(arch, source, "dynatree", prompt, N_CASES, eos=new[pos])
            return new[pos], pos, out, rec2
    pytest.fail(f"{arch}/{source}: no accepted text node inside a branch with a token new to the output")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_an_accepted_text_branch(arch: str, source: str) -> None:
    eos, pos, out, rec = eos_case(arch, source)
    prompt = repeating_prompt(arch)
    assert out == reference(arch, prompt, N_CASES, eos)
    assert out[-1] == eos and len(out) - len(prompt) == pos + 1
    last, text, _ = rec.rounds[-1]  # the stop came from an accepted text node with drafted children
    stop = last.path[len(last.tokens) - 1]
    assert stop in text and int(last.tree.parent.eq(stop).sum()) > 0


def budget_case(arch: str, source: str) -> tuple[int, tuple[int, ...], Recorder]:
    """max_new_tokens = the output up to an accepted text node that has more accepted after it.

    The run with that budget must reproduce the cut: its last rounds may be shaped differently (no
    tree is deeper than the tokens left), so the first such node whose budget run still ends inside
    an accepted text branch is taken."""
    _, rec = full_run(arch, source)
    candidates = [p for p, i, j in accepted_text_nodes(rec) if j < len(rec.rounds[i][0].path) - 1]
    if not candidates:
        pytest.fail(f"{arch}/{source}: no accepted text node with more accepted after it")
    # Then every other budget: a call's last token is a plain step, so a node first on its round's
    # path cannot be cut after, while the shorter run's own last rounds make other cuts.
    budgets = [p + 1 for p in candidates] + [n for n in range(2, N_CASES) if n - 1 not in candidates]
    for n in budgets:
        out, rec2, _ = run(arch, source, "dynatree", repeating_prompt(arch), n)
        last, text, _ = rec2.rounds[-1]
        if len(last.tokens) < len(last.path) and last.path[len(last.tokens) - 1] in text:
            return n, out, rec2
    pytest.fail(f"{arch}/{source}: no budget ends a run inside an accepted text branch")


@pytest.mark.parametrize(("arch", "source"), BUDGET_CASES)
def test_max_new_tokens_inside_an_accepted_text_branch(arch: str, source: str) -> None:
    n, out, rec = budget_case(arch, source)
    assert out == reference(arch, repeating_prompt(arch), n)
    last, text, _ = rec.rounds[-1]  # cut after an accepted text node, before the rest of the path
    assert len(last.tokens) < len(last.path) and last.path[len(last.tokens) - 1] in text


# ------------------------------------------------------------------------------ controls
def trusting_greedy_accept(tree, target_logits):
    """BROKEN: takes a child the text proposed with certainty (count ratio 1, logq 0) without
    asking the target, as if a continuation seen every time were sure to come again."""
    kids = children_lists(tree.parent)
    tokens, logq = tree.tokens.tolist(), tree.logq.tolist()
    path, node = [], 0
    while True:
        best = int(target_logits[node].argmax())
        node = next((c for c in kids[node] if tokens[c] == best or logq[c] == 0.0), -1)
        if node < 0:
            return path, best
        path.append(node)


def causal_mask(parent: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    return torch.ones(parent.numel(), parent.numel(), dtype=torch.bool).tril()


def bfs_positions(depth: torch.Tensor, prefix_len: int) -> torch.Tensor:
    return (torch.arange(depth.numel()) + prefix_len).view(1, -1)


def warm_cases() -> None:
    """Compute the cached correct runs the cases come from before a control breaks the engine."""
    for arch in ARCHS:
        for source in SOURCES:
            full_run(arch, source)


def checks_fail(arch: str, source: str) -> bool:
    """Whether this file's plain exactness checks fail: the matrix's DynaTree runs (both prompts)
    and the 60-token run the cases come from."""
    runs = ((repeating_prompt(arch), N_REPEAT), (fresh_prompt(arch), N_FRESH), (repeating_prompt(arch), N_CASES))
    return any(run(arch, source, "dynatree", p, n)[0] != reference(arch, p, n) for p, n in runs)


@pytest.mark.parametrize(
    ("module", "name", "broken"),
    [
        (dynatree.loop.generate, "greedy_accept", trusting_greedy_accept),
        (dynatree.core.verify, "ancestor_matrix", causal_mask),
        (dynatree.core.verify, "position_ids", bfs_positions),
    ],
    ids=["verifier-trusts-certain-text", "causal-instead-of-tree-mask", "bfs-index-positions"],
)
def test_control_exactness_checks_catch_a_broken_verifier(monkeypatch: pytest.MonkeyPatch, module, name,
                                                           broken) -> None:
    """The text's trees must make each of these fail on every architecture and source: a
    chain-only tree would hide the mask and position bugs (a chain's causal mask is its tree mask,
    its BFS index its depth), a tree of unaccepted text the trusting verifier."""
    monkeypatch.setattr(module, name, broken)
    missed = [(a, s) for a in ARCHS for s in SOURCES if not checks_fail(a, s)]
    assert not missed, f"{name} mutant not detected on {missed}"


def test_control_eos_check_catches_a_loop_that_stops_only_at_round_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """BROKEN: the round's tokens are cut at the budget only, so EOS stops generation only when it
    is the round's last token; inside an accepted branch it is passed over."""
    warm_cases()
    monkeypatch.setattr(dynatree.loop.generate, "_truncate", lambda new, room, stop: new[:room])
    for arch in ARCHS:
        for source in SOURCES:
            eos, _, out, _ = eos_case(arch, source)
            assert out != reference(arch, repeating_prompt(arch), N_CASES, eos), (arch, source)


def test_control_budget_check_catches_a_loop_that_commits_whole_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """BROKEN: the last round is committed whole, past max_new_tokens. (The budgets are the cases'
    own, found with the real loop: each ends its run inside an accepted text branch.)"""
    warm_cases()
    budgets = {(arch, source): budget_case(arch, source)[0] for arch, source in BUDGET_CASES}
    monkeypatch.setattr(dynatree.loop.generate, "_truncate", lambda new, room, stop: REAL_TRUNCATE(new, len(new), stop))
    for (arch, source), n in budgets.items():
        out, _, _ = run(arch, source, "dynatree", repeating_prompt(arch), n)
        assert out != reference(arch, repeating_prompt(arch), n), (arch, source)
