"""Lossless sampling with the text: at temperature > 0 the tokens of ``draft=None`` (suffix trees)
and of ``TextDraft(model=draft)`` (the text merged into the model's tree, or drafting alone while
DySpec samples the other rounds) follow the target's distribution.

Same statistic as tests/exactness/test_sampling.py (Pearson chi-square of the first POSITIONS
tokens over RUNS seeded runs against the target's exact marginals, enumerated; ALPHA = 1e-4 per
check). The runs are seeded, so the outcome is fixed. The prompt is a sample of the target
itself (seed 4 of ``generate(target, None, [2], "autoregressive", max_new_tokens=20, sampling=SamplingConfig(temperature=0.6))``),
so the text's proposals, which continue its repeats, are often what the target draws: many are
accepted, many rejected, and the root's text children have count ratios below 1 (two continuations).

Suffix children are deterministic proposals: the verifier must treat them as q = 1 (point mass),
whatever count ratio they carry in ``logq``. Controls: verifiers that skip the rejection step for
them, that read q from the count ratio, or that skip the residual, and a merge that attaches text
nodes below a node whose children DySpec sampled, must all be rejected by the same statistic.
Measured (torch 2.13.0+cpu, CPU): the correct engine's smallest p-value over all checks 0.021; each
control's smallest at most 4e-13 (the merge under sampled parents: 2e-262).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from test_sampling import ALPHA, chi_square_pvalue, exact_marginals
from tiny import perturbed, tiny_model

import dynatree
import dynatree.loop.generate
from dynatree.core import verify
from dynatree.core.sampling import SamplingConfig, draw, target_probs, uniform, without
from dynatree.core.tree import children_lists
from dynatree.drafts import hybrid
from dynatree.drafts.suffix import TextDraft
from dynatree.options import StoppingConfig

V = 16
PROMPT = [2, 13, 13, 0, 14, 13, 12, 4, 11, 7, 3, 9, 13, 4, 2, 3, 10, 4, 9, 10, 3]
RUNS = 600
POSITIONS = 3
T = 0.6
SAMPLED = SamplingConfig(temperature=T)
NO_EOS = StoppingConfig(eos_token_id=())
REAL_MERGE = hybrid.merge

# name: (TextDraft options or None for draft=None, strategy, strategy options)
CONFIGS = {
    "text": (None, "dynatree", {}),
    # the model's deterministic (top-k) tree with the text merged in, every round
    "hybrid-dynatree": ({"confident": 1e9, "model_min_gain": 0.0}, "dynatree", {"max_nodes": 12, "root_branching": True}),
    # rounds the text is confident about: text alone; the others: DySpec's sampled tree
    "hybrid-dyspec": ({}, "dyspec", {"max_nodes": 8}),
    "hybrid-dyspec-threshold": ({}, "dyspec-threshold", {"threshold": 0.05, "max_nodes": 8}),
    # DySpec every round: the text proposes, but nothing may go under a sampled parent (the root)
    "hybrid-dyspec-merge": ({"confident": 1e9, "model_min_gain": 0.0}, "dyspec", {"max_nodes": 8}),
}


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model("llama", 3, vocab=V, layers=1, init=0.3)
    return target, perturbed(target, 0.2, 7)


@pytest.fixture(scope="module")
def exact(models) -> list[torch.Tensor]:
    """Target marginals of the first POSITIONS tokens after PROMPT, by enumerating all prefixes."""
    return exact_marginals(models[0], SamplingConfig(T), POSITIONS, PROMPT)


class Tally:
    """What the runs' trees held: rounds drafted by the text alone / with sampled children, merges
    that had text to add, and runs whose first round accepted a text node."""

    def __init__(self, merge) -> None:
        self.merge_fn = merge
        self.text_rounds = self.sampled_rounds = self.rounds = 0
        self.merges_with_text = self.merged_nodes = 0
        self.first_round_text_accepted = 0
        self._text: set[int] = set()
        self._first = True

    def merge(self, builder, proposal, max_rows=None) -> int:
        start = len(builder)
        added = self.merge_fn(builder, proposal, max_rows)
        self.merges_with_text += len(proposal) > 0
        self.merged_nodes += added
        self._text = set(range(start, len(builder)))
        return added

    def __call__(self, event) -> None:
        self.rounds += event.tree.size > 1  # (rounds that drafted: a call's last token is a plain step)
        text = set(range(1, event.tree.size)) if event.stats.draft_calls == 0 else self._text
        self.text_rounds += event.stats.draft_calls == 0 and event.tree.size > 1
        self.sampled_rounds += event.tree.child_q is not None
        if self._first:
            self.first_round_text_accepted += bool(set(event.path) & text)
        self._first = False
        self._text = set()

    def new_run(self) -> None:
        self._first = True


def sample(models, exact, config: str, merge=REAL_MERGE) -> tuple[list[float], Tally]:
    """p-values of the first POSITIONS tokens over RUNS seeded runs, and what the trees held."""
    target, draft = models
    text, strategy, opts = CONFIGS[config]
    source = None if text is None else TextDraft(model=draft, **text)
    counts = torch.zeros(POSITIONS, V)
    tally = Tally(merge)
    hybrid.merge = tally.merge
    try:
        for seed in range(RUNS):
            tally.new_run()
            # (one token past the compared ones: a call's last token is a plain target step)
            out = dynatree.generate(target, source, PROMPT, strategy, max_new_tokens=POSITIONS + 1, stopping=NO_EOS,
                                    sampling=SAMPLED, seed=seed, on_round=tally, **opts)
            counts[torch.arange(POSITIONS), out.sequences[0, len(PROMPT):len(PROMPT) + POSITIONS]] += 1
    finally:
        hybrid.merge = REAL_MERGE
    return [chi_square_pvalue(counts[i], exact[i])[2] for i in range(POSITIONS)], tally


# ------------------------------------------------------------------------------ the claim
@pytest.mark.parametrize("config", list(CONFIGS))
def test_tokens_follow_target_distribution(models, exact, config: str) -> None:
    ps, tally = sample(models, exact, config)
    assert min(ps) >= ALPHA, f"{config}: p-values {ps}"
    # guards: the trees held what the config is about
    if config in ("text", "hybrid-dynatree"):
        share = 0.5 if config == "text" else 0.1  # (with a model, only the nodes the merge added count)
        assert tally.first_round_text_accepted >= share * RUNS, "text nodes are rarely accepted"
    if config == "hybrid-dynatree":
        assert tally.merged_nodes > 0
    if config in ("hybrid-dyspec", "hybrid-dyspec-threshold"):  # both kinds of rounds, mixed in runs
        assert tally.text_rounds >= 0.5 * tally.rounds and tally.sampled_rounds >= 50, vars(tally)
    if config == "hybrid-dyspec-merge":  # the text had nodes to offer, none may join a sampled root
        assert tally.merges_with_text >= 0.3 * tally.rounds and tally.merged_nodes == 0
        assert tally.sampled_rounds == tally.rounds


# ------------------------------------------------------------------------------ controls
def broken_sample_accept(kind: str):
    """sample_accept with one deliberate bug for deterministic (q = 1) children, i.e. the text's:
    ``no-rejection``: accept any such child the target allows (no coin, no residual);
    ``count-q``: accept with min(1, r / q) where q is the child's count ratio exp(logq)."""

    def accept(tree, target_logits, cfg, generator):
        kids = children_lists(tree.parent)
        tokens, logq = tree.tokens.tolist(), tree.logq.tolist()
        path, node = [], 0
        while True:
            r = target_probs(target_logits[node], cfg)
            d = tree.child_q[node] if tree.child_q is not None else None
            accepted = None
            for child in kids[node]:
                x = tokens[child]
                if d is None and kind == "no-rejection":
                    if float(r[x]) > 0:
                        accepted = child
                        break
                    continue
                q = float(d[x]) if d is not None else (math.exp(logq[child]) if kind == "count-q" else 1.0)
                if uniform(generator) * q < float(r[x]):
                    accepted = child
                    break
                r = verify.residual(r, d, x)
                if d is not None:
                    d = without(d, x)
                    if d is None:
                        break
            if accepted is None:
                return path, draw(r, generator)
            path.append(accepted)
            node = accepted

    return accept


