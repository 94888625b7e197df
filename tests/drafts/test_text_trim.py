"""The text source's proposal cut to what pays for its verify rows (``TextDraft(trim=True)``).

Pure functions on fake cost curves (flat keeps everything, steep cuts the low-probability tail),
the validity of what is kept (a best-first prefix: every parent before its child) with a control
that a cut dropping parents is caught, the calibration of the text's probabilities by the
acceptance it earns (with a control that a source that never learns keeps drafting what the
target rejects), the hybrid merge's cut (the model's nodes are rows already paid for), the wiring (default curve per device, a measured profile wins, ``trim=False`` is the old
behaviour, the bench's ``text_trim`` option), and greedy exactness with the cut on. No clock.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from tiny import VOCAB, perturbed, tiny_model

import dynatree
from dynatree import tuning
from dynatree.core import costmodel
from dynatree.core.costmodel import CostProfile, choose_budget
from dynatree.core.tree import TreeBuilder, validate
from dynatree.drafts.hybrid import HybridProposer, merge, trim_merged
from dynatree.drafts.suffix import StepAcceptance, TextDraft, TextProposer, gains, trim
from dynatree.drafts.suffix_index import Proposal, SuffixIndex
from dynatree.errors import DynaTreeError

NO_EOS = dynatree.StoppingConfig(eos_token_id=())


def flat() -> CostProfile:
    return CostProfile((1, 2), (1.0, 1.0))


def steep() -> CostProfile:
    """A quarter of a step per extra row: a node must be accepted with probability > ~0.25 x the
    round's expected tokens to pay for itself."""
    return CostProfile((1, 2), (1.0, 1.25))


def cpu() -> CostProfile:
    rows, cost = tuning.TEXT_COST_CURVE["cpu"]
    return CostProfile(rows, cost)


def proposal(parents: list[int], probs: list[float], tokens: list[int] | None = None) -> Proposal:
    """A proposal from conditional probabilities; score = sum of path probabilities."""
    tokens = list(range(10, 10 + len(parents))) if tokens is None else tokens
    p = Proposal(parents, tokens, [math.log(q) for q in probs], match_len=3)
    p.score = sum(p.path_probs())
    return p


# A sure chain of three, then a fan of unlikely alternatives under its head and a weak tail.
SURE_THEN_UNSURE = proposal([-1, 0, 1, -1, 0, 2, 5], [1.0, 1.0, 1.0, 0.15, 0.12, 0.2, 0.6])


def valid_prefix(original: Proposal, kept: Proposal) -> bool:
    """What a cut may return: the first n nodes of the proposal, unchanged, each parent before it."""
    n = len(kept)
    return (kept.parents == original.parents[:n] and kept.tokens == original.tokens[:n]
            and kept.logprobs == original.logprobs[:n] and all(-1 <= p < i for i, p in enumerate(kept.parents)))


def random_proposals(count: int = 60) -> list[Proposal]:
    """Real proposals of the suffix index over random texts of a few tokens (many branches, with
    probabilities of every size); the text is never empty of repeats."""
    out = []
    rng = random.Random(7)
    for k in range(count):
        alphabet = rng.randint(2, 6)
        seq = [rng.randrange(alphabet) for _ in range(rng.randint(20, 120))]
        index = SuffixIndex(64)
        index.extend(index.add_sequence(), seq)
        p = index.propose(seq, 16, min_prob=rng.choice([0.0, 0.05, 0.1]))
        if len(p):
            out.append(p)
    return out


# ---------------------------------------------------------------------------- the proposal
def test_path_probabilities_and_head() -> None:
    p = SURE_THEN_UNSURE
    assert p.path_probs() == pytest.approx([1.0, 1.0, 1.0, 0.15, 0.12, 0.2, 0.12])
    h = p.head(4)
    assert (h.parents, h.tokens, h.logprobs) == (p.parents[:4], p.tokens[:4], p.logprobs[:4])
    assert h.score == pytest.approx(3.15) and h.match_len == 3
    assert p.head(99) is p and len(p.head(0)) == 0 and p.head(0).score == 0.0


def test_real_proposals_are_best_first_trees() -> None:
    """What makes a prefix a valid tree and the cut a budget choice: parents come before children
    and path probabilities never increase along the lists."""
    props = random_proposals()
    assert len(props) > 40 and any(len(p) == 16 for p in props)
    for p in props:
        assert all(-1 <= par < i for i, par in enumerate(p.parents))
        paths = p.path_probs()
        assert all(b <= a + 1e-12 for a, b in zip(paths, paths[1:]))
        assert p.score == pytest.approx(sum(paths))


