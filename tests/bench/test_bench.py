"""Benchmark harness: metric arithmetic, greedy-output check, resumable sweeps, results file, report.

Metric tests use hand-built rows whose expected values are computed by hand in the comments; the
end-to-end tests use the tiny random models (2 prompts, 16 tokens) so the whole file stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from dynatree.bench import runner as runner_mod
from dynatree.bench.metrics import mean_std, row_metrics, paper_path_length, summarize
from dynatree.bench.report import build_report
from dynatree.bench.runner import BenchSettings, Prompt, first_mismatch, run_bench
from dynatree.bench.specs import parse_strategies
from dynatree.bench.store import SCHEMA_VERSION, ResultsWriter, load_results, parse_lines
from dynatree.bench.sweep import SweepGrid, parse_axis, run_sweep
from dynatree.cli import app
from dynatree.errors import DynaTreeError
from tiny import perturbed, tiny_model

T = 16

# ------------------------------------------------------------------------------ synthetic rows
LINEAR_CFG = {"k": 4}
FIXED_CFG = {"depth": 3, "branch": 2, "tau": 0.1, "max_nodes": 256, "root_branching": False, "prune": "keep"}


def dyna_cfg(breadth: bool, depth: bool, history: bool, **over: Any) -> dict[str, Any]:
    cfg = {"b_min": 1, "b_mid": 2, "b_max": 3, "d0": 5, "d_max": 8, "tau_h": 0.9, "history": history,
           "adaptive_breadth": breadth, "adaptive_depth": depth}
    cfg.update(over)
    return cfg


def make_row(group: str, label: str, strategy: str, prompt: str, tps: float, *, config: dict | None = None,
             accepted: list[int] | None = None, drafted: int = 0, origin: str = "bench", dataset: str = "wt2",
             max_new_tokens: int = 100, match: bool = True, mem: float = 1000.0, session: str = "s1") -> dict:
    """A result row whose stats follow from ``tps`` and the per-round accepted counts."""
    accepted = accepted if accepted is not None else [0] * 4
    committed = [a + 1 for a in accepted]
    new = sum(committed)
    total = new / tps
    per_round = [{"committed": c, "accepted": a, "drafted": drafted, "depth": 1, "draft_calls": 1,
                  "t_draft": 0.1 * total / len(accepted), "t_verify": 0.5 * total / len(accepted),
                  "t_commit": 0.1 * total / len(accepted), "policy_state": {}} for c, a in zip(committed, accepted)]
    stats = {"strategy": strategy, "prompt_tokens": 10, "new_tokens": new, "rounds": len(accepted),
             "mean_committed": new / len(accepted), "mean_accepted": sum(accepted) / len(accepted),
             "acceptance": (sum(accepted) / (drafted * len(accepted))) if drafted else 0.0,
             "mean_drafted": float(drafted), "mean_depth": 1.0, "draft_calls": len(accepted),
             "tokens_per_second": tps, "ttft": 0.01, "tpot": 0.002, "t_total": total, "t_prefill": 0.2 * total,
             "t_draft": 0.1 * total, "t_verify": 0.5 * total, "t_commit": 0.1 * total}
    settings = {"target": "t", "draft": "d", "dataset": dataset, "max_new_tokens": max_new_tokens,
                "max_prompt_tokens": 800, "dtype": "float32", "device": "cpu", "threads": 2}
    return {"schema": SCHEMA_VERSION, "key": f"{group}/{label}/{prompt}", "group": group, "session": session,
            "origin": origin, "label": label, "strategy": strategy, "options": {}, "config": config or {},
            "prompt_id": prompt, "settings": settings, "stats": stats, "per_round": per_round,
            "greedy_match": match, "first_mismatch": None if match else 3, "peak_memory_mb": mem,
            "memory_kind": "cuda_max_allocated", "machine": {"cpu": "test-cpu", "cpu_count": 2, "torch_threads": 2},
            "versions": {"torch": "x"}}


# ------------------------------------------------------------------------------ metric arithmetic
def test_mean_std_is_sample_std() -> None:
    agg = mean_std([1.0, 2.0, 3.0, None])
    assert agg is not None and agg.n == 3
    assert agg.mean == pytest.approx(2.0) and agg.std == pytest.approx(1.0)  # sqrt((1+0+1)/2)
    assert mean_std([5.0]).std == 0.0
    assert mean_std([None]) is None


def test_row_metrics_and_paper_acceptance_by_hand() -> None:
    # linear K=4, rounds accepted 4, 2, 0 -> committed 5, 3, 1 = 9 tokens in 3 rounds.
    row = make_row("g", "linear", "linear", "p0", 90.0, config=LINEAR_CFG, accepted=[4, 2, 0], drafted=4)
    m = row_metrics(row)
    assert m["L"] == pytest.approx(3.0)  # 9 / 3
    assert m["ell"] == pytest.approx(2.0)  # 6 / 3
    assert m["acceptance"] == pytest.approx(0.5)  # 6 accepted / 12 drafted
    assert m["paper_path_length"] == pytest.approx(3.0)  # (5 + 3 + 1) / 3: the papers count the bonus
    assert m["paper_acceptance"] == pytest.approx(0.75)  # ℓ̄_paper / K = 3 / 4
    assert m["t_other"] == pytest.approx(0.1 * 9 / 90.0)  # total - (0.2 + 0.1 + 0.5 + 0.1) * total
    # fixed tree D=3 -> denominator D + 2 = 5; DynaTree D_0 = 5 -> 7.
    fixed = make_row("g", "f", "fixed", "p0", 90.0, config=FIXED_CFG, accepted=[4, 2, 0], drafted=6)
    assert row_metrics(fixed)["paper_acceptance"] == pytest.approx(3.0 / 5)
    dyna = make_row("g", "d", "dynatree", "p0", 90.0, config=dyna_cfg(True, True, True), accepted=[6, 6], drafted=10)
    assert row_metrics(dyna)["paper_acceptance"] == pytest.approx(7.0 / 7)  # 100 %: the papers' definition can hit >= 1
    ar = make_row("g", "autoregressive", "autoregressive", "p0", 50.0)
    assert row_metrics(ar)["acceptance"] is None and row_metrics(ar)["paper_acceptance"] is None
    assert paper_path_length([]) is None


def test_speedup_is_against_the_same_groups_autoregressive_run() -> None:
    rows = [
        # group A: AR 100, 120 (mean 110); linear 165, 165 -> speedup 1.5; per-prompt 1.65, 1.375
        make_row("A", "autoregressive", "autoregressive", "p0", 100.0, mem=1000.0),
        make_row("A", "autoregressive", "autoregressive", "p1", 120.0, mem=1000.0),
        make_row("A", "linear", "linear", "p0", 165.0, config=LINEAR_CFG, mem=1030.0),
        make_row("A", "linear", "linear", "p1", 165.0, config=LINEAR_CFG, mem=1030.0, match=False),
        # group B: a faster machine; AR 200, linear 220, 260 -> 1.2 (NOT 240 / 110)
        make_row("B", "autoregressive", "autoregressive", "p0", 200.0, session="s2"),
        make_row("B", "autoregressive", "autoregressive", "p1", 200.0, session="s3"),
        make_row("B", "linear", "linear", "p0", 220.0, config=LINEAR_CFG, session="s2"),
        make_row("B", "linear", "linear", "p1", 260.0, config=LINEAR_CFG, session="s3"),
    ]
    by = {(s.group, s.label): s for s in summarize(rows)}
    a, b = by[("A", "linear")], by[("B", "linear")]
    assert a.speedup == pytest.approx(1.5)
    assert a.speedup_per_prompt.mean == pytest.approx((1.65 + 1.375) / 2)
    assert a.get("throughput").mean == pytest.approx(165.0) and a.get("throughput").std == 0.0
    assert a.mismatches == 1 and a.memory_change == pytest.approx(0.03)
    assert a.sessions == 1 and by[("B", "linear")].sessions == 2
    assert b.speedup == pytest.approx(1.2)
    assert by[("A", "autoregressive")].speedup == pytest.approx(1.0)
    assert a.time_split["verify"] == pytest.approx(0.5) and a.time_split["other"] == pytest.approx(0.1)


# ------------------------------------------------------------------------------ strategy specs
def test_strategy_spec_syntax() -> None:
    specs = parse_strategies("linear:k=5,linear:k=8@long,fixed:depth=8:branch=3:tau=0.1,hf-assisted")
    assert [s.label for s in specs] == ["autoregressive", "linear:k=5", "long", "fixed:depth=8:branch=3:tau=0.1",
                                        "hf-assisted"]
    assert specs[2].options == {"k": 8} and specs[3].config["max_nodes"] == 256  # defaults resolved
    assert [s.label for s in parse_strategies("ablation")][1:] == ["dynatree-static", "dynatree-no-history",
                                                                    "dynatree-full"]
    for bad in ("linear:k=5,linear:k=5", "linear:kk=5", "linear:k", "nope", "linear:k=0", "hf-assisted:k=3"):
        with pytest.raises(DynaTreeError):
            parse_strategies(bad)


def test_run_options_pick_the_engine_per_spec() -> None:
    specs = parse_strategies("autoregressive,autoregressive:engine=static:compile=true@ar-c,"
                             "dynatree:engine=static:window=4@dt-static")
    ar, arc, dt = specs
    assert arc.run == {"engine": "static", "compile": True} and arc.policy_options == {}
    assert dt.policy_options == {"window": 4} and dt.config["window"] == 4 and dt.config["engine"] == "static"
    assert "engine" not in ar.config  # rows without run options keep their old keys
    assert ar.engine_for("hf", False) == ("hf", False) and arc.engine_for("hf", False) == ("static", True)
    assert dt.engine_for("hf", False) == ("static", False) and dt.engine_for("static", True) == ("static", True)
    # a spec that asks for the eager engine drops a bench-wide --compile; a plain one keeps it
    hf = parse_strategies("linear:engine=hf@eager")[1]
    assert hf.engine_for("static", True) == ("hf", False) and ar.engine_for("static", True) == ("static", True)
    with pytest.raises(DynaTreeError, match="compile=true needs engine=static"):
        parse_strategies("linear:compile=true")[1].engine_for("hf", False)
    for bad, msg in (("linear:engine=gpu", "engine must be one of"), ("linear:compile=3", "compile must be true"),
                     ("hf-assisted:engine=static", "takes no"),
                     ("hf-generate:k=2", "takes no options"),
                     ("autoregressive,autoregressive@again", "same engine options")):
        with pytest.raises(DynaTreeError, match=msg):
            parse_strategies(bad)


def test_first_mismatch() -> None:
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert first_mismatch([1, 2, 3], [1, 2]) == 2


# ------------------------------------------------------------------------------ end-to-end runs
@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    g = torch.Generator().manual_seed(0)
    return [Prompt(f"p{i}", tuple(torch.randint(2, 96, (10,), generator=g).tolist())) for i in range(2)]


def settings(**over: Any) -> BenchSettings:
    base = dict(target="tiny-llama", draft="tiny-llama-perturbed", dataset="random", max_new_tokens=T,
                eos_token_id=())
    base.update(over)
    return BenchSettings(**base)


def test_runner_all_strategies_match_autoregressive(llama_pair, prompts, tmp_path: Path) -> None:
    target, draft = llama_pair
    specs = parse_strategies("linear:k=3,fixed:depth=2:branch=2,dynatree,hf-assisted,hf-generate")
    with ResultsWriter(tmp_path / "r.jsonl") as w:
        out = run_bench(target, draft, prompts, specs, settings(), writer=w, warmup=1, progress=False)
    assert out.new_rows == 12 and out.mismatches == []
    rows = load_results(tmp_path / "r.jsonl").rows
    assert len(rows) == 12 and all(r["greedy_match"] for r in rows)
    for r in rows:  # provenance and full config in every row
        assert r["settings"]["dtype"] == "float32" and r["machine"]["torch_threads"] >= 1
        assert "torch" in r["versions"] and r["memory_kind"] == "process_rss_peak"
        assert len(r["output_ids"]) == T and r["stats"]["new_tokens"] == T
    fixed = next(r for r in rows if r["strategy"] == "fixed")
    assert fixed["config"]["tau"] == 0.1 and fixed["config"]["depth"] == 2
    hf = next(r for r in rows if r["strategy"] == "hf-assisted")
    assert hf["stats"]["acceptance"] is None and hf["stats"]["rounds"] == len(hf["per_round"]) >= 1
    assert sum(p["committed"] for p in hf["per_round"]) == T
    plain = next(r for r in rows if r["strategy"] == "hf-generate")  # HF's own greedy loop: one token per round
    assert plain["stats"]["rounds"] == T and plain["stats"]["mean_committed"] == 1.0


def test_one_run_measures_both_engines_against_both_baselines(llama_pair, prompts, tmp_path: Path, monkeypatch) -> None:
    """Issue 8's side-by-side table: HF-eager AR, static AR and a strategy on both engines in one run."""
    target, draft = llama_pair
    seen: list[tuple[str, str, bool]] = []
    real_generate = runner_mod.generate

    def spy(*args, **kw):
        seen.append((getattr(args[3], "name", args[3]), kw["options"].engine, kw["options"].compile))
        return real_generate(*args, **kw)

    monkeypatch.setattr(runner_mod, "generate", spy)
    specs = parse_strategies("autoregressive,autoregressive:engine=static@ar-static,linear:k=3,"
                             "linear:k=3:engine=static@linear-static")
    with ResultsWriter(tmp_path / "r.jsonl") as w:
        out = run_bench(target, draft, prompts, specs, settings(), writer=w, warmup=0, progress=False)
    assert out.mismatches == [] and out.new_rows == 8
    assert seen[:4] == [("autoregressive", "hf", False), ("autoregressive", "static", False),
                        ("linear", "hf", False), ("linear", "static", False)]
    rows = load_results(tmp_path / "r.jsonl").rows
    assert [r["engine"]["engine"] for r in rows[:4]] == ["hf", "static", "hf", "static"]
    from dynatree.options import fixed_plan  # (the plan the suite pins: tests/conftest.py)
    assert rows[0]["engine"]["linear_plan"] == fixed_plan().describe()  # the CPU choice, kept with the row
    assert [r["reference"] for r in rows[:4]] == [True, False, False, False]
    assert rows[1]["greedy_match"] is True  # the extra baseline is checked against the reference too
    by = {s.label: s for s in summarize(rows)}
    assert list(by["linear-static"].speedups) == ["autoregressive", "ar-static"]
    ls, ar_static = by["linear-static"], by["ar-static"]
    assert ls.speedups["ar-static"] == pytest.approx(ls.get("throughput").mean / ar_static.get("throughput").mean)
    assert ls.speedups["autoregressive"] == pytest.approx(ls.speedup)
    assert by["autoregressive"].reference and not ar_static.reference
    text = build_report(tmp_path / "r.jsonl", tmp_path / "rep").markdown.read_text()
    assert "Speedup vs autoregressive | Speedup vs ar-static" in text
    assert "over 6 checked runs" in text  # ar-static, linear, linear-static on 2 prompts


