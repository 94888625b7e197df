"""DySpec trees: heap expansion (Alg. 1) and threshold layers (Alg. 2) against slow references.

The references recompute every draft distribution from scratch (full forward of prompt + path, no
cache, no tree mask) and expand one node at a time with a linear scan instead of a heap, drawing
from the same seeded stream in the same order; so equal trees also show that the level-batched,
tree-masked draft calls feed the policies the right distributions.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny import perturbed, tiny_model
from tolerances import path_rel, sum_rel

from dynatree.runtime.cache import CachedModel
from dynatree.drafts.model import ModelProposer
from dynatree.errors import DynaTreeError
from dynatree.policies import make_policy
from dynatree.core.sampling import DraftSampler, draft_probs, draw, without
from dynatree.core.tree import TokenTree, TreeBuilder, children_lists, validate

V = 24
PROMPT = [3, 5, 7]


@pytest.fixture(scope="module")
def draft() -> torch.nn.Module:
    # small init: flat draft distributions, so trees branch and the budget, not the support, binds
    return perturbed(tiny_model("llama", 11, vocab=V, layers=1, init=0.15), 0.3, 2)


def build(policy, draft: torch.nn.Module, seed: int, temperature: float = 0.6) -> tuple[TokenTree, int]:
    """Run one round of ``policy`` on the real drafter; returns the tree and its draft calls."""
    with torch.inference_mode():
        drafter = ModelProposer(CachedModel(draft, V), sampler=DraftSampler(torch.Generator().manual_seed(seed), temperature))
        drafter.prefill(PROMPT)
        builder = TreeBuilder(PROMPT[-1])
        root_logits = drafter.begin_round(builder)
        policy.build(builder, drafter, root_logits)
    tree = builder.freeze()
    validate(tree)
    return tree, drafter.calls


class SlowDraft:
    """Draft distribution of a node by a full forward of prompt + path (no cache, no tree mask)."""

    def __init__(self, draft: torch.nn.Module, temperature: float) -> None:
        self.draft, self.temperature = draft, temperature

    def __call__(self, tokens: list[int], parent: list[int], node: int) -> torch.Tensor:
        path = []
        while node > 0:
            path.append(tokens[node])
            node = parent[node]
        with torch.inference_mode():
            logits = self.draft(torch.tensor([PROMPT + path[::-1]])).logits[0, -1]
        return draft_probs(logits, self.temperature)


def ref_heap(draft: torch.nn.Module, budget: int, seed: int, temperature: float = 0.6):
    """Alg. 1 one node at a time: candidates in a list, best = highest value, then oldest."""
    g, dist = torch.Generator().manual_seed(seed), SlowDraft(draft, temperature)
    tokens, parent, values = [PROMPT[-1]], [-1], []
    order = itertools.count()
    cands = [(1.0, next(order), 0, None)]
    while cands and len(tokens) - 1 < budget:
        best = max(range(len(cands)), key=lambda i: (cands[i][0], -cands[i][1]))
        v, _, node, res = cands.pop(best)
        if res is None:
            res = dist(tokens, parent, node)
        y = draw(res, g)
        r_y = float(res[y])
        tokens.append(y)
        parent.append(node)
        values.append(v * r_y)
        rest = without(res, y) if r_y < 1.0 else None
        if rest is not None:
            cands.append((v * (1.0 - r_y), next(order), node, rest))
        cands.append((v * r_y, next(order), len(tokens) - 1, None))
    return tokens, parent, values


def ref_threshold(draft: torch.nn.Module, t: float, cap: int, seed: int, temperature: float = 0.6):
    """Alg. 2 with `while v >= t`, node by node."""
    g, dist = torch.Generator().manual_seed(seed), SlowDraft(draft, temperature)
    tokens, parent, values = [PROMPT[-1]], [-1], []
    leaves = [(0, 1.0)]
    while leaves:
        new = []
        for node, v in leaves:
            if v < t or len(tokens) - 1 >= cap:
                continue
            res = dist(tokens, parent, node)
            while res is not None and v >= t and len(tokens) - 1 < cap:
                y = draw(res, g)
                r_y = float(res[y])
                tokens.append(y)
                parent.append(node)
                values.append(v * r_y)
                new.append((len(tokens) - 1, v * r_y))
                v *= 1.0 - r_y
                res = without(res, y) if r_y < 1.0 else None
        leaves = new
    return tokens, parent, values


def depths(parent: list[int]) -> list[int]:
    """Each drafted node's depth (root excluded): its value is a product of that many probabilities."""
    out = [0]
    for p in parent[1:]:
        out.append(out[p] + 1)
    return out[1:]


def assert_same_tree(tree: TokenTree, values: list[float], ref) -> None:
    """Same tokens and parents; each node's value within the bound of its own path (its depth's
    product of softmax probabilities computed by two kernels, ``path_rel``)."""
    tokens, parent, ref_values = ref
    assert tree.tokens.tolist() == tokens
    assert tree.parent.tolist() == parent
    assert len(values) == len(ref_values)
    for v, r, d in zip(values, ref_values, depths(parent)):
        assert v == pytest.approx(r, rel=path_rel(d), abs=1e-12), (v, r, d)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget", [1, 6, 20])
