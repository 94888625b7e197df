"""The cost-model tree budget: pure choice on fake cost curves, the on-disk cache, and the policy
and engine wiring. No test reads the real clock: profiles are fakes, measurement is stubbed."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import VOCAB, perturbed, tiny_model

import dynatree
from dynatree.core import costmodel
from dynatree.core.costmodel import CostProfile, choose_budget, choose_share, last_row_weights, max_useful_nodes
from dynatree.errors import DynaTreeError
from dynatree.options import StoppingConfig
from dynatree.policies import make_policy

NO_EOS = StoppingConfig(eos_token_id=())

GAINS = [0.9, 0.8, 0.6, 0.4, 0.2, 0.1]


def flat(n: int = 64) -> CostProfile:
    return CostProfile((1, n), (10.0, 10.0))


def steep(n: int = 64) -> CostProfile:
    """Every extra row costs as much as the first: speculation can never pay. Seconds per row, so
    the live drafting/commit overhead the policy adds (milliseconds) cannot change a decision."""
    return CostProfile((1, n), (1e6, 1e6 * n))


# ------------------------------------------------------------------------------ the profile
def test_profile_validates() -> None:
    with pytest.raises(DynaTreeError, match="one time per row count"):
        CostProfile((1, 2), (1.0,))
    with pytest.raises(DynaTreeError, match="ascending"):
        CostProfile((2, 2), (1.0, 1.0))
    with pytest.raises(DynaTreeError, match="ascending"):
        CostProfile((0, 2), (1.0, 1.0))
    with pytest.raises(DynaTreeError, match="positive"):
        CostProfile((1, 2), (1.0, 0.0))


def test_cost_interpolates_or_steps() -> None:
    lin = CostProfile((1, 4, 8), (10.0, 13.0, 21.0))
    assert lin.cost(1) == 10.0 and lin.cost(2) == 11.0 and lin.cost(6) == 17.0
    assert lin.cost(10) == 25.0  # last slope extended
    step = CostProfile((1, 4, 8), (10.0, 13.0, 21.0), stepwise=True)
    assert step.cost(2) == 13.0 and step.cost(5) == 21.0 and step.cost(8) == 21.0


def test_profile_json_round_trip() -> None:
    p = CostProfile((1, 2, 4), (5.0, 6.0, 9.5), stepwise=True, meta={"reps": 3})
    q = CostProfile.from_json(json.loads(json.dumps(p.to_json())))
    assert q == p and q.meta == {"reps": 3}


# ------------------------------------------------------------------------------- the choice
def test_flat_cost_takes_every_node_steep_cost_none() -> None:
    assert choose_budget(flat(), GAINS) == len(GAINS)
    assert choose_budget(steep(), GAINS) == 0


def test_budget_shrinks_as_cost_steepens() -> None:
    chosen = [choose_budget(lambda r, s=s: 1.0 + s * (r - 1), GAINS) for s in (0.0, 0.05, 0.1, 0.3, 1.0)]
    assert chosen == sorted(chosen, reverse=True)
    assert chosen[0] == 6 and chosen[-1] == 0
    # worked example, slope 0.1: (1 + G(n)) / (1 + 0.1 n) = 1, 1.73, 2.25, 2.54, 2.64, 2.60, 2.56
    assert choose_budget(lambda r: 1.0 + 0.1 * (r - 1), GAINS) == 4


def test_bucket_step_paid_back_later_is_crossed() -> None:
    # 5..8 rows cost one padded bucket: stopping at the first drop would keep 3 nodes
    step = CostProfile((1, 2, 4, 8), (10.0, 10.0, 10.0, 14.0), stepwise=True)
    assert choose_budget(step, [0.9] * 7) == 7
    assert choose_budget(step, [0.9, 0.9, 0.9, 0.05, 0.05, 0.05, 0.05]) == 3


def test_overhead_makes_rows_cheaper() -> None:
    line = lambda r: float(r)
    assert choose_budget(line, GAINS[:3]) == 0
    assert choose_budget(line, GAINS[:3], overhead_ms=10.0) == 3
    with pytest.raises(DynaTreeError):
        choose_budget(line, GAINS, overhead_ms=-1.0)


def test_limit_and_max_useful_nodes() -> None:
    assert choose_budget(flat(), GAINS, limit=2) == 2
    assert max_useful_nodes(flat(16)) == 15
    assert max_useful_nodes(steep(16)) == 0


# -------------------------------------------------------------------- a batch's share
def test_share_flat_takes_the_widest_tree_steep_none() -> None:
    rows = [[0.9, 0.8, 0.5], [0.7], []]
    assert choose_share(flat(), rows) == 4  # the widest tree: 1 root + 3 nodes
    assert choose_share(flat(), rows, limit=2) == 2
    assert choose_share(lambda r: float(r), rows) == 1  # each row costs a step: no tree pays
    assert choose_share(flat(), []) == 1 and choose_share(flat(), [[], []]) == 1


def test_share_pays_for_every_rows_padding() -> None:
    """The batch pays for rows x share, so one confident row among plain ones does not buy a share
    that a lone row would take. Worked example, cost 1 + 0.1 (R - 1):
    one row, gains 0.9 0.9 0.9: (1, 1.9, 2.8, 3.7) / (1, 1.1, 1.2, 1.3) -> share 4;
    the same row beside 7 rows with nothing: (8, 8.9, 9.8, 10.7) / (1.7, 2.5, 3.3, 4.1) -> share 1."""
    cost = lambda r: 1.0 + 0.1 * (r - 1)
    assert choose_share(cost, [[0.9, 0.9, 0.9]]) == 4
    assert choose_share(cost, [[0.9, 0.9, 0.9]] + [[]] * 7) == 1
    assert choose_share(cost, [[0.9, 0.9, 0.9]] * 8) == 4


def test_share_shrinks_as_the_batch_grows() -> None:
    """The same trees per row on a curve flat to 16 rows and steep after: the wider the batch,
    the smaller the share, down to plain steps."""
    curve = CostProfile((1, 16, 32), (1.0, 1.0, 3.0))
    tree = [0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1]
    shares = [choose_share(curve, [tree] * b) for b in (1, 2, 4, 8, 16)]
    assert shares == [8, 8, 4, 2, 1]


def test_a_rows_weight_follows_its_chance_of_finishing_last() -> None:
    """Rows tied for last weigh 1 each; a row far ahead weighs the per-row part of a step; a lone
    laggard the rest of the step on top; the weights average 1 (the batch's expected time is
    unchanged when nothing is known)."""
    assert last_row_weights([50.0] * 4, 0.7, 2.0) == pytest.approx([1.0] * 4)
    w = last_row_weights([50.0, 10.0, 50.0, 50.0], 0.7, 2.0)
    assert w[1] == pytest.approx(0.7) and w[0] == pytest.approx(0.7 + 0.3 * 4 / 3, rel=1e-6)
    lone = last_row_weights([90.0, 10.0, 10.0, 10.0], 0.7, 2.0)
    assert lone[0] == pytest.approx(0.7 + 0.3 * 4) and sum(lone) == pytest.approx(4.0)
    near = last_row_weights([50.0, 49.0], 0.5, 2.0)  # (one round apart: still a chance)
    assert 1.0 < near[0] < 1.5 and 0.5 < near[1] < 1.0
    assert last_row_weights([], 0.7, 2.0) == []
    assert last_row_weights([5.0, 1.0], 1.0, 2.0) == [1.0, 1.0]  # (rows are all a step costs: no end effect)
    for bad in ((-0.1, 2.0), (1.1, 2.0), (0.5, 0.0)):
        with pytest.raises(DynaTreeError):
            last_row_weights([1.0], *bad)


def test_a_tree_on_the_last_row_buys_a_share_the_same_tree_ahead_does_not() -> None:
    """4 rows, a second row per row costs 30% more: one row's node at 0.8 does not pay (4.8 / 1.3 <
    4) unweighted, nor on a row far ahead, but does on the lone last row (weight 1.9: 5.52 / 1.3 >
    4). A drafting overhead counts against every share but the plain one."""
    cost = CostProfile((1, 4, 8), (1.0, 1.0, 1.3))
    gains = [[0.8], [], [], []]
    assert choose_share(cost, gains) == 1
    assert choose_share(cost, gains, weights=last_row_weights([10.0, 90.0, 90.0, 90.0], 0.7, 2.0)) == 1
    assert choose_share(cost, gains, weights=last_row_weights([90.0, 10.0, 10.0, 10.0], 0.7, 2.0)) == 2
    sure = [[1.0], [1.0], [1.0], [1.0]]
    assert choose_share(cost, sure) == 2 and choose_share(cost, sure, overhead=2.0) == 1
    with pytest.raises(DynaTreeError):
        choose_share(cost, gains, weights=[1.0])
    with pytest.raises(DynaTreeError):
        choose_share(cost, gains, overhead=-1.0)


# ------------------------------------------------------------------------- the disk cache
def test_cache_round_trip(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path))
    key = {"model": "m", "threads": 2}
    assert costmodel.load(key) is None
    path = costmodel.save(key, CostProfile((1, 2), (3.0, 4.0)))
    assert path.parent == tmp_path / "costmodel"
    assert costmodel.load(key) == CostProfile((1, 2), (3.0, 4.0))
    assert costmodel.load({**key, "threads": 4}) is None  # another key, another profile
    path.write_text("{not json")
    assert costmodel.load(key) is None  # a torn/corrupt file is a cache miss, not a crash


def test_key_separates_models_and_threads() -> None:
    a, b = tiny_model("llama", 0), tiny_model("llama", 1)
    ka, kb = costmodel.profile_key(a, "hf", False), costmodel.profile_key(b, "hf", False)
    assert ka != kb
    assert ka["device"] == "cpu" and ka["dtype"] == "float32" and ka["threads"] == torch.get_num_threads()
    assert costmodel.profile_key(a, "static", True) != ka


# --------------------------------------------------------------------- policy and engine
@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", 0)
    return target, perturbed(target, noise=0.01)


def _ids() -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))


def _run(pair, profile: CostProfile | None, **options):
    policy = make_policy("dynatree", tau=0.0, **options)
    if profile is not None:
        policy.use_cost_model(profile)
    return dynatree.generate(pair[0], pair[1], _ids(), policy, max_new_tokens=24, stopping=NO_EOS, text=False)


def test_fake_profiles_move_the_tree_size_and_stay_exact(pair, monkeypatch) -> None:
    monkeypatch.setenv(costmodel.ENV_SWITCH, "trim")  # (the per-round cut)
    ar = dynatree.generate(pair[0], None, _ids(), "autoregressive", max_new_tokens=24, stopping=NO_EOS)
    wide, none = _run(pair, flat(32)), _run(pair, steep(32))
    drafted = lambda r: sum(x.drafted for x in r.stats.rounds) / r.stats.num_rounds
    assert drafted(wide) > 3  # beyond the fixed CPU fallback of 3 nodes
    assert max(x.drafted for x in none.stats.rounds) <= 1  # only the periodic one-node probe
    assert drafted(none) <= 1 / 8 + 1e-9  # at most one probe per window (8) of empty rounds
    assert drafted(wide) > drafted(none)
    for r in (wide, none):
        assert torch.equal(r.sequences, ar.sequences)
    assert all("budget" in x.policy_state for x in wide.stats.rounds)


def test_pinned_max_nodes_ignores_profile(pair) -> None:
    r = _run(pair, flat(32), max_nodes=2)
    assert max(x.drafted for x in r.stats.rounds) <= 2
    assert make_policy("dynatree", max_nodes=2).wants_cost_model() is False


def test_engine_loads_cached_profile_without_measuring(pair, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(costmodel.ENV_SWITCH, "on")
    measured: list[int] = []

    def fake_measure(kv, sizes, lazy_head, reps=3, clock=None):
        measured.append(len(sizes))
        return steep(32)

    monkeypatch.setattr(costmodel, "measure", fake_measure)
    policy = make_policy("dynatree", tau=0.0)
    first = dynatree.generate(pair[0], pair[1], _ids(), policy, max_new_tokens=8, stopping=NO_EOS, text=False)
    assert measured == [len(costmodel.default_sizes("cpu", None))] and first.stats.cost_profile == steep(32)
    assert policy.cost_profile is None  # (the caller's policy is not changed: the run's copy is)
    assert len(list((tmp_path / "costmodel").glob("*.json"))) == 1
    again = make_policy("dynatree", tau=0.0)
    r = dynatree.generate(pair[0], pair[1], _ids(), again, max_new_tokens=8, stopping=NO_EOS, text=False)
    assert measured == [len(costmodel.default_sizes("cpu", None))]  # second run: from disk
    assert r.stats.cost_profile == steep(32) and max(x.drafted for x in r.stats.rounds) <= 1  # (its budget)


def test_switched_off_uses_fixed_budget(pair, monkeypatch) -> None:
    monkeypatch.setenv(costmodel.ENV_SWITCH, "off")
    policy = make_policy("dynatree", tau=0.0)
    r = dynatree.generate(pair[0], pair[1], _ids(), policy, max_new_tokens=8, stopping=NO_EOS, text=False)
    assert r.stats.cost_profile is None and max(x.drafted for x in r.stats.rounds) <= 3


def test_measure_leaves_cache_empty_with_fake_clock(pair) -> None:
    from dynatree.runtime.cache import CachedModel

    kv = CachedModel(pair[0], VOCAB)
    ticks = iter(range(10_000))
    with torch.inference_mode():
        p = costmodel.measure(kv, (1, 2, 4), lazy_head=False, reps=2, clock=lambda: float(next(ticks)))
    assert p.rows == (1, 2, 4) and all(m == 1000.0 for m in p.ms) and not p.stepwise
    assert kv.length == 0


def test_bench_records_budget_and_report_plots_profile(pair, tmp_path, monkeypatch) -> None:
    from dynatree.bench.report import build_report
    from dynatree.bench.runner import BenchSettings, Prompt, run_bench
    from dynatree.bench.specs import parse_strategies
    from dynatree.bench.store import ResultsWriter

    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(costmodel.ENV_SWITCH, "on")
    monkeypatch.setattr(costmodel, "measure", lambda *a, **k: flat(32))
    settings = BenchSettings(target="tiny", draft="tiny-perturbed", dataset="random", max_new_tokens=12)
    prompts = [Prompt("p0", tuple(_ids()[0].tolist()))]
    specs = parse_strategies("autoregressive,dynatree:tau=0.0@auto,dynatree:tau=0.0:max_nodes=2@pinned")
    with ResultsWriter(tmp_path / "r.jsonl") as w:
        out = run_bench(pair[0], pair[1], prompts, specs, settings, writer=w, warmup=0, progress=False)
    by_label = {r["label"]: r for r in out.rows}
    auto = by_label["auto"]["stats"]
    assert auto["cost_profile"] == {"rows": [1, 32], "ms": [10.0, 10.0], "stepwise": False}
    assert auto["budget"] > 3
    assert "budget" not in by_label["pinned"]["stats"] and "cost_profile" not in by_label["pinned"]["stats"]
    rep = build_report(tmp_path / "r.jsonl", tmp_path / "report")
    assert "Tree budget from the verify-cost profile" in rep.text
    assert any(f.name.startswith("cost-profile") and f.exists() for f in rep.figures)


# ------------------------------------------------------------------ the budget read off the curve
def test_node_budget_is_the_flat_part_of_the_curve() -> None:
    """The most nodes whose verify costs at most step_cost one-row steps, interpolating between
    measured sizes: curves shaped like those measured on the 2-core EPYC (SmolLM2-135M, and a
    1.5B-parameter model with oneDNN's packed kernels) give 3 and 10 nodes at 1.2."""
    smollm = CostProfile((1, 2, 4, 6, 8, 16, 32), (35.0, 36.0, 41.0, 44.0, 48.0, 56.0, 79.0))
    qwen15 = CostProfile((1, 2, 4, 8, 16, 32), (253.0, 256.0, 249.0, 281.0, 339.0, 550.0))
    assert costmodel.node_budget(smollm, step_cost=1.2) == 3  # 4 rows 1.17; 5 rows 1.21 (interpolated)
    assert costmodel.node_budget(qwen15, step_cost=1.2) == 10  # 11 rows 1.20: 281 + 3/8 * 58 = 302.75 <= 303.6
    assert costmodel.node_budget(qwen15, step_cost=1.3) == 13
    assert costmodel.node_budget(flat(32)) == 31 and costmodel.node_budget(steep(32)) == 1


@pytest.mark.parametrize("strategy", ["dynatree", "dyspec", "dyspec-threshold"])
def test_every_budgeted_policy_reads_the_measured_curve(strategy: str, pair, monkeypatch) -> None:
    """Measured by default (no trim): each policy's trees stay within the curve's budget, a flat
    curve lets them grow past the hand-tuned CPU table (3 nodes), and a pinned max_nodes wins."""
    from dynatree import SamplingConfig

    monkeypatch.setenv(costmodel.ENV_SWITCH, "measure")
    sampled = strategy != "dynatree"
    kw = dict(sampling=SamplingConfig(temperature=1.0), seed=0) if sampled else {}
    options = {} if sampled else {"tau": 0.0}
    sizes = {}
    for name, profile in (("flat", flat(12)), ("steep", steep(32))):
        policy = make_policy(strategy, **options)
        assert policy.wants_cost_model()
        policy.use_cost_model(profile)
        r = dynatree.generate(pair[0], pair[1], _ids(), policy, max_new_tokens=24, stopping=NO_EOS, text=False, **kw)
        sizes[name] = max(x.drafted for x in r.stats.rounds)
    assert sizes["steep"] <= 1 < 3 < sizes["flat"] <= 11
    pinned = make_policy(strategy, max_nodes=2, **options)
    assert not pinned.wants_cost_model()


def test_a_disordered_measurement_is_measured_again(pair) -> None:
    """A clock that makes the first timed one-row call slow (something else ran): the curve says one
    row costs more than four, so the measurement adds a round and keeps the fastest (one row at 1 s
    again); with no extra rounds allowed the slow call stays (the control)."""
    from dynatree.runtime.cache import CachedModel

    assert costmodel.disordered({1: 2.0, 2: 1.0, 4: 1.5}) and not costmodel.disordered({1: 1.0, 2: 1.1, 4: 0.9})

    def clock_slow_once():
        state = {"t": 0.0, "calls": 0}

        def tick() -> float:
            state["calls"] += 1
            # calls 1-6: warm-ups (3 sizes, start and stop each); call 7: the first timed call's start
            state["t"] += 3.0 if state["calls"] == 8 else 1.0
            return state["t"]
        return tick

    kv = CachedModel(pair[0], VOCAB)
    with torch.inference_mode():
        p = costmodel.measure(kv, (1, 2, 4), lazy_head=False, reps=1, clock=clock_slow_once())
        assert p.ms == (1000.0, 1000.0, 1000.0)
        old = costmodel.EXTRA_ROUNDS
        try:
            costmodel.EXTRA_ROUNDS = 0
            p = costmodel.measure(kv, (1, 2, 4), lazy_head=False, reps=1, clock=clock_slow_once())
        finally:
            costmodel.EXTRA_ROUNDS = old
        assert p.ms == (3000.0, 1000.0, 1000.0)


def test_holds_compares_a_cached_profile_with_the_machine_now(pair) -> None:
    """The check times the profile's smallest and largest size as the measurement does (a fake
    clock: 1 s a call); a profile that says more than STALE times that no longer holds."""
    from dynatree.runtime.cache import CachedModel

    kv = CachedModel(pair[0], VOCAB)

    def holds(ms: tuple[float, ...]) -> bool:
        ticks = iter(range(10_000))
        return costmodel.holds(kv, CostProfile((1, 2, 4), ms), False, clock=lambda: float(next(ticks)))

    with torch.inference_mode():
        assert holds((1000.0, 1000.0, 1000.0)) and holds((1240.0, 3000.0, 1240.0))  # (2 rows is not checked)
        assert not holds((1300.0, 1000.0, 1000.0)) and not holds((1000.0, 1000.0, 1300.0))
    assert kv.length == 0


def test_a_cached_profile_that_no_longer_holds_is_measured_again_once_per_process(pair, tmp_path, monkeypatch) -> None:
    """Read from disk, a profile is checked once per process; where the check says it no longer
    holds, it is measured again and saved; the check is not asked twice, nor of a fresh one, nor
    with the check switched off."""
    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(costmodel.ENV_SWITCH, "on")
    monkeypatch.setenv(costmodel.CHECK_ENV_SWITCH, "on")
    monkeypatch.setattr(costmodel, "_CHECKED", set())
    measured, checked, verdict = [], [], {"holds": True}
    monkeypatch.setattr(costmodel, "measure", lambda kv, sizes, lazy_head, **kw: measured.append(1) or steep(32))
    monkeypatch.setattr(costmodel, "holds", lambda kv, p, lazy_head, **kw: checked.append(p) or verdict["holds"])

    def run() -> None:
        dynatree.generate(pair[0], pair[1], _ids(), make_policy("dynatree", tau=0.0), max_new_tokens=4,
                          stopping=NO_EOS, text=False)

    run()
    assert (len(measured), len(checked)) == (1, 0)  # (measured now: nothing to check)
    run()
    run()
    assert (len(measured), len(checked)) == (1, 1) and checked[0] == steep(32)  # (read; checked once)
    monkeypatch.setattr(costmodel, "_CHECKED", set())  # (a new process)
    verdict["holds"] = False
    run()
    run()
    assert (len(measured), len(checked)) == (2, 2)  # (measured again once, then read)
    monkeypatch.setattr(costmodel, "_CHECKED", set())
    monkeypatch.setenv(costmodel.CHECK_ENV_SWITCH, "off")
    run()
    assert (len(measured), len(checked)) == (2, 2)