# ------------------------------------------------------------------------------- the cut
def test_a_flat_curve_keeps_everything() -> None:
    assert trim(SURE_THEN_UNSURE, flat()) is SURE_THEN_UNSURE
    for p in random_proposals():
        assert len(trim(p, flat())) == len(p)


def test_a_steep_curve_cuts_the_unlikely_tail() -> None:
    kept = trim(SURE_THEN_UNSURE, steep())
    assert len(kept) == 3  # the sure chain: (1 + 3) / 1.75 beats (1 + 3.15) / 2.0
    assert valid_prefix(SURE_THEN_UNSURE, kept) and kept.score == pytest.approx(3.0)
    unsure = proposal([-1, -1, 0], [0.2, 0.15, 0.5])
    assert len(trim(unsure, steep())) == 0  # nothing pays: a plain step
    sure = proposal([-1, 0, 1, 2], [1.0, 1.0, 1.0, 1.0])
    assert len(trim(sure, steep())) == 4  # a confident source goes deep


def test_the_cut_is_the_best_prefix_on_real_proposals() -> None:
    """Against a brute force over every prefix, under the default CPU curve and a steep one."""
    cut_somewhere = 0
    for cost in (cpu(), steep()):
        for p in random_proposals():
            kept = trim(p, cost)
            assert valid_prefix(p, kept)
            paths = p.path_probs()
            value = [(1 + sum(paths[:n])) / cost.cost(n + 1) for n in range(len(p) + 1)]
            best = max(value)
            assert len(kept) == next(n for n, v in enumerate(value) if v >= best * (1 - 1e-9))  # smallest on ties
            tree = TreeBuilder(0)
            kept.add_to(tree)
            validate(tree.freeze())  # the engine's own tree check
            cut_somewhere += len(kept) < len(p)
    assert cut_somewhere > 10  # the fixtures exercise the cut, not only whole proposals


def drop_parents_cut(p: Proposal, cost: CostProfile) -> Proposal:
    """BROKEN: keeps the n nodes of highest *conditional* probability, wherever they are: a child
    sure given its parent outlives an unsure parent."""
    n = choose_budget(cost, p.path_probs())
    keep = sorted(sorted(range(len(p)), key=lambda i: -p.logprobs[i])[:n])
    return Proposal([p.parents[i] for i in keep], [p.tokens[i] for i in keep], [p.logprobs[i] for i in keep],
                    p.match_len)


def test_control_a_cut_that_drops_parents_is_caught() -> None:
    # an unsure second branch (0.3) whose child is sure given it (1.0); the curve affords 2 nodes
    p = proposal([-1, -1, 1], [0.9, 0.3, 1.0])
    two = CostProfile((1, 3, 4), (1.0, 1.2, 2.0))
    assert len(trim(p, two)) == 2 and valid_prefix(p, trim(p, two))
    broken = drop_parents_cut(p, two)
    assert broken.parents == [-1, 1] and not valid_prefix(p, broken)  # node 2 kept, its parent 1 gone
    caught = sum(not valid_prefix(p, drop_parents_cut(p, cost)) for cost in (cpu(), steep())
                 for p in random_proposals())
    assert caught > 0


def test_choose_budget_counts_what_the_tree_already_holds() -> None:
    gains = [0.9, 0.5, 0.3]
    assert choose_budget(steep(), gains, base=1.0, rows=1) == choose_budget(steep(), gains)
    # rows shift the cost lookup: a step from 4 to 5 rows that a bare root's nodes 1-3 never meet
    step = CostProfile((1, 4, 5), (1.0, 1.0, 3.0))
    assert choose_budget(step, gains) == 3 and choose_budget(step, gains, rows=4) == 0
    # a round that already expects many tokens pays less for an unsure node
    assert choose_budget(steep(), [0.5], base=1.0) == 1 and choose_budget(steep(), [0.5], base=4.0) == 0
    for bad in ({"base": 0.0}, {"base": math.inf}, {"rows": 0}, {"rows": 1.5}):
        with pytest.raises(DynaTreeError):
            choose_budget(steep(), gains, **bad)


