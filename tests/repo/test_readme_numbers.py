"""The headline tables of the README and the docs say what their results files say.

Two kinds of table: the Spec-Bench one (speedup of each method over HF's own greedy ``generate`` per
Spec-Bench task, on Spec-Bench's own questions; one per machine it ran on), in the README and again
on the docs' results page, and the instruct one ("Which to pick", the speedup of every draft source over our
autoregressive decoding per instruct category), on the docs' results page. Each is parsed from
the page that prints it, its results file is the one ``.jsonl`` path cited in the paragraph above
it, and every cell is recomputed from that file's rows with the one aggregation the page states
under the table and ``dynatree report`` prints (``specbench_tables``, Spec-Bench's: per task, the mean
tokens per second of a method over that of the reference rows of the same run; overall, the mean
of the task speedups). Each printed figure must equal the recomputed one rounded as printed, and
the bold cells of a row must be its largest figures. The aggregation itself is checked against
sums computed by hand in tests/bench/test_specbench.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynatree.bench.instruct import CATEGORIES
from dynatree.bench.specbench import specbench_tables
from dynatree.bench.specbench_questions import TASKS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"  # the docs page that holds the instruct table
FIGURE = re.compile(r"\*\*(\d+\.\d+)x\*\*|(\d+\.\d+)x")
CITED = re.compile(r"`([\w./-]+\.jsonl)`")


@dataclass(frozen=True)
class Headline:
    """One headline table: its first header cell, the page's words for the bench's labels (columns)
    and tasks (rows), and which reference its speedups are over (``"hf"``: HF generate)."""

    header: str
    columns: dict[str, str]
    rows: dict[str, str]
    tasks: tuple[str, ...]
    over: str = "ar"


SPEC_BENCH = Headline(
    "| Spec-Bench task |",
    {"default (model + text)": "hybrid", "text alone": "text", "our autoregressive": "autoregressive",
     "HF prompt lookup": "hf-prompt-lookup", "HF assisted": "hf-assisted"},
    {"MT-bench": "mt_bench", "translation": "translation", "summarization": "summarization", "QA": "qa",
     "math reasoning": "math_reasoning", "RAG": "rag", "overall": "overall"},
    TASKS, over="hf")
#: the same run on a second machine (the README's and the results page's second table)
SPEC_BENCH_AMD = Headline("| Spec-Bench task (AMD EPYC) |", SPEC_BENCH.columns, SPEC_BENCH.rows, TASKS, over="hf")
INSTRUCT = Headline(
    "| workload |",
    {"draft model alone": "model", "text alone (`--draft none`)": "text", "both (`--text`, default)": "hybrid",
     "HF prompt lookup": "hf-prompt-lookup"},
    {"chat": "chat", "summarize a passage": "summarize", "answer over a passage": "qa", "rewrite": "rewrite",
     "edit code": "code", "math": "math", "overall": "overall"},
    tuple(CATEGORIES))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def headline(text: str, header: str, page: str = "README.md") -> tuple[str, list[str], list[list[str]]]:
    """(the paragraph above the table, the header cells, the body rows' cells)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert len(starts) == 1, f"expected one table headed {header!r} in {page}, found {len(starts)}"
    start = starts[0]
    end = start + 2  # past the header and the |---| line
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    above = start - 1
    while above >= 0 and not lines[above].strip():
        above -= 1
    first = above
    while first > 0 and lines[first - 1].strip():
        first -= 1
    paragraph = "\n".join(lines[first:above + 1])
    return paragraph, cells(lines[start]), [cells(line) for line in lines[start + 2:end]]


def figure(cell: str) -> tuple[str, bool]:
    """('2.49', bold?) of a cell such as '**2.49x**'."""
    match = FIGURE.fullmatch(cell)
    assert match, f"not a speedup figure: {cell!r}"
    return match.group(1) or match.group(2), match.group(1) is not None


#: (table, the page that prints it): the README's Spec-Bench tables (one per machine), and the docs'
#: results page, which repeats them and holds the instruct one.
PRINTED = [(SPEC_BENCH, README), (SPEC_BENCH, RESULTS), (SPEC_BENCH_AMD, README), (SPEC_BENCH_AMD, RESULTS),
           (INSTRUCT, RESULTS)]


def test_the_readme_has_one_headline_table_and_the_results_page_the_instruct_one() -> None:
    readme = README.read_text(encoding="utf-8")
    assert not any(line.startswith(INSTRUCT.header) for line in readme.splitlines()), \
        "the instruct table lives on docs/results.md, where this test checks it"
    headline(RESULTS.read_text(encoding="utf-8"), INSTRUCT.header, "docs/results.md")


@pytest.fixture(scope="module", params=PRINTED,
                ids=["spec-bench", "spec-bench-docs", "spec-bench-amd", "spec-bench-amd-docs", "instruct-docs"])
def table(request) -> tuple[Headline, Path, list[str], list[list[str]]]:
    spec, page = request.param
    paragraph, header, body = headline(page.read_text(encoding="utf-8"), spec.header,
                                       str(page.relative_to(ROOT)))
    cited = CITED.findall(paragraph)
    assert len(cited) == 1, f"the paragraph above the table must cite one results file, cites {cited}"
    return spec, ROOT / cited[0], header, body


def test_every_figure_is_recomputed_from_the_cited_results_file(table) -> None:
    spec, path, header, body = table
    assert path.is_file(), f"the page cites {path.relative_to(ROOT)}, which does not exist"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    (recomputed,) = specbench_tables(rows)  # one setup: one run of one machine and settings
    labels = [spec.columns[name] for name in header[1:]]
    missing = [label for label in labels if label not in recomputed.methods]
    assert not missing, f"{path.name} has no rows labelled {missing}"
    assert set(recomputed.categories) == set(spec.tasks), "the table's overall needs every task"
    speedup, overall = ((recomputed.hf_speedup, recomputed.hf_overall) if spec.over == "hf"
                        else (recomputed.speedup, recomputed.overall))
    printed_rows = {spec.rows[row[0].strip("*")]: row[1:] for row in body}
    assert set(printed_rows) == set(spec.tasks) | {"overall"}, f"rows: {sorted(printed_rows)}"
    wrong = []
    for row, printed in printed_rows.items():
        assert len(printed) == len(labels), f"row {row!r} has {len(printed)} cells for {len(labels)} columns"
        for label, cell in zip(labels, printed):
            value = overall[label] if row == "overall" else speedup[label][row]
            assert value is not None, f"{path.name} has no {label} rows for {row}"
            shown, _ = figure(cell)
            if shown != f"{value:.2f}":
                wrong.append(f"{row} / {label}: printed {shown}x, {path.name} {value:.4f}x")
    assert not wrong, "printed figures that the results file does not give:\n" + "\n".join(wrong)


def test_bold_marks_the_best_figures_of_each_row(table) -> None:
    _, _, _, body = table
    for row in body:
        figures = [figure(cell) for cell in row[1:]]
        best = max(float(shown) for shown, _ in figures)
        marked = [float(shown) == best for shown, _ in figures]
        assert [bold for _, bold in figures] == marked, f"row {row[0]!r}: bold {figures}, best {best}"


def test_every_row_of_the_cited_run_equals_the_autoregressive_output(table) -> None:
    """The page says so under the table; the bench compared each row with the run's own AR output."""
    _, path, _, _ = table
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    checked = [r for r in rows if r["strategy"] != "autoregressive"]
    assert checked, f"{path.name} has no speculative rows"
    differ = [(r["label"], r["prompt_id"]) for r in checked if r.get("greedy_match") is not True]
    assert not differ, f"rows whose output differs from (or was not compared with) the AR output: {differ}"


#: The README's table by batch size: one row per batch run, its results file in the last column;
#: a column's figure is the mean over the run's tasks of each task's speedup (the mean over the
#: task's batches), of the column's label over our batched autoregressive decoding
#: (``speedup_vs_ar``), or for our autoregressive decoding over HF's batched ``generate``
#: (``speedup_vs_hf``): what ``dynatree bench`` prints as the mean.
BATCHES_HEADER = "| batch size (AMD EPYC) |"
BATCH_COLUMNS = {"our batched autoregressive over HF batched `generate`": ("autoregressive", "speedup_vs_hf"),
                 "text alone": ("text", "speedup_vs_ar"), "default (model + text)": ("hybrid", "speedup_vs_ar")}


def test_the_readme_table_by_batch_size_is_recomputed_from_its_results_files() -> None:
    _, header, body = headline(README.read_text(encoding="utf-8"), BATCHES_HEADER)
    assert header[-1] == "results" and all(name in BATCH_COLUMNS for name in header[2:-1]), header
    assert body, "the table by batch size has no rows"
    for row in body:
        size, path = int(row[0]), ROOT / CITED.fullmatch(row[-1]).group(1)
        runs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert {r["batch_size"] for r in runs} == {size}, f"{path.name} is not a batch-{size} run"
        for name, cell in zip(header[2:-1], row[2:-1]):
            label, key = BATCH_COLUMNS[name]
            by_task: dict[str, list[float]] = {}
            for r in runs:
                if r["label"] == label:
                    by_task.setdefault(r["task"], []).append(r[key])
            assert set(by_task) == {r["task"] for r in runs}, f"{path.name}: {label} misses a task"
            tasks = [sum(v) / len(v) for v in by_task.values()]
            shown, _ = figure(cell)
            assert shown == f"{sum(tasks) / len(tasks):.2f}", (path.name, name, shown)


#: The sentence under each Spec-Bench table of the README: tokens per second pooled per method.
POOLED = re.compile(r"In tokens per second pooled[^:]*: HF\s+`generate` ([\d.]+), our autoregressive decoding ([\d.]+), "
                    r"the\s+default ([\d.]+), the text alone ([\d.]+)")
POOLED_LABELS = ("hf-generate", "autoregressive", "hybrid", "text")


def pooled_problems(text: str) -> list[str]:
    """Each pooled figure of the README's Spec-Bench sentences against its table's results file,
    with this test's own arithmetic (all rows' new tokens over all rows' ``t_total``, per label)."""
    bad: list[str] = []
    for spec in (SPEC_BENCH, SPEC_BENCH_AMD):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(spec.header))
        paragraph, _, _ = headline(text, spec.header)
        (cited,) = CITED.findall(paragraph)
        after = " ".join(lines[start:start + 30])
        match = POOLED.search(after)
        if match is None:
            bad.append(f"no pooled tokens-per-second sentence under {spec.header}")
            continue
        rows = [json.loads(line) for line in (ROOT / cited).read_text(encoding="utf-8").splitlines() if line.strip()]
        for label, shown in zip(POOLED_LABELS, match.groups()):
            mine = [r["stats"] for r in rows if r["label"] == label]
            want = f"{sum(s['new_tokens'] for s in mine) / sum(s['t_total'] for s in mine):.1f}"
            if shown != want:
                bad.append(f"{spec.header} {label}: printed {shown}, {cited} gives {want}")
    return bad


def test_the_pooled_tokens_per_second_under_each_table_are_the_files() -> None:
    assert pooled_problems(README.read_text(encoding="utf-8")) == []


def test_control_a_doctored_pooled_figure_fails() -> None:
    text = README.read_text(encoding="utf-8")
    doctored = text.replace("the default 38.1", "the default 43.2", 1)
    assert doctored != text and pooled_problems(doctored)
