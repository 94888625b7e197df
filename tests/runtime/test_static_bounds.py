"""Every default path of the static engine stays within what it can verify, and never shares state
between target and draft.

Two failures these tests were written against: (1) the static engine verifies at most its largest
bucket of rows per call, while DySpec-threshold's default cap is 768 nodes (DySpec's 64, a fixed
tree's 256): the first round failed with "static cache capacity exceeded"; now every policy and
source sizes its tree with ``TreeBuilder.cap``. (2) The engine pool keyed static caches on the
model alone, so the target passed as its own draft got the target's own cache object once both
capacities rounded to the same size (a prompt of ~700 tokens): the draft's prefill wrote into the
target's cache and the output differed from HF greedy with no error.
"""

from __future__ import annotations

import pytest
import torch
from tiny import hf_greedy, llama_pair

import dynatree
from dynatree.core.tree import TreeBuilder
from dynatree.drafts.suffix import TextDraft
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions
from dynatree.policies import make_policy
from dynatree.runtime import engines
from dynatree.runtime.cache import StaticCachedModel

STRATEGIES = ("linear", "fixed", "dynatree", "dyspec", "dyspec-threshold")
CPU_BUCKETS = (1, 2, 4, 8, 16, 32)  # the CPU auto buckets (dynatree.tuning.CPU_AUTO_BUCKETS)


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    return llama_pair()


