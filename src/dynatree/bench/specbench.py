"""The Spec-Bench table: one row per method, one speedup column per instruct category, the mean
over categories ("Overall") and the mean tokens committed per round.

Spec-Bench (Xia et al. 2024) reports speculative decoding this way because a method's speedup
depends on the task (copy-heavy summaries and code edits draft well, free chat does not), so a
single number hides where a method wins. Rows come from bench runs of the ``instruct`` sets
(:mod:`dynatree.bench.instruct`): the mixed set gives every category in one run, ``instruct-<c>``
one each; both may be combined in one results file.

Definitions (the report's own, per category): speedup = mean throughput of the method's rows in
that category ÷ mean throughput of the reference autoregressive rows of the same category *and
run group* (the same run, machine state and prompts); when several run groups of one setup measure
a category, their speedups are averaged. Overall = mean of the category speedups, shown only when
the method has every category of the table (a mean over a subset would not be comparable). τ =
tokens committed per round (accepted drafted tokens + the bonus token; 1 for autoregressive), the
mean over the method's rows of each category, then over categories -- Spec-Bench's "mean accepted
tokens", which counts the bonus token.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynatree.bench.instruct import CATEGORIES, row_category
from dynatree.bench.metrics import AR, mean_std

Row = Mapping[str, Any]
TITLES = {"chat": "Multi-turn chat", "summarize": "Summarization", "qa": "Retrieval QA",
          "rewrite": "Rewrite", "code": "Code editing", "math": "Math reasoning"}
_NOT_SETUP = ("dataset", "max_prompt_tokens", "extra")  # what may differ between runs of one setup
DASH = "—"


@dataclass
class SpecBenchTable:
    """One setup (model pair, dtype, device, T, engine ...): the numbers of the Spec-Bench layout."""

    settings: dict[str, Any]  # of the setup's first row, for the title
    categories: list[str]  # present in the setup, in Spec-Bench's order
    methods: list[str]  # labels, the autoregressive reference first
    speedup: dict[str, dict[str, float | None]]  # label -> category -> speedup
    overall: dict[str, float | None]
    tau: dict[str, float | None]  # committed tokens per round, mean over categories


def _setup_key(settings: Mapping[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in settings.items() if k not in _NOT_SETUP))


def _is_reference(row: Row) -> bool:
    return bool(row.get("reference", row["strategy"] == AR))  # rows before several baselines lack the flag


def _mean(values: Sequence[float | None]) -> float | None:
    agg = mean_std(values)
    return agg.mean if agg is not None else None


def specbench_tables(rows: Sequence[Row]) -> list[SpecBenchTable]:
    """The Spec-Bench numbers of every setup that has instruct rows from ``dynatree bench``."""
    setups: dict[str, list[tuple[str, Row]]] = defaultdict(list)
    for r in rows:
        category = row_category(r)
        if category is not None and r.get("origin", "bench") == "bench":
            setups[_setup_key(r["settings"])].append((category, r))
    tables = []
    for items in setups.values():
        # (group, category) -> label -> throughputs; label -> category -> tokens per round
        tps: dict[tuple[str, str], dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
        tau_rows: dict[str, dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
        reference: dict[tuple[str, str], str] = {}
        labels: list[str] = []
        for category, r in items:
            stats = r["stats"]
            tps[(r["group"], category)][r["label"]].append(stats.get("tokens_per_second"))
            tau_rows[r["label"]][category].append(stats.get("mean_committed"))
            if _is_reference(r):
                reference.setdefault((r["group"], category), r["label"])
            if r["label"] not in labels:
                labels.append(r["label"])
        references = set(reference.values())
        labels.sort(key=lambda label: label not in references)  # stable: the reference first, then run order
        categories = [c for c in CATEGORIES if any(c == cat for cat, _ in items)]
        ratios: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for (group, category), by_label in tps.items():
            ref = reference.get((group, category))
            base = _mean(by_label[ref]) if ref is not None else None
            if not base:
                continue
            for label, values in by_label.items():
                mean = _mean(values)
                if mean is not None:
                    ratios[label][category].append(mean / base)
        speedup = {lab: {c: _mean(ratios[lab][c]) if ratios[lab][c] else None for c in categories} for lab in labels}
        overall = {lab: (sum(v for v in cells.values() if v is not None) / len(cells)
                         if all(v is not None for v in cells.values()) else None)
                   for lab, cells in speedup.items()}
        tau = {lab: _mean([_mean(tau_rows[lab][c]) for c in categories if tau_rows[lab][c]]) for lab in labels}
        tables.append(SpecBenchTable(dict(items[0][1]["settings"]), categories, labels, speedup, overall, tau))
    return tables


def _x(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}×"


def specbench_markdown(table: SpecBenchTable) -> str:
    """The table as markdown, shaped like Spec-Bench's main table."""
    header = ["Method", *(TITLES.get(c, c) for c in table.categories), "Overall", "τ (tokens/round)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for label in table.methods:
        tau = table.tau[label]
        cells = [label, *(_x(table.speedup[label][c]) for c in table.categories), _x(table.overall[label]),
                 DASH if tau is None else f"{tau:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def specbench_section(rows: Sequence[Row], title: Callable[[Mapping[str, Any]], str]) -> list[str]:
    """Report lines: one Spec-Bench table per setup with instruct rows (none without them);
    ``title`` names a setup from its settings (the report's setup title)."""
    md: list[str] = []
    for n, table in enumerate(specbench_tables(rows), 1):
        md += [f"## Spec-Bench layout ({n}): {title(table.settings)}", "",
               "Speedup over the autoregressive reference of the same run, per instruct category; Overall = "
               "mean over the categories; τ = tokens committed per round (incl. the bonus token), mean over "
               "categories.", "", specbench_markdown(table), ""]
    return md
