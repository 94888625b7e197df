"""The Spec-Bench table of the report, on synthetic rows: expected numbers are computed here from
the rows themselves (ratios of means per category and run group, a two-turn question's tokens over
its summed time, tokens over rounds), never copied from the code."""

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
from dynatree.bench.specbench import TITLES, specbench_lines, specbench_markdown, specbench_tables
from dynatree.bench.specbench_questions import TASKS
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
        mine = [[r["stats"] for r in rows if r["label"] == label and r["prompt_id"].endswith(":" + c)]
                for c in CATEGORIES]  # τ: every round of a category's rows, then the mean over categories
        taus = [sum(s["new_tokens"] for s in stats) / sum(s["rounds"] for s in stats) for stats in mine]
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
    assert "## Spec-Bench layout over the own instruct sets (1)" in text and "## Spec-Bench (1)" not in text
    header = "| Method | " + " | ".join(TITLES[c] for c in CATEGORIES) + " | Overall | τ (tokens/round) |"
    assert header in text
    cells = [f"{expected(rows, 'linear', c):.2f}×" for c in CATEGORIES]
    overall = f"{mean(expected(rows, 'linear', c) for c in CATEGORIES):.2f}×"
    assert "| linear | " + " | ".join(cells) + f" | {overall} | " in text


# ------------------------------------------------------------------ Spec-Bench's own questions
def sb_row(group: str, label: str, strategy: str, qid: int, category: str, task: str, turn: int, new: int,
           seconds: float, rounds: int, *, threads: int = 1) -> dict[str, Any]:
    """A bench row of one turn of a Spec-Bench question (prompt id as the bench writes it)."""
    out = row(group, "spec-bench", label, strategy, 0, None, new / seconds, new / rounds, threads=threads)
    out["prompt_id"] = f"spec-bench:{qid}:{category}:t{turn}:{task}"
    out["key"] = f"{group}/{label}/{out['prompt_id']}"
    out["stats"].update(new_tokens=new, t_total=seconds, rounds=rounds, tokens_per_second=new / seconds,
                        mean_committed=new / rounds)
    return out


SB_LABELS = {AR: AR, "hf-generate": "hf-generate", "dt": "dynatree", "pld": "hf-prompt-lookup"}


def specbench_run(rng: random.Random, group: str = "s1", per_task: int = 2) -> list[dict[str, Any]]:
    """One run of Spec-Bench questions: MT-bench questions of two turns (whose lengths and times
    differ a lot, so that pooling the turns and averaging them disagree), others of one."""
    rows = []
    for i in range(per_task):
        for n, task in enumerate(TASKS):
            qid, category = 100 * n + i, ("writing" if i % 2 == 0 else "coding") if task == "mt_bench" else task
            for turn in ((1, 2) if task == "mt_bench" else (1,)):
                for label, strategy in SB_LABELS.items():
                    new = rng.randint(8, 64) if turn == 1 else rng.randint(100, 192)
                    seconds = new / rng.uniform(5, 60) * (3.0 if turn == 2 else 1.0)
                    rounds = new if strategy in (AR, "hf-generate") else max(1, round(new / rng.uniform(1.2, 4.0)))
                    rows.append(sb_row(group, label, strategy, qid, category, task, turn, new, seconds, rounds))
    return rows


def question_speeds(rows: Sequence[dict[str, Any]], label: str, task: str) -> list[float]:
    """Each question's tokens per second by hand: all its turns' tokens over all their seconds."""
    questions: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["label"] == label and r["prompt_id"].endswith(":" + task):
            questions.setdefault(r["prompt_id"].rsplit(":", 2)[0], []).append(r["stats"])
    return [sum(s["new_tokens"] for s in ss) / sum(s["t_total"] for s in ss) for ss in questions.values()]


