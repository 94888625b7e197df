"""The Spec-Bench table: one row per method, one speedup column per task, the mean over tasks
("Overall") and the mean tokens committed per round.

Spec-Bench (Xia et al. 2024) reports speculative decoding this way because a method's speedup
depends on the task (copy-heavy summaries and code edits draft well, free chat does not), so a
single number hides where a method wins. Two kinds of bench rows give such a table, each its own
(a :class:`Layout`, with the task list of the rows' prompt set):

* ``spec-bench`` -- Spec-Bench's own questions (:mod:`dynatree.bench.specbench_questions`) in its
  six tasks: the field's benchmark, the numbers to compare with the papers' tables;
* ``instruct`` -- the project's own instruct sets (:mod:`dynatree.bench.instruct`) in their six
  categories, which imitate Spec-Bench's tasks offline: the mixed set gives every category in one
  run, ``instruct-<c>`` one each; both may be combined in one results file.

Definitions (the report's own, per task):

* a question's throughput = the generated tokens of its rows ÷ their summed wall time: for a
  two-turn MT-bench question both turns together, as Spec-Bench's ``evaluation/speed.py`` times
  it; any other question is one row, whose tokens per second this is;
* speedup = the mean throughput over the method's questions of that task ÷ the same mean of the
  reference rows of the same task *and run group* (the same run, machine state and prompts); when
  several run groups of one setup measure a task, their speedups are averaged. Two references:
  our autoregressive decoding (the bench's reference rows, always there) and HuggingFace's own
  greedy ``generate`` (rows of strategy ``hf-generate``) where the run has them;
* Overall = the mean of the task speedups, shown only when the method has every task of the table
  (a mean over a subset would not be comparable). Spec-Bench's ``speed.py`` pools the questions of
  every task for its "overall" instead; the mean over tasks weighs each task alike whatever the
  number of questions a run takes from it;
* τ = tokens committed per round (accepted drafted tokens + the bonus token; 1 for autoregressive
  decoding), over every round of the method's rows of a task (their tokens ÷ their rounds:
  Spec-Bench's "mean accepted tokens", which counts the bonus token), then the mean over tasks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynatree.bench import specbench_questions
from dynatree.bench.instruct import CATEGORIES, row_category
from dynatree.bench.metrics import AR, mean_std

Row = Mapping[str, Any]
HF_GENERATE = "hf-generate"  # (bench.specs.HF_GENERATE; not imported: specs imports the policies)
TITLES = {"chat": "Multi-turn chat", "summarize": "Summarization", "qa": "Retrieval QA",
          "rewrite": "Rewrite", "code": "Code editing", "math": "Math reasoning"}
_NOT_SETUP = ("dataset", "max_prompt_tokens", "extra")  # what may differ between runs of one setup
DASH = "—"


@dataclass(frozen=True)
class Layout:
    """A kind of prompt set the table is made for: its tasks in column order, their titles, the
    report's heading for its tables and one sentence saying what the prompts are."""

    key: str
    tasks: tuple[str, ...]
    titles: Mapping[str, str]
    heading: str
    source: str


#: The layouts in the report's order: Spec-Bench's own questions first.
LAYOUTS: dict[str, Layout] = {
    specbench_questions.NAME: Layout(
        specbench_questions.NAME, specbench_questions.TASKS, specbench_questions.TITLES, "Spec-Bench",
        "Spec-Bench's own questions (data/spec_bench/question.jsonl of hemingkx/Spec-Bench), chat-templated; "
        "MT-bench's second turns follow the target's greedy answer to the first."),
    "instruct": Layout(
        "instruct", CATEGORIES, TITLES, "Spec-Bench layout over the own instruct sets",
        "The project's own instruct sets (dynatree.bench.instruct), built offline in Spec-Bench's categories: "
        "not Spec-Bench's questions, not comparable with its tables."),
}


def row_task(row: Row) -> tuple[str, str, str] | None:
    """(layout, task, question) of a bench row, or None for a row of no layout (a corpus set).
    ``question`` names what Spec-Bench times as one: both turns of an MT-bench question, else the
    prompt itself."""
    found = specbench_questions.row_task(row)
    if found is not None:
        return (specbench_questions.NAME, *found)
    category = row_category(row)
    return None if category is None else ("instruct", category, str(row.get("prompt_id")))