# ----------------------------------------------------------------------- the calibration
def test_step_acceptance_counts_steps_taken_over_steps_offered() -> None:
    chain = proposal([-1, 0, 1, 2], [1.0, 1.0, 1.0, 1.0])
    a = StepAcceptance(decay=0.5)
    assert a.rate == 1.0  # a fresh request trusts the counts
    a.learn(chain, [10, 11, 99])  # two steps taken, the third offered and refused
    assert (a.successes, a.exposure) == (0.5 + 2, 0.5 + 3) and a.rate == pytest.approx(2.5 / 3.5)
    a.learn(chain, [99])  # a plain step (the round cut to nothing) still tells about the first level
    assert (a.successes, a.exposure) == (1.25, 2.75)
    a.learn(chain, [10, 11, 12, 13, 14])  # the whole chain taken: the bonus after it is offered nothing
    assert (a.successes, a.exposure) == (0.625 + 4, 1.375 + 4)
    fan = proposal([-1, -1, 1], [0.6, 0.3, 0.5])  # two children offered at 0.9 together, the second taken
    b = StepAcceptance(decay=0.0)
    b.learn(fan, [11, 12])
    assert (b.successes, b.exposure) == pytest.approx((2, 0.9 + 0.5))
    assert b.rate == 1.0  # (clipped: the text is never trusted beyond its own counts)
    b.learn(fan, [42])
    assert b.rate == 0.01  # nothing taken: the floor, not zero (the gains stay positive)
    b.learn(Proposal(), [5, 6])  # an empty proposal offers nothing, and teaches nothing
    assert (b.successes, b.exposure) == pytest.approx((0.0, 0.9)) and b.rate == 0.01
    with pytest.raises(DynaTreeError, match="decay"):
        StepAcceptance(decay=1.0)


def test_the_rate_decides_how_deep_a_confident_looking_chain_goes() -> None:
    """Sixteen nodes the counts call certain: the raw gains keep them all; a source whose steps
    are taken half the time keeps a few; one whose steps are taken 9 times in 10 goes deep; one
    taken 2 times in 100 drafts nothing."""
    chain = proposal(list(range(-1, 15)), [1.0] * 16)
    assert gains(chain, 0.5)[:3] == pytest.approx([0.5, 0.25, 0.125]) and gains(chain) == [1.0] * 16
    assert len(trim(chain, cpu())) == 16
    assert 1 <= len(trim(chain, cpu(), rate=0.5)) <= 3
    assert len(trim(chain, cpu(), rate=0.9)) >= 12  # deep (13 of 16 on the CPU curve: the last rows cost more than they gain)
    assert len(trim(chain, cpu(), rate=0.2)) <= 1  # a second row costs more than 0.04 of a step
    assert len(trim(chain, cpu(), rate=0.02)) == 0  # nothing pays: a plain step


def test_control_a_source_that_never_learns_keeps_drafting_what_is_rejected(monkeypatch) -> None:
    """The tiny model's output is not what its prompt repeats: calibrated, the cut stops drafting
    the text's certain-looking chains; with the calibration broken (learn does nothing) it keeps
    drafting them whole."""
    target = tiny_model("llama", seed=1)
    g = torch.Generator().manual_seed(2)
    block = torch.randint(2, VOCAB, (12,), generator=g)
    ids = torch.cat([block, block, block[:5]]).tolist()

    def nodes_per_round() -> float:
        r = dynatree.generate(target, TextDraft(), ids, max_new_tokens=60, stopping=NO_EOS)
        return sum(x.drafted for x in r.stats.rounds) / r.stats.num_rounds

    learning = nodes_per_round()
    monkeypatch.setattr(StepAcceptance, "learn", lambda self, proposal, committed: None)
    assert nodes_per_round() > 2 * learning + 1


def test_hybrid_learns_from_every_round_s_whole_proposal(monkeypatch) -> None:
    """Whoever drafted, the committed tokens are the target's: the hybrid source calibrates on
    every round, with the proposal as it was before the cut."""
    seen: list[tuple[int, list[int]]] = []
    real = StepAcceptance.learn
    monkeypatch.setattr(StepAcceptance, "learn", lambda self, p, committed: (seen.append((len(p), list(committed))),
                                                                             real(self, p, committed)))
    target = tiny_model("llama", seed=1)
    events = []
    r = dynatree.generate(target, TextDraft(model=perturbed(target, noise=0.05), confident=1e9),
                          uncertain_prompt(), max_new_tokens=30, stopping=NO_EOS, on_round=events.append)
    # every round but those at the call's last token (a plain step: no tree to propose)
    left, asked = 30, 0
    for e in events:
        asked += left > 1
        left -= len(e.tokens)
    assert len(seen) == asked and asked >= r.stats.num_rounds - 1
    assert [c for _, c in seen][:-1] == [e.tokens for e in events][:asked - 1]  # (the last round may be cut short)
    assert any(n > 0 for n, _ in seen)