def test_an_extra_baseline_that_differs_is_reported_as_a_mismatch(llama_pair, prompts, monkeypatch) -> None:
    real = runner_mod.run_engine

    def broken_static(target, draft, prompt, spec, s, max_new_tokens):  # a static engine that is off by one
        m = real(target, draft, prompt, spec, s, max_new_tokens)
        if spec.run.get("engine") != "static":
            return m
        return runner_mod.Measurement([m.output_ids[0] ^ 1, *m.output_ids[1:]], m.stats, m.per_round)

    monkeypatch.setattr(runner_mod, "run_engine", broken_static)
    out = run_bench(*llama_pair, prompts, parse_strategies("autoregressive,autoregressive:engine=static@ar-static"),
                    settings(), warmup=0, progress=False)
    assert {r["label"] for r in out.mismatches} == {"ar-static"} and len(out.mismatches) == 2


def test_runner_with_kv_eviction_runs_past_the_context_and_reports_it(prompts, tmp_path: Path) -> None:
    target = tiny_model("llama", seed=0, max_positions=32)  # 10 + 40 tokens > 32 positions
    draft = perturbed(target, noise=0.05)
    evicting = settings(max_new_tokens=40, kv_window=12, kv_sinks=2)
    assert settings().identity() == BenchSettings(**{**settings().identity(), "eos_token_id": ()}).identity()
    assert "kv_window" not in settings().identity()  # rows written before eviction existed keep their keys
    assert settings(cpu_linear=False).identity()["cpu_linear"] is False  # set without --buckets: no crash
    assert "cpu_linear" not in settings().identity() and settings(buckets=(4, 1)).identity()["buckets"] == [1, 4]
    assert evicting.identity()["kv_window"] == 12
    with pytest.raises(DynaTreeError, match="exceeds LlamaForCausalLM's maximum of 32"):
        run_bench(target, draft, prompts, parse_strategies("linear:k=3"), settings(max_new_tokens=40),
                  warmup=0, progress=False)
    with pytest.raises(DynaTreeError, match="HF.s generate cannot evict"):
        run_bench(target, draft, prompts, parse_strategies("hf-assisted"), evicting, warmup=0, progress=False)
    with ResultsWriter(tmp_path / "r.jsonl") as w:
        out = run_bench(target, draft, prompts, parse_strategies("linear:k=3,dynatree"), evicting, writer=w,
                        warmup=0, progress=False)
    assert out.new_rows == 6 and out.mismatches == []
    report = build_report(tmp_path / "r.jsonl", tmp_path / "rep")
    assert "StreamingLLM KV eviction (2 sinks + 12 recent tokens)" in report.markdown.read_text()