@dataclass
class SpecBenchTable:
    """One layout and setup (model pair, dtype, device, T, engine ...): the numbers of the Spec-Bench table."""

    settings: dict[str, Any]  # of the setup's first row, for the title
    categories: list[str]  # the tasks present in the setup, in the layout's order
    methods: list[str]  # labels, the autoregressive reference first
    speedup: dict[str, dict[str, float | None]]  # label -> task -> speedup over our autoregressive decoding
    overall: dict[str, float | None]
    tau: dict[str, float | None]  # committed tokens per round, mean over tasks
    layout: str = "instruct"
    questions: dict[str, int] = field(default_factory=dict)  # task -> questions the reference measured
    hf_reference: str | None = None  # the label of the HF generate rows, if the setup has them
    hf_speedup: dict[str, dict[str, float | None]] = field(default_factory=dict)  # over HF generate
    hf_overall: dict[str, float | None] = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        return self.categories


def _setup_key(settings: Mapping[str, Any], layout: str) -> str:
    """What one table may combine: runs of one setup. The instruct sets' runs may differ in their
    dataset (``instruct-code`` and ``instruct-math`` fill one table); Spec-Bench's may not, since
    another question file holds other questions under the same prompt ids."""
    ignored = _NOT_SETUP if layout != specbench_questions.NAME else tuple(k for k in _NOT_SETUP if k != "dataset")
    return repr(sorted((k, repr(v)) for k, v in settings.items() if k not in ignored))


def _is_reference(row: Row) -> bool:
    return bool(row.get("reference", row["strategy"] == AR))  # rows before several baselines lack the flag


def _mean(values: Sequence[float | None]) -> float | None:
    agg = mean_std(values)
    return agg.mean if agg is not None else None


def _question_speed(stats: Sequence[Mapping[str, Any]]) -> float | None:
    """A question's tokens per second: one row's own, or several turns' tokens over their summed time."""
    if len(stats) == 1:
        return stats[0].get("tokens_per_second")
    tokens = [s.get("new_tokens") for s in stats]
    times = [s.get("t_total") for s in stats]
    if any(v is None for v in (*tokens, *times)) or sum(times) <= 0:  # type: ignore[arg-type]
        return _mean([s.get("tokens_per_second") for s in stats])
    return sum(tokens) / sum(times)  # type: ignore[arg-type]


def _tokens_per_round(stats: Sequence[Mapping[str, Any]]) -> float | None:
    """Tokens over rounds, pooled over the rows (rows without those counts: the mean of their L̄)."""
    if stats and all(s.get("new_tokens") is not None and s.get("rounds") for s in stats):
        return sum(s["new_tokens"] for s in stats) / sum(s["rounds"] for s in stats)
    return _mean([s.get("mean_committed") for s in stats])


Speeds = dict[tuple[str, str], dict[str, dict[str, list[Mapping[str, Any]]]]]  # (group, task) -> label -> question -> stats


def _speedups(speeds: Speeds, reference: Mapping[tuple[str, str], str], labels: Sequence[str],
              tasks: Sequence[str]) -> tuple[dict[str, dict[str, float | None]], dict[str, float | None]]:
    """label -> task -> speedup over ``reference``'s label of each (group, task), and the overall."""
    ratios: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, by_label in speeds.items():
        ref = reference.get(key)
        if ref is None or ref not in by_label:
            continue
        base = _mean([_question_speed(s) for s in by_label[ref].values()])
        if not base:
            continue
        for label, questions in by_label.items():
            mean = _mean([_question_speed(s) for s in questions.values()])
            if mean is not None:
                ratios[label][key[1]].append(mean / base)
    speedup = {lab: {t: _mean(ratios[lab][t]) if ratios[lab][t] else None for t in tasks} for lab in labels}
    overall = {lab: (sum(v for v in cells.values() if v is not None) / len(cells)
                     if cells and all(v is not None for v in cells.values()) else None)
               for lab, cells in speedup.items()}
    return speedup, overall