def test_heap_equals_slow_reference_in_both_modes(draft: torch.nn.Module, budget: int, seed: int) -> None:
    ref = ref_heap(draft, budget, seed)
    calls = {}
    for mode in ("batch", "per_node"):
        policy = make_policy("dyspec", max_nodes=budget, mode=mode)
        tree, calls[mode] = build(policy, draft, seed)
        assert_same_tree(tree, policy.values, ref)
        assert tree.num_drafted == budget  # a softmax has full support: the budget always binds
        # the policy's sum of its own values against the sum of the reference's: each term carries
        # its path's bound, which a sum of positive terms does not grow, plus the sum's own rounding
        rel = path_rel(max(depths(ref[1]), default=1)) + sum_rel(len(ref[2]))
        assert policy.state()["expected_accept"] == pytest.approx(sum(ref[2]), rel=rel)
    assert calls["batch"] <= calls["per_node"]


def test_batching_saves_draft_calls(draft: torch.nn.Module) -> None:
    """Same trees, fewer calls; the price is rows run for nodes that are never popped."""
    totals = {"batch": [0, 0], "per_node": [0, 0]}
    for mode, seed in itertools.product(totals, range(4)):
        policy = make_policy("dyspec", max_nodes=24, mode=mode)
        _, calls = build(policy, draft, seed)
        totals[mode][0] += calls
        totals[mode][1] += policy.draft_rows
    (calls_b, rows_b), (calls_p, rows_p) = totals["batch"], totals["per_node"]
    assert calls_b < calls_p
    assert rows_b >= rows_p


def test_heap_values_residuals_and_siblings(draft: torch.nn.Module) -> None:
    policy = make_policy("dyspec", max_nodes=30)
    tree, _ = build(policy, draft, seed=5)
    # A node's value is its draft path probability (App. D, Eq. 11): v * R[y] telescopes to prod d.
    assert policy.values == pytest.approx(tree.cum_logq[1:].exp().tolist(), rel=1e-4)
    assert tree.child_q is not None
    for node, kids in enumerate(children_lists(tree.parent)):
        toks = tree.tokens[kids].tolist()
        assert len(set(toks)) == len(toks), "siblings are sampled without replacement"
        if kids:
            q = tree.child_q[node]
            assert q is not None and float(q.sum()) == pytest.approx(1.0, rel=sum_rel(q.numel()))
            # each child's logq is its probability under the distribution its parent sampled from
            assert tree.logq[kids].tolist() == pytest.approx(q[toks].log().tolist(), rel=1e-5)


def test_exhausted_residual_is_never_extended(draft: torch.nn.Module) -> None:
    """Draft temperature 0: one-hot distributions, so every sibling residual is all zero (value 0)
    and the tree is the draft's greedy chain, every node reached with probability 1."""
    for name, opts in (("dyspec", {"max_nodes": 7}), ("dyspec-threshold", {"threshold": 0.5, "max_nodes": 7})):
        policy = make_policy(name, **opts)
        tree, _ = build(policy, draft, seed=0, temperature=0.0)
        assert tree.parent.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6]
        assert policy.values == [1.0] * 7
        ref = SlowDraft(draft, 1.0)
        toks, par = tree.tokens.tolist(), tree.parent.tolist()
        for node in range(1, 8):
            assert toks[node] == int(ref(toks, par, node - 1).argmax())


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize(("t", "cap"), [(0.05, 64), (0.02, 25), (0.3, 768)])
def test_threshold_equals_slow_reference(draft: torch.nn.Module, t: float, cap: int, seed: int) -> None:
    ref = ref_threshold(draft, t, cap, seed)
    policy = make_policy("dyspec-threshold", threshold=t, max_nodes=cap)
    tree, calls = build(policy, draft, seed)
    assert_same_tree(tree, policy.values, ref)
    assert 1 <= tree.num_drafted <= cap
    layers = sum(  # layers below the root holding a leaf worth >= t
        1 for d in range(1, tree.max_depth + 1)
        if any(v >= t for v, dep in zip(policy.values, tree.depth[1:].tolist()) if dep == d)
    )
    # one call per such layer (none once the cap binds); the root's children come from the prefill
    if tree.num_drafted < cap:
        assert calls == layers
    else:
        assert calls <= layers
    # Every sampling made was worth >= t: a child's reach value before it was sampled is
    # value(parent) * (1 - mass of its earlier siblings).
    values = [1.0, *policy.values]
    assert tree.child_q is not None
    for node, kids in enumerate(children_lists(tree.parent)):
        if kids:
            q = tree.child_q[node]
            mass = torch.cumsum(q[tree.tokens[kids]], 0) - q[tree.tokens[kids]]
            assert all(values[node] * (1 - float(m)) >= t * (1 - 1e-5) for m in mass)


def test_threshold_cap_binds(draft: torch.nn.Module) -> None:
    policy = make_policy("dyspec-threshold", threshold=1e-4, max_nodes=10)
    tree, _ = build(policy, draft, seed=1)
    assert tree.num_drafted == 10


@pytest.mark.parametrize(
    ("name", "opts", "field"),
    [
        ("dyspec", {"max_nodes": 0}, "max_nodes"),
        ("dyspec", {"mode": "level"}, "mode"),
        ("dyspec-threshold", {"threshold": 0.0}, "threshold"),
        ("dyspec-threshold", {"threshold": 1.5}, "threshold"),
        ("dyspec-threshold", {"max_nodes": 5000}, "max_nodes"),
    ],
)
def test_config_validation(name: str, opts: dict, field: str) -> None:
    with pytest.raises(DynaTreeError, match=rf"invalid {field}=") as err:
        make_policy(name, **opts)
    assert "\n" not in str(err.value)


def test_build_without_sampler_is_a_clear_error(draft: torch.nn.Module) -> None:
    policy = make_policy("dyspec")
    builder = TreeBuilder(PROMPT[-1])
    with pytest.raises(RuntimeError, match="sampler"):
        policy.build(builder, ModelProposer(CachedModel(draft, V)), torch.zeros(V))