def test_runner_detects_and_counts_mismatches(llama_pair, prompts, monkeypatch) -> None:
    real = runner_mod.run_engine

    def wrong(target, draft, prompt, spec, s, max_new_tokens):  # a deliberately broken "linear"
        m = real(target, draft, prompt, spec, s, max_new_tokens)
        if spec.name != "linear":
            return m
        ids = list(m.output_ids)
        ids[5] = (ids[5] + 1) % 96
        return runner_mod.Measurement(ids, m.stats, m.per_round)

    monkeypatch.setattr(runner_mod, "run_engine", wrong)
    out = run_bench(*llama_pair, prompts, parse_strategies("linear:k=3,fixed"), settings(), warmup=0, progress=False)
    assert len(out.mismatches) == 2 and {r["label"] for r in out.mismatches} == {"linear:k=3"}
    assert all(r["first_mismatch"] == 5 and r["greedy_match"] is False for r in out.mismatches)
    assert next(s for s in summarize(out.rows) if s.label == "linear:k=3").mismatches == 2


def test_sweep_resumes_after_interruption_without_duplicates(llama_pair, prompts, tmp_path: Path) -> None:
    path = tmp_path / "sweep.jsonl"
    grid = SweepGrid("fixed", dict([parse_axis("depth=1,2"), parse_axis("branch=1,2")]), base={"tau": 0.05})
    assert grid.size == 4

    class Crash(Exception):
        pass

    seen: list[str] = []

    def crash_after_three(row: dict) -> None:
        seen.append(row["key"])
        if len(seen) == 3:
            raise Crash

    with pytest.raises(Crash), ResultsWriter(path) as w:
        run_sweep(*llama_pair, prompts, grid, settings(), w, warmup=0, on_row=crash_after_three, progress=False)
    assert len(load_results(path).rows) == 3
    with path.open("a") as fh:  # a torn line, as a kill -9 mid-write would leave
        fh.write('{"schema": 1, "key": "tor')
    with ResultsWriter(path) as w:
        outs = run_sweep(*llama_pair, prompts, grid, settings(), w, warmup=0, progress=False)
    assert outs[0].new_rows == 7 and outs[0].resumed_rows == 3  # 5 specs x 2 prompts = 10
    loaded = load_results(path)
    keys = [r["key"] for r in loaded.rows]
    assert len(keys) == len(set(keys)) == 10 and loaded.corrupt == 1 and loaded.duplicates == 0
    assert {(r["label"], r["prompt_id"]) for r in loaded.rows} == {
        (lab, p.id) for lab in ["autoregressive", *(f"fixed:tau=0.05:depth={d}:branch={b}" for d in (1, 2)
                                                     for b in (1, 2))] for p in prompts}
    assert all(r["origin"] == "sweep" for r in loaded.rows)