def test_spec_bench_rows_give_per_task_speedups_over_ar_and_over_hf_generate() -> None:
    rows = specbench_run(random.Random(6))
    [table] = specbench_tables(rows)
    assert table.layout == "spec-bench" and table.categories == list(TASKS)
    assert table.methods == list(SB_LABELS) and table.hf_reference == "hf-generate"
    assert table.questions == dict.fromkeys(TASKS, 2)
    for label in SB_LABELS:
        over_ar = [mean(question_speeds(rows, label, t)) / mean(question_speeds(rows, AR, t)) for t in TASKS]
        over_hf = [mean(question_speeds(rows, label, t)) / mean(question_speeds(rows, "hf-generate", t)) for t in TASKS]
        assert [table.speedup[label][t] for t in TASKS] == pytest.approx(over_ar)
        assert table.overall[label] == pytest.approx(mean(over_ar))
        assert [table.hf_speedup[label][t] for t in TASKS] == pytest.approx(over_hf)
        assert table.hf_overall[label] == pytest.approx(mean(over_hf))
        taus = [sum(r["stats"]["new_tokens"] for r in rows if r["label"] == label and r["prompt_id"].endswith(":" + t))
                / sum(r["stats"]["rounds"] for r in rows if r["label"] == label and r["prompt_id"].endswith(":" + t))
                for t in TASKS]
        assert table.tau[label] == pytest.approx(mean(taus))
    assert table.tau[AR] == pytest.approx(1.0)
    # pooling a two-turn question's turns is not the mean of its rows' own speeds (the test can tell)
    naive = mean(r["stats"]["tokens_per_second"] for r in rows if r["label"] == "dt"
                 and r["prompt_id"].endswith(":mt_bench")) / mean(r["stats"]["tokens_per_second"] for r in rows
                                                                  if r["label"] == AR
                                                                  and r["prompt_id"].endswith(":mt_bench"))
    assert table.speedup["dt"]["mt_bench"] != pytest.approx(naive, rel=1e-3)


def test_spec_bench_and_the_instruct_sets_get_separate_tables_spec_bench_first(tmp_path: Path) -> None:
    rng = random.Random(7)
    rows = mixed_run(rng) + specbench_run(rng)
    tables = specbench_tables(rows)
    assert [t.layout for t in tables] == ["spec-bench", "instruct"]
    assert tables[1].categories == list(CATEGORIES) and tables[1].hf_reference is None
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = build_report(path, tmp_path / "rep").markdown.read_text()
    spec, own = text.index("## Spec-Bench (1): "), text.index("## Spec-Bench layout over the own instruct sets (1): ")
    assert spec < own
    section = text[spec:own]
    header = "| Method | MT-bench | Translation | Summarization | QA | Math reasoning | RAG | Overall |"
    assert section.count(header) == 2 and "Speedup over HF `generate`" in section
    assert "Overall = the mean of the task speedups" in section  # the aggregation, said under the table
    over_hf = [mean(question_speeds(rows, "dt", t)) / mean(question_speeds(rows, "hf-generate", t)) for t in TASKS]
    assert "| dt | " + " | ".join(f"{v:.2f}×" for v in over_hf) + f" | {mean(over_hf):.2f}× |" in section
    assert "Speedup over HF" not in text[own:]  # the instruct run had no hf-generate rows


def test_two_question_files_are_two_spec_bench_tables_but_instruct_sets_share_one() -> None:
    rng = random.Random(8)
    shipped, local = specbench_run(rng, "s1"), specbench_run(rng, "s2")
    for r in local:  # same prompt ids, another file: other questions
        r["settings"]["dataset"] = "my/question.jsonl"
    tables = specbench_tables(shipped + local)
    assert [t.settings["dataset"] for t in tables] == ["spec-bench", "my/question.jsonl"]
    assert tables[1].speedup["dt"]["qa"] == pytest.approx(
        mean(question_speeds(local, "dt", "qa")) / mean(question_speeds(local, AR, "qa")))
    lines = [line for t in tables for line in specbench_lines(t) if line.startswith(("Spec-Bench's own", "Questions in"))]
    assert lines[0].startswith("Spec-Bench's own questions (data/spec_bench/question.jsonl of hemingkx/Spec-Bench)")
    assert lines[1].startswith("Questions in Spec-Bench's format read from `my/question.jsonl`.")
    code = mixed_run(rng, "g-code", categories=("code",))
    math = mixed_run(rng, "g-math", categories=("math",))
    for r, dataset in [(r, "instruct-code") for r in code] + [(r, "instruct-math") for r in math]:
        r["settings"]["dataset"], r["prompt_id"] = dataset, r["prompt_id"].rsplit(":", 1)[0]
    [table] = specbench_tables(code + math)
    assert table.layout == "instruct" and table.categories == ["code", "math"]