def specbench_tables(rows: Sequence[Row]) -> list[SpecBenchTable]:
    """The Spec-Bench numbers of every layout and setup that has rows from ``dynatree bench``,
    Spec-Bench's own questions first."""
    setups: dict[tuple[str, str], list[tuple[str, str, Row]]] = defaultdict(list)
    for r in rows:
        found = row_task(r)
        if found is not None and r.get("origin", "bench") == "bench":
            layout, task, question = found
            setups[(layout, _setup_key(r["settings"], layout))].append((task, question, r))
    tables = []
    for (layout, _), items in sorted(setups.items(), key=lambda kv: list(LAYOUTS).index(kv[0][0])):
        speeds: Speeds = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
        tau_rows: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        reference: dict[tuple[str, str], str] = {}
        hf: dict[tuple[str, str], str] = {}
        labels: list[str] = []
        for task, question, r in items:
            key = (r["group"], task)
            speeds[key][r["label"]][question].append(r["stats"])
            tau_rows[r["label"]][task].append(r["stats"])
            if _is_reference(r):
                reference.setdefault(key, r["label"])
            if r["strategy"] == HF_GENERATE:
                hf.setdefault(key, r["label"])
            if r["label"] not in labels:
                labels.append(r["label"])
        references = set(reference.values())
        labels.sort(key=lambda label: label not in references)  # stable: the reference first, then run order
        tasks = [t for t in LAYOUTS[layout].tasks if any(t == task for task, _, _ in items)]
        speedup, overall = _speedups(speeds, reference, labels, tasks)
        tau = {lab: _mean([_tokens_per_round(tau_rows[lab][t]) for t in tasks if tau_rows[lab][t]]) for lab in labels}
        questions = {t: len({q for (group, task), by_label in speeds.items() if task == t
                             for q in by_label.get(reference.get((group, task), ""), {})})
                     for t in tasks}
        table = SpecBenchTable(dict(items[0][2]["settings"]), tasks, labels, speedup, overall, tau, layout, questions)
        if hf:
            table.hf_reference = next(iter(hf.values()))
            table.hf_speedup, table.hf_overall = _speedups(speeds, hf, labels, tasks)
        tables.append(table)
    return tables


def _x(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}×"


def _titles(table: SpecBenchTable) -> list[str]:
    titles = LAYOUTS[table.layout].titles
    return [titles.get(t, t) for t in table.categories]


def specbench_markdown(table: SpecBenchTable) -> str:
    """The table of speedups over our autoregressive decoding as markdown, shaped like Spec-Bench's main table."""
    header = ["Method", *_titles(table), "Overall", "τ (tokens/round)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for label in table.methods:
        tau = table.tau[label]
        cells = [label, *(_x(table.speedup[label][c]) for c in table.categories), _x(table.overall[label]),
                 DASH if tau is None else f"{tau:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def specbench_hf_markdown(table: SpecBenchTable) -> str | None:
    """The speedups over HF's greedy ``generate`` of the same run as markdown; None without such rows."""
    if table.hf_reference is None:
        return None
    header = ["Method", *_titles(table), "Overall"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for label in table.methods:
        cells = [label, *(_x(table.hf_speedup[label][c]) for c in table.categories), _x(table.hf_overall[label])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


AGGREGATION = ("Speedup per task = the mean over its questions of each question's tokens per second (a two-turn "
               "MT-bench question: both turns' tokens over their summed time, as Spec-Bench's speed.py) ÷ the same "
               "mean of the reference rows of the same task and run; Overall = the mean of the task speedups "
               "(Spec-Bench's speed.py pools all questions for its overall instead); τ = tokens committed per round, "
               "the bonus token counted, over every round of the task's rows (Spec-Bench's mean accepted tokens), "
               "then the mean over tasks.")


def specbench_lines(table: SpecBenchTable) -> list[str]:
    """The markdown of one table: what the prompts are and how many, the speedups over our
    autoregressive decoding with τ, the aggregation in words, then the speedups over HF ``generate``."""
    layout = LAYOUTS[table.layout]
    counts = ", ".join(f"{layout.titles.get(t, t)} {table.questions.get(t, 0)}" for t in table.categories)
    reference = table.methods[0] if table.methods else AR
    dataset = table.settings.get("dataset")
    source = (f"Questions in Spec-Bench's format read from `{dataset}`." if table.layout == specbench_questions.NAME
              and dataset != specbench_questions.NAME else layout.source)
    md = [f"{source} Questions per task: {counts}.", "",
          f"Speedup over our autoregressive decoding (`{reference}`) in the same run:", "",
          specbench_markdown(table), "", AGGREGATION]
    hf = specbench_hf_markdown(table)
    if hf is not None:
        md += ["", f"Speedup over HF `generate` (greedy, the `{table.hf_reference}` rows) in the same run, "
               "aggregated alike:", "", hf]
    return md


def specbench_section(rows: Sequence[Row], title: Callable[[Mapping[str, Any]], str]) -> list[str]:
    """Report lines: one Spec-Bench table per layout and setup (none without such rows), Spec-Bench's
    own questions first, the own instruct sets after under their own heading; ``title`` names a
    setup from its settings (the report's setup title)."""
    tables = specbench_tables(rows)
    md: list[str] = []
    for layout in LAYOUTS.values():
        for n, table in enumerate([t for t in tables if t.layout == layout.key], 1):
            md += [f"## {layout.heading} ({n}): {title(table.settings)}", "", *specbench_lines(table), ""]
    return md