def test_invalid_grid_point_fails_before_running() -> None:
    with pytest.raises(DynaTreeError, match="grid point"):
        SweepGrid("dynatree", {"tau_l": [0.3, 0.95]})  # tau_l must stay below tau_h = 0.9


# ------------------------------------------------------------------------------ results file
def test_corrupt_and_incompatible_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    good = make_row("g", "autoregressive", "autoregressive", "p0", 100.0)
    other = dict(good, key="k2", schema=SCHEMA_VERSION + 1)
    lines = [json.dumps(good), "not json at all", json.dumps(other), json.dumps(good), '{"schema": 1, "ke',
             json.dumps([1, 2]), json.dumps({"schema": SCHEMA_VERSION, "key": "x"}), ""]
    loaded = parse_lines(lines)
    assert len(loaded.rows) == 1
    assert (loaded.corrupt, loaded.incompatible, loaded.duplicates) == (4, 1, 1)
    assert "skipped 6" in loaded.skipped_message()
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines))
    assert load_results(path).skipped == 6


# ------------------------------------------------------------------------------ report
def report_fixture() -> list[dict]:
    rows = []
    for ds, scale in (("wt2", 1.0), ("pg19", 0.5)):
        g = f"main-{ds}"
        for p, ar in (("p0", 100.0), ("p1", 120.0)):
            rows.append(make_row(g, "autoregressive", "autoregressive", p, ar * scale, dataset=ds))
        for p, tps in (("p0", 160.0), ("p1", 170.0)):
            rows.append(make_row(g, "linear:k=4", "linear", p, tps * scale, config=LINEAR_CFG, dataset=ds,
                                 accepted=[3, 3], drafted=4))
        variants = [("dynatree-static", (False, False, False), 150.0), ("dynatree-no-history", (True, True, False), 180.0),
                    ("dynatree-full", (True, True, True), 195.0)]
        for label, flags, tps in variants:
            for p in ("p0", "p1"):
                rows.append(make_row(g, label, "dynatree", p, tps * scale, config=dyna_cfg(*flags), dataset=ds,
                                     accepted=[5, 6], drafted=10))
    # a sweep at two generation lengths over (tau_h, b_max)
    for length, ar in ((100, 100.0), (200, 100.0)):
        g = f"sweep-{length}"
        rows.append(make_row(g, "autoregressive", "autoregressive", "p0", ar, origin="sweep", max_new_tokens=length))
        for tau_h in (0.7, 0.9):
            for b_max in (2, 3, 4):
                tps = 100.0 + 100 * tau_h + 10 * b_max + (length - 100) / 10
                label = f"dynatree:tau_h={tau_h}:b_max={b_max}"
                rows.append(make_row(g, label, "dynatree", "p0", tps, origin="sweep", max_new_tokens=length,
                                     config=dyna_cfg(True, True, True, tau_h=tau_h, b_max=b_max), accepted=[2, 4],
                                     drafted=8))
    return rows


