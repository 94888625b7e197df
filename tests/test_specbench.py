"""The Spec-Bench table of the report, on synthetic rows: expected numbers are computed here from
the rows themselves (ratios of means per category and run group), never copied from the code."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from dynatree.bench.instruct import CATEGORIES
from dynatree.bench.report import build_report
from dynatree.bench.specbench import TITLES, specbench_markdown, specbench_tables
from dynatree.bench.store import SCHEMA_VERSION

AR = "autoregressive"
CONFIGS = {"linear": {"k": 4}, "fixed": {"depth": 3}, "dynatree": {"d0": 5}}  # what the report's other tables read


def row(group: str, dataset: str, label: str, strategy: str, i: int, category: str | None, tps: float,
        committed: float, *, origin: str = "bench", threads: int = 1, reference: bool | None = None) -> dict[str, Any]:
    """A bench row as the runner writes it, with only what the tables read varying."""
    prompt = f"{dataset}:0:{i}" + (f":{category}" if dataset == "instruct" else "")
    rounds = 8
    new = round(committed * rounds)
    out = {
        "schema": SCHEMA_VERSION, "key": f"{group}/{label}/{prompt}", "group": group, "session": "s", "origin": origin,
        "label": label, "strategy": strategy, "options": {}, "config": CONFIGS.get(strategy, {}), "prompt_id": prompt,
        "settings": {"target": "t", "draft": "d", "dataset": dataset, "max_new_tokens": 64, "max_prompt_tokens": 1024,
                     "dtype": "float32", "device": "cpu", "threads": threads, "extra": {"prompt_seed": 0}},
        "stats": {"strategy": strategy, "prompt_tokens": 100, "new_tokens": new, "rounds": rounds,
                  "mean_committed": committed, "mean_accepted": committed - 1, "acceptance": 0.5,
                  "tokens_per_second": tps, "ttft": 0.01, "tpot": 0.01, "t_total": new / tps},
        "per_round": [], "greedy_match": True, "first_mismatch": None, "peak_memory_mb": 1.0,
        "memory_kind": "rss", "machine": {"cpu": "c", "cpu_count": 2, "torch_threads": 1}, "versions": {"torch": "x"},
    }
    if reference is not None:
        out["reference"] = reference
    return out


def mixed_run(rng: random.Random, group: str = "g1", labels: Sequence[str] = (AR, "linear", "dynatree"),
              categories: Sequence[str] = CATEGORIES, per_category: int = 3, **kw: Any) -> list[dict[str, Any]]:
    """One run of the mixed set: prompts round-robin over the categories, every label on each."""
    rows = []
    for i in range(per_category * len(categories)):
        category = categories[i % len(categories)]
        for label in labels:
            strategy = AR if label == AR else label
            rows.append(row(group, "instruct", label, strategy, i, category, rng.uniform(5, 60),
                            1.0 if label == AR else rng.uniform(1.2, 4.0), **kw))
    return rows


def expected(rows: Sequence[dict[str, Any]], label: str, category: str) -> float:
    """Mean t/s of ``label`` over mean t/s of the autoregressive rows, per run group, averaged over groups."""
    def cat(r: dict[str, Any]) -> str:
        return r["settings"]["dataset"].removeprefix("instruct-") if r["settings"]["dataset"] != "instruct" \
            else r["prompt_id"].rsplit(":", 1)[1]

    ratios = []
    for group in dict.fromkeys(r["group"] for r in rows):
        mine = [r["stats"]["tokens_per_second"] for r in rows if r["group"] == group and cat(r) == category
                and r["label"] == label]
        ar = [r["stats"]["tokens_per_second"] for r in rows if r["group"] == group and cat(r) == category
              and r["label"] == AR]
        if mine and ar:
            ratios.append(mean(mine) / mean(ar))
    return mean(ratios)


def test_one_mixed_run_gives_per_category_speedups_overall_and_tau() -> None:
    rows = mixed_run(random.Random(0))
    [table] = specbench_tables(rows)
    assert table.categories == list(CATEGORIES) and table.methods == [AR, "linear", "dynatree"]
    for label in table.methods:
        cells = [expected(rows, label, c) for c in CATEGORIES]
        assert [table.speedup[label][c] for c in CATEGORIES] == pytest.approx(cells)
        assert table.overall[label] == pytest.approx(mean(cells))
        taus = [mean(r["stats"]["mean_committed"] for r in rows if r["label"] == label
                     and r["prompt_id"].endswith(":" + c)) for c in CATEGORIES]
        assert table.tau[label] == pytest.approx(mean(taus))
    assert table.speedup[AR] == {c: pytest.approx(1.0) for c in CATEGORIES}


def test_per_category_runs_use_their_own_autoregressive_reference() -> None:
    rng = random.Random(1)
    rows = []
    for n, category in enumerate(("code", "math")):
        for i in range(4):
            ar_speed = 10.0 * (n + 1)  # the second run's machine is twice as fast: speedups must not mix runs
            rows.append(row(f"g-{category}", f"instruct-{category}", AR, AR, i, None, ar_speed * rng.uniform(0.9, 1.1), 1.0))
            rows.append(row(f"g-{category}", f"instruct-{category}", "fixed", "fixed", i, None,
                            ar_speed * rng.uniform(1.5, 2.5), 2.5))
    [table] = specbench_tables(rows)
    assert table.categories == ["code", "math"]
    assert table.speedup["fixed"]["code"] == pytest.approx(expected(rows, "fixed", "code"))
    assert table.speedup["fixed"]["math"] == pytest.approx(expected(rows, "fixed", "math"))
    assert table.overall["fixed"] == pytest.approx(mean([expected(rows, "fixed", c) for c in ("code", "math")]))


def test_a_category_measured_by_two_runs_averages_their_speedups() -> None:
    rng = random.Random(2)
    rows = mixed_run(rng, "g1", categories=("qa", "math")) + mixed_run(rng, "g2", categories=("qa", "math"))
    for r in rows:  # make the second run a different --seed (same setup): only extra differs
        if r["group"] == "g2":
            r["settings"]["extra"] = {"prompt_seed": 1}
    [table] = specbench_tables(rows)
    assert table.speedup["linear"]["qa"] == pytest.approx(expected(rows, "linear", "qa"))


def test_a_missing_category_leaves_its_cell_and_overall_empty() -> None:
    rng = random.Random(3)
    rows = [r for r in mixed_run(rng) if not (r["label"] == "dynatree" and r["prompt_id"].endswith(":math"))]
    [table] = specbench_tables(rows)
    assert table.speedup["dynatree"]["math"] is None and table.overall["dynatree"] is None
    assert table.overall["linear"] is not None
    line = next(ln for ln in specbench_markdown(table).splitlines() if ln.startswith("| dynatree "))
    assert line.split(" | ")[CATEGORIES.index("math") + 1] == "—"


def test_other_datasets_sweeps_and_setups_are_kept_apart() -> None:
    rng = random.Random(4)
    pydoc = [row("gp", "pydoc", AR, AR, 0, None, 10.0, 1.0), row("gp", "pydoc", "linear", "linear", 0, None, 30.0, 3.0)]
    sweep = mixed_run(rng, "gs", origin="sweep")
    assert specbench_tables(pydoc + sweep) == []
    two = mixed_run(rng, "a", threads=1) + mixed_run(rng, "b", threads=4)
    tables = specbench_tables(two)
    assert sorted(t.settings["threads"] for t in tables) == [1, 4]
    one = next(t for t in tables if t.settings["threads"] == 4)
    assert one.speedup["linear"]["chat"] == pytest.approx(expected([r for r in two if r["group"] == "b"], "linear", "chat"))


def test_the_report_shows_the_table(tmp_path: Path) -> None:
    rows = mixed_run(random.Random(5))
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = build_report(path, tmp_path / "rep").markdown.read_text()
    assert "## Spec-Bench layout (1)" in text
    header = "| Method | " + " | ".join(TITLES[c] for c in CATEGORIES) + " | Overall | τ (tokens/round) |"
    assert header in text
    cells = [f"{expected(rows, 'linear', c):.2f}×" for c in CATEGORIES]
    overall = f"{mean(expected(rows, 'linear', c) for c in CATEGORIES):.2f}×"
    assert "| linear | " + " | ".join(cells) + f" | {overall} | " in text