def merge_under_sampled_parents(builder, proposal, max_rows=None) -> int:
    """BROKEN merge: text nodes also go below a node whose children DySpec sampled, where the
    verifier then reads them as further draws from that node's draft distribution."""
    children = {(p, t): i for i, (p, t) in enumerate(zip(builder.parent, builder.tokens)) if i}
    where: list[int] = []
    added = 0
    for parent, token, logq in zip(proposal.parents, proposal.tokens, proposal.logprobs):
        at = 0 if parent < 0 else where[parent]
        node = children.get((at, token))
        if node is None:
            node = children[(at, token)] = builder.add(at, token, logq)
            added += 1
        where.append(node)
    return added


@contextlib.contextmanager
def patched(monkeypatch: pytest.MonkeyPatch, bug: str):
    if bug in ("no-rejection", "count-q"):
        monkeypatch.setattr(dynatree.loop.generate, "sample_accept", broken_sample_accept(bug))
    elif bug == "skip-residual":
        monkeypatch.setattr(verify, "residual", lambda r, d, x: r)
    yield merge_under_sampled_parents if bug == "merge-under-sampled" else REAL_MERGE


@pytest.mark.parametrize(
    ("config", "bug"),
    [
        ("text", "no-rejection"),
        ("text", "count-q"),
        ("text", "skip-residual"),
        ("hybrid-dynatree", "count-q"),
        ("hybrid-dyspec", "skip-residual"),
        ("hybrid-dyspec-merge", "merge-under-sampled"),
    ],
)
def test_control_biased_variant_is_rejected(models, exact, monkeypatch: pytest.MonkeyPatch, config: str,
                                            bug: str) -> None:
    with patched(monkeypatch, bug) as merge:
        ps, _ = sample(models, exact, config, merge)
    assert min(ps) < ALPHA, f"{bug} on {config} not detected: p-values {ps}"