def test_report_writes_tables_and_figures(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in report_fixture()) + "\n{broken\n")
    rep = build_report(path, tmp_path / "out")
    md = rep.markdown.read_text()
    assert rep.skipped == 1 and "skipped 1 line(s): 1 corrupt" in md
    # Main table, WikiText-2 block: AR 110.0 ± 14.1 (sd of 100, 120), linear 165 / 110 = 1.50×
    assert "| autoregressive | 110.0 ± 14.1 | 1.00× | 55.0 ± 7.1 | 1.00× |" in md
    assert "| linear:k=4 | 165.0 ± 7.1 | 1.50× | 82.5 ± 3.5 | 1.50× |" in md
    # Efficiency: linear accepted 3 of 4 drafted = 75.0 %; papers' def. (3 + 1) / 4 = 100.0 %; L̄ 4.00
    assert "| linear:k=4 | 75.0% | 100.0% | 4.00 | 3.00 | 2.0 |" in md
    # Ablation: 150 -> 180 (+20.0 %) -> 195 (+30.0 %)
    assert "+ Dynamic breadth & depth [dynatree-no-history] | 180.0 ± 0.0 | 1.64× | +20.0%" in md
    assert "+ History adaptation [dynatree-full] | 195.0 ± 0.0 | 1.77× | +30.0%" in md
    # Sensitivity: best at T=100 is tau_h=0.9, b_max=4: 100 + 90 + 40 = 230 t/s = 2.30×
    assert "| **dynatree** | 4 | 0.9 | **230.0 ± 0.0** | **2.30×** |" in md  # columns in config order
    assert "| 200 | dynatree:tau_h=0.9:b_max=4 | 100.0 | 240.0 | 2.40× |" in md  # best config per length
    # Length scaling: the same config at T=200 is 240 t/s = 2.40×
    assert "| dynatree:tau_h=0.9:b_max=4 | 2.30× | 2.40× |" in md
    names = {f.name for f in rep.figures}
    assert {"throughput-1-wt2.png", "tokens-per-round-1-wt2.png", "speedup-vs-length-1.png"} <= names
    assert any(n.startswith("sensitivity-") for n in names)
    for fig in rep.figures:
        assert fig.exists() and fig.stat().st_size > 5000 and f"]({fig.name})" in md