# ---------------------------------------------------------------------- the hybrid's cut
def model_tree() -> TreeBuilder:
    """A draft model's tree: 10 -> 11 (p 0.9) -> 12 (p 0.45), and 20 (p 0.05)."""
    b = TreeBuilder(1)
    a = b.add(0, 10, math.log(0.9))
    b.add(a, 11, math.log(0.5))
    b.add(0, 20, math.log(0.05))
    return b


def test_merge_cut_counts_the_model_s_rows_and_shares_its_nodes() -> None:
    # text: 10 and 10->11 (the model's), 10->11->30 new (0.8), 40 new (0.1), 10->11->30->31 new (0.24)
    p = proposal([-1, 0, 1, -1, 2], [1.0, 1.0, 0.8, 0.1, 0.3], tokens=[10, 11, 30, 40, 31])
    b = model_tree()
    before = (list(b.tokens), list(b.parent))
    assert trim_merged(b, p, flat()) is p  # rows are free: every new node stays
    kept = trim_merged(b, p, steep())
    assert (list(b.tokens), list(b.parent)) == before  # the cut does not touch the tree
    # base 1 + 0.9 + 0.45 + 0.05 over 4 rows: 30 pays ((2.4 + 0.8) / 2.0 > 2.4 / 1.75), 40 and 31 not
    assert valid_prefix(p, kept) and len(kept) == 3
    assert merge(b, kept) == 1 and b.tokens == [1, 10, 11, 20, 30]
    # a node of 0.3 pays on a bare root ((1 + 0.3) / 1.25 > 1) but not after the model's tree, which
    # already expects 2.4 tokens from 4 rows ((2.4 + 0.3) / 2.0 < 2.4 / 1.75)
    fair = proposal([-1], [0.3], tokens=[40])
    assert len(trim(fair, steep())) == 1 and len(trim_merged(model_tree(), fair, steep())) == 0
    shared_only = proposal([-1, 0], [1.0, 1.0], tokens=[10, 11])
    assert trim_merged(model_tree(), shared_only, steep()) is shared_only  # nothing to add, nothing cut


def test_merging_the_cut_adds_a_prefix_of_the_whole_merge() -> None:
    """For every curve slope: merging the kept prefix adds exactly the first nodes the whole
    proposal's merge adds (merge decides each node from the ones before it only)."""
    for p in random_proposals(30):
        full = model_tree()
        merge(full, p)
        for slope in (0.0, 0.02, 0.1, 0.3, 1.0):
            b = model_tree()
            kept = trim_merged(b, p, CostProfile((1, 2), (1.0, 1.0 + slope)))
            added = merge(b, kept)
            assert b.tokens == full.tokens[:4 + added] and b.parent == full.parent[:4 + added]
            validate(b.freeze())


# ------------------------------------------------------------------------------- wiring
def test_text_draft_trim_field_and_curves() -> None:
    assert TextDraft().trim is True
    with pytest.raises(DynaTreeError, match="trim"):
        TextDraft(trim="yes")  # type: ignore[arg-type]
    assert TextDraft().cost_curve("cpu") == cpu()
    assert TextDraft(trim=False).cost_curve("cpu") is None
    assert TextDraft().cost_curve("mps") is None  # no default curve: no cut
    gpu = TextDraft().cost_curve("cuda")
    assert gpu is not None and gpu.cost(1) == gpu.cost(17) == gpu.cost(300)
    curve = cpu()  # the recorded CPU curve rises: more rows never cost less
    assert all(curve.cost(r) <= curve.cost(r + 1) for r in range(1, 64))


def test_a_measured_profile_replaces_the_default_curve() -> None:
    def opened(config: TextDraft, profile: CostProfile | None) -> TextProposer:
        return TextProposer.open(config, context(cost_profile=lambda: profile))

    assert TextProposer.wants_cost_model(TextDraft()) and opened(TextDraft(), None).cost == cpu()
    # (none measured: the default curve stays)
    assert opened(TextDraft(), steep()).cost == steep()
    off = opened(TextDraft(trim=False), steep())
    assert not TextProposer.wants_cost_model(TextDraft(trim=False)) and off.cost is None


def context(**fields):
    """A run context on the tiny Llama target (hf engine), with ``fields`` set."""
    from dynatree.core.proposer import RunContext
    from dynatree.options import EngineOptions
    from dynatree.runtime.cache import CachedModel
    from dynatree.runtime.engines import resolve

    target = tiny_model("llama", seed=1)
    return RunContext(target, CachedModel(target, VOCAB), VOCAB, resolve(EngineOptions(engine="hf"), target), 64,
                      **fields)