class RowSpy:
    """Records the row count of every static-engine call (what must stay within the buckets)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows: list[int] = []
        run = StaticCachedModel._run

        def spy(kv, tokens, *args, **kwargs):
            if not kv._prefilling:
                self.rows.append(torch.as_tensor(tokens).numel())
            return run(kv, tokens, *args, **kwargs)

        monkeypatch.setattr(StaticCachedModel, "_run", spy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_at_its_defaults_runs_on_small_buckets(pair, strategy: str, monkeypatch) -> None:
    """Default budgets (768, 256, 64 nodes) on buckets up to 32 rows: capped, and still exact."""
    target, draft = pair
    ids = torch.tensor([[5, 9, 17, 3, 44, 12]])
    spy = RowSpy(monkeypatch)
    out = dynatree.generate(target, draft, ids, strategy, max_new_tokens=24, seed=0,
                            options=EngineOptions(engine="static", buckets=CPU_BUCKETS), text=False)
    assert out.sequences.tolist() == hf_greedy(target, ids, 24).tolist()
    assert spy.rows and max(spy.rows) <= CPU_BUCKETS[-1]
    drafted = [r.drafted for r in out.stats.rounds]
    assert max(drafted) <= CPU_BUCKETS[-1] - 1


def test_dyspec_threshold_at_the_papers_cap_fills_the_largest_bucket(pair, monkeypatch) -> None:
    """The probe of the report: at the paper's cap (768) the threshold variant grows trees larger
    than any bucket; capped, its trees reach the largest bucket exactly (the cap binds)."""
    target, draft = pair
    ids = torch.tensor([[7, 3, 29, 30, 2]])
    out = dynatree.generate(target, draft, ids, "dyspec-threshold", max_new_tokens=12, seed=1, max_nodes=768,
                            options=EngineOptions(engine="static", buckets=(1, 4, 16)), text=False)
    assert out.sequences.tolist() == hf_greedy(target, ids, 12).tolist()
    assert max(r.drafted for r in out.stats.rounds) == 15


@pytest.mark.parametrize("budget", [16, 64])
def test_text_and_hybrid_sources_are_capped(pair, budget: int) -> None:
    target, draft = pair
    ids = torch.tensor([[4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6]])
    want = hf_greedy(target, ids, 20).tolist()
    options = EngineOptions(engine="static", buckets=(1, 2, 4, 8))
    for source in (TextDraft(budget=budget, trim=False), TextDraft(model=draft, budget=budget, trim=False)):
        out = dynatree.generate(target, source, ids, "dyspec", max_new_tokens=20, seed=0, options=options, text=False)
        assert out.sequences.tolist() == want
        assert max(r.drafted for r in out.stats.rounds) <= 7


def test_builder_caps_budgets_and_refuses_past_its_limit() -> None:
    b = TreeBuilder(0, max_rows=4)
    assert (b.cap(10), b.cap(2)) == (3, 2)
    assert TreeBuilder(0).cap(10) == 10
    for i in range(3):
        b.add(i, 1, 0.0)
    with pytest.raises(DynaTreeError, match="at most 4"):
        b.add(0, 2, 0.0)


def test_every_policy_respects_the_builder_cap(pair) -> None:
    """One round of each policy at a generous budget into a 6-row builder: at most 5 nodes."""
    from dynatree.core.sampling import DraftSampler
    from dynatree.drafts.model import ModelProposer
    from dynatree.runtime.cache import CachedModel

    _, draft = pair
    for name, options in [("linear", {"k": 12}), ("fixed", {"max_nodes": 40, "tau": 0.0}),
                          ("dynatree", {"max_nodes": 40, "tau": 0.0}), ("dyspec", {"max_nodes": 40}),
                          ("dyspec-threshold", {"max_nodes": 40, "threshold": 0.001})]:
        policy = make_policy(name, **options)
        with torch.inference_mode():
            drafter = ModelProposer(CachedModel(draft, draft.config.vocab_size), policy,
                              DraftSampler(torch.Generator().manual_seed(0), 1.0))
            drafter.prefill([3, 4, 5])
            builder = TreeBuilder(5, max_rows=6)
            drafter.propose(builder)
        assert len(builder) == 6, name  # the cap binds (each would grow more) and is never passed


def test_target_as_its_own_draft_gets_its_own_cache(pair) -> None:
    """A 700-token prompt and 100 new tokens: target and draft caches round to the same capacity.
    With one shared object the draft's prefill overwrote the target's rows (silently wrong)."""
    target, _ = pair
    ids = torch.randint(2, 96, (1, 700), generator=torch.Generator().manual_seed(3))
    out = dynatree.generate(target, target, ids, "linear", max_new_tokens=100,
                            options=EngineOptions(engine="static", buckets=(1, 2, 4, 8)), text=False)
    assert out.sequences.tolist() == hf_greedy(target, ids, 100).tolist()
    pool = engines.DEFAULT_POOL.entries(target)
    roles = {key[0] for key in pool}
    assert roles == {"target", "draft"}
    assert len({id(kv) for kv in pool.values()}) == len(pool)  # distinct objects


def test_cached_model_refuses_an_unknown_role(pair) -> None:
    target, _ = pair
    with pytest.raises(DynaTreeError, match="role"):
        engines.cached_model(target, 96, "static", 64, EngineOptions(engine="static", compile=False,
                                                                      cpu_linear=False).cache_options("cpu"),
                             role="both")


@pytest.mark.parametrize("strategy", ["linear", "fixed", "dynatree", "dyspec", "dyspec-threshold"])
def test_no_tree_is_deeper_than_the_tokens_left(pair, strategy: str) -> None:
    """A node deeper than the tokens still to generate could never be committed, and one at
    exactly that depth only stands in for the target's own bonus token: drafting and verifying
    them only costs (a two-token call of linear k=5 ran 4 draft forwards for 2 tokens). The last
    token of a call is a plain target step."""
    target, draft = pair
    ids = torch.tensor([[5, 9, 17, 3, 44, 12]])
    options = {"linear": {"k": 6}, "fixed": {"depth": 5, "tau": 0.0}, "dynatree": {"tau": 0.0, "d0": 5, "d_max": 6},
               "dyspec": {"max_nodes": 64}, "dyspec-threshold": {"threshold": 1e-4}}
    for n in (1, 2, 5):
        out = dynatree.generate(target, draft, ids, strategy, max_new_tokens=n, **options[strategy], text=False)
        assert out.sequences.tolist() == hf_greedy(target, ids, n).tolist()
        left = n
        for r in out.stats.rounds:
            assert r.depth <= left - 1, (n, [x.depth for x in out.stats.rounds])
            left -= r.committed
    one = dynatree.generate(target, draft, ids, strategy, max_new_tokens=1, **options[strategy], text=False)
    assert [(r.drafted, r.draft_calls) for r in one.stats.rounds] == [(0, 0)]  # one plain step
    two = dynatree.generate(target, draft, ids, strategy, max_new_tokens=2, **options[strategy], text=False)
    # the root's children only, from the draft's prefill: no draft call, no level past depth 1
    assert two.stats.rounds[0].draft_calls == 0 and two.stats.rounds[0].depth == 1