def test_report_cli(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in report_fixture()) + "\n")
    res = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "report.md").exists()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_bench_and_sweep_cli_reject_bad_specs_before_loading_models(tmp_path: Path) -> None:
    out = str(tmp_path / "r.jsonl")
    res = CliRunner().invoke(app, ["bench", "--strategies", "linear:kk=3", "--output", out])
    assert res.exit_code == 2 and "unknown option(s) kk" in res.output
    res = CliRunner().invoke(app, ["sweep", "--strategy", "fixed", "--grid", "depth=2,0x", "--output", out])
    assert res.exit_code == 2 and "grid point" in res.output
    assert not (tmp_path / "r.jsonl").exists()


def test_bench_and_sweep_refuse_bad_engine_flags_before_loading_models(tmp_path: Path, monkeypatch) -> None:
    from dynatree.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    out = ["--output", str(tmp_path / "r.jsonl")]
    for argv, message in ((["bench", "--engine", "auto"], "engine must be 'hf', 'static' or 'aot', got 'auto'"),
                          (["bench", "--engine", "hf", "--compile"], "compile=True needs engine='static'"),
                          (["bench", "--buckets", "1,x"], "--buckets must be comma-separated positive integers"),
                          (["sweep", "--strategy", "linear", "-g", "k=2,3", "--kv-window", "0"],
                           "kv_window must be a positive integer")):
        res = CliRunner().invoke(app, [*argv, *out])
        assert res.exit_code == 2 and message in res.output, res.output