def uncertain_prompt(n: int = 80, seed: int = 0) -> list[int]:
    """Tokens from a 4-token alphabet: everything repeats, with several continuations each time."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(2, 6, (n,), generator=g)).tolist()


@pytest.mark.parametrize("confident", [2.0, 1e9])  # hybrid: the model sits out confident rounds / never
@pytest.mark.parametrize("source", ["text", "hybrid"])
def test_the_cut_stays_exact_on_or_off(source: str, confident: float) -> None:
    target = tiny_model("llama", seed=1)
    model = perturbed(target, noise=0.05) if source == "hybrid" else None
    ids = uncertain_prompt()
    runs = {}
    for on in (True, False):
        runs[on] = dynatree.generate(target, TextDraft(model=model, trim=on, confident=confident), ids,
                                     max_new_tokens=40, stopping=NO_EOS)
    ref = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=40, stopping=NO_EOS)
    for r in runs.values():
        assert torch.equal(r.sequences, ref.sequences)
    if source == "text":  # the default CPU curve cuts this prompt's unsure proposals
        nodes = {on: sum(x.drafted for x in r.stats.rounds) / r.stats.num_rounds for on, r in runs.items()}
        assert nodes[True] < nodes[False]


def test_the_loop_hands_a_measured_profile_to_the_text_source(tmp_path, monkeypatch) -> None:
    """With the cost model on, a text-only run (no draft model, so no policy budget) measures the
    target once and its source cuts against that profile: a steep one leaves only plain steps.
    In a hybrid run the text's merged nodes are cut against it too."""
    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(costmodel.ENV_SWITCH, "on")
    measured: list[int] = []

    def fake_measure(kv, sizes, lazy_head, reps=3, clock=None):
        measured.append(len(sizes))
        return CostProfile((1, 2), (1e6, 1e6 * 3))  # every extra row costs two steps

    monkeypatch.setattr(costmodel, "measure", fake_measure)
    target = tiny_model("llama", seed=1)
    ids = uncertain_prompt(seed=1)
    r = dynatree.generate(target, None, ids, max_new_tokens=16, stopping=NO_EOS)
    assert measured == [len(costmodel.default_sizes("cpu", None))] and sum(x.drafted for x in r.stats.rounds) == 0
    full = dynatree.generate(target, TextDraft(trim=False), ids, max_new_tokens=16, stopping=NO_EOS)
    assert measured == [len(costmodel.default_sizes("cpu", None))]  # trim=False asks for no profile
    assert sum(x.drafted for x in full.stats.rounds) > 0 and torch.equal(r.sequences, full.sequences)
    model = perturbed(target, noise=0.05)
    hybrid = {on: dynatree.generate(target, TextDraft(model=model, trim=on, confident=1e9), ids, max_new_tokens=16,
                                    stopping=NO_EOS) for on in (True, False)}
    drafted = {on: sum(x.drafted for x in h.stats.rounds) for on, h in hybrid.items()}
    assert drafted[False] > drafted[True] + 8  # uncut, the text still fills the (empty) model trees
    assert all(torch.equal(h.sequences, r.sequences) for h in hybrid.values())


def test_hybrid_source_gets_the_device_curve() -> None:
    ctx = context()
    assert HybridProposer.open(TextDraft(model=perturbed(ctx.target)), ctx).cost == cpu()
    assert HybridProposer.open(TextDraft(model=perturbed(ctx.target), trim=False), ctx).cost is None
    assert TextProposer.open(None, ctx).cost == cpu()


# ------------------------------------------------------------------------------- the bench
def test_bench_specs_pass_text_trim_to_the_text_draft() -> None:
    from dynatree.bench.runner import draft_for
    from dynatree.bench.specs import parse_strategies

    text, full, hybrid, plain = parse_strategies(
        "dynatree:source=text@t,dynatree:source=text:text_trim=false@tf,dynatree:source=hybrid:text_trim=false@hf,"
        "dynatree:source=text@p2", ensure_autoregressive=False)
    model = tiny_model("llama", seed=2)
    assert draft_for(text, model) is None  # the library's default TextDraft (trim on)
    assert draft_for(full, model) == TextDraft(trim=False)
    h = draft_for(hybrid, model)
    assert isinstance(h, TextDraft) and h.model is model and h.trim is False
    assert full.config["text_trim"] is False and "text_trim" not in text.config
    assert "text_trim" not in full.policy_options
    for bad, msg in (("dynatree:text_trim=false", "needs source=text"),
                     ("dynatree:source=model:text_trim=false", "needs source=text"),
                     ("dynatree:source=text:text_trim=3", "true or false")):
        with pytest.raises(DynaTreeError, match=msg):
            parse_strategies(bad)