def test_bench_and_sweep_declare_their_shared_flags_once() -> None:
    import inspect

    from dynatree.cli import bench as commands

    bench, sweep = (inspect.signature(c).parameters for c in (commands.bench, commands.sweep))
    shared = [n for n in bench if n in sweep]
    assert {"target", "dataset", "seed", "engine", "compile", "buckets", "kv_window", "cpu_linear"} <= set(shared)
    assert (bench["num_prompts"].default, sweep["num_prompts"].default) == (10, 5)  # per-command defaults
    assert (bench["output"].default, sweep["output"].default) == (Path("results.jsonl"), Path("sweep.jsonl"))
    assert "run" not in bench and "options" not in sweep  # typer sees the flags, not the grouped values


# ------------------------------------------------------------------ draft sources and HF's peers
def test_source_option_is_validated_and_changes_what_a_spec_needs() -> None:
    ar, text, hybrid, model, plain, lookup = parse_strategies(
        "dynatree:source=text@t,dynatree:source=hybrid@h,dynatree:source=model@m,dynatree,"
        "hf-prompt-lookup:prompt_lookup_num_tokens=4")
    assert (text.source, hybrid.source, model.source, plain.source, lookup.source) == (
        "text", "hybrid", "model", "model", None)
    assert not text.uses_draft and hybrid.uses_draft and plain.uses_draft and not lookup.uses_draft
    assert text.config["source"] == "text" and "source" not in plain.config  # old rows keep their keys
    assert lookup.config == {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2}
    assert plain.without_model().source == "text" and plain.without_model().label == "dynatree"
    with pytest.raises(DynaTreeError, match="needs a draft model"):
        hybrid.without_model()
    for bad, msg in (("dynatree:source=both", "source must be one of"),
                     ("autoregressive:source=text", "drafts nothing"),
                     ("hf-prompt-lookup:k=3", "unknown option"),
                     ("hf-prompt-lookup:source=text", "takes no")):
        with pytest.raises(DynaTreeError, match=msg):
            parse_strategies(bad)


def test_every_source_and_hf_prompt_lookup_match_autoregressive() -> None:
    """Text-only and hybrid trees, and HF's prompt lookup, on a prompt that repeats, with a target
    whose output loops (so the text proposes deep branches): every row equals the autoregressive
    output, and the text rows and prompt lookup really drafted from the text (fewer rounds)."""
    target = tiny_model("llama", seed=1)  # its greedy output from this prompt loops (measured)
    draft = perturbed(target, noise=0.05)
    block = torch.randint(2, target.config.vocab_size, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    prompts = [Prompt("rep", tuple(block * 3 + block[:5]))]
    specs = parse_strategies("dynatree:source=text@dt-text,linear:k=4:source=text@lin-text,"
                             "dynatree:source=hybrid@dt-hybrid,dyspec:source=hybrid@ds-hybrid,hf-prompt-lookup")
    out = run_bench(target, draft, prompts, specs, settings(max_new_tokens=60), warmup=0, progress=False)
    assert out.mismatches == [] and len(out.rows) == 6
    rounds = {r["label"]: r["stats"]["rounds"] for r in out.rows}
    assert out.rows[1]["config"]["source"] == "text" and rounds["autoregressive"] == 60
    for label in ("dt-text", "lin-text", "dt-hybrid", "hf-prompt-lookup"):
        assert rounds[label] < 60, label  # the text source was used, not a no-op


def test_a_bench_without_a_draft_model_drafts_from_the_text(llama_pair, prompts) -> None:
    target, _ = llama_pair
    out = run_bench(target, None, prompts, parse_strategies("linear:k=3,dynatree"), settings(), warmup=0,
                    progress=False)
    assert out.mismatches == [] and {r["config"].get("source") for r in out.rows if r["strategy"] != "autoregressive"} == {"text"}
    with pytest.raises(DynaTreeError, match="needs a draft model"):
        run_bench(target, None, prompts, parse_strategies("dynatree:source=hybrid"), settings(), warmup=0,
                  progress=False)


def test_hf_assisted_runs_a_distilled_draft_through_its_hf_export(tmp_path: Path) -> None:
    """HF's assisted generation cannot take the runtime distilled draft; the bench exports it and
    the row equals greedy. An early-exit draft (no export) is still refused with one line."""
    from dynatree.bench.runner import hf_assistant
    from dynatree.drafts.distilled import DistilledDraft, DraftConfig

    target = tiny_model("llama", seed=0)
    cfg = DraftConfig.from_target(target, name="tiny", layers=1, vocab_subset=list(range(64)))
    draft = DistilledDraft(cfg, target.get_input_embeddings())
    draft.init_from_target(target)
    draft.eval()
    assistant = hf_assistant(draft)
    assert hasattr(assistant, "generation_config") and hf_assistant(assistant) is assistant
    g = torch.Generator().manual_seed(3)
    prompts = [Prompt("p0", tuple(torch.randint(2, 96, (10,), generator=g).tolist()))]
    out = run_bench(target, draft, prompts, parse_strategies("hf-assisted"), settings(), warmup=0, progress=False)
    assert out.mismatches == [] and out.rows[1]["stats"]["rounds"] <= T
    with pytest.raises(DynaTreeError, match="hf-assisted needs a HuggingFace model"):
        hf_assistant(torch.nn.Linear(2, 2))


def test_resume_reuses_rows_only_from_the_same_machine_versions_and_code(llama_pair, prompts, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A recorded command re-run after a code change (or on another machine, or with other
    library versions) measures again; re-run unchanged, it resumes."""
    from dynatree.bench import sysinfo

    target, draft = llama_pair
    path = tmp_path / "r.jsonl"
    specs = parse_strategies("linear:k=3")
    with ResultsWriter(path) as w:
        first = run_bench(target, draft, prompts, specs, settings(), writer=w, warmup=0, progress=False)
    assert first.new_rows == 4 and all(r["code"] == sysinfo.code_version() for r in first.rows)
    with ResultsWriter(path) as w:
        again = run_bench(target, draft, prompts, specs, settings(), writer=w, warmup=0, progress=False)
    assert again.new_rows == 0 and again.resumed_rows == 4
    monkeypatch.setattr(runner_mod, "provenance", lambda: {**sysinfo.provenance(), "code": "0.1.0+gother"})
    with ResultsWriter(path) as w:
        changed = run_bench(target, draft, prompts, specs, settings(), writer=w, warmup=0, progress=False)
    assert changed.new_rows == 4 and changed.group != first.group
    assert {r["code"] for r in changed.rows} == {"0.1.0+gother"}


def test_code_version_names_the_commit_in_a_checkout() -> None:
    import re

    from dynatree.bench.sysinfo import code_version

    version = code_version()
    repo = Path(__file__).resolve().parents[2]
    if (repo / ".git").exists():
        assert re.fullmatch(r"(\d+\.\d+\.\d+|0\+unknown)\+g[0-9a-f]{12}(\.dirty)?", version), version
    else:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
