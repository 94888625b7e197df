"""The README's first tables (every exact decoder on Spec-Bench, same CPU, one interleaved run) are
their results file, recomputed here with this test's own arithmetic, not the package's aggregator.

From the file's raw (pass, prompt, decoder) records: per decoder and pass, all tokens over all
seconds (pooled); the median of the passes, their lowest and highest; the ratio of the median to
the fastest plain decoder's median (which decoder that is, is recomputed too, and the column must
name it); per Spec-Bench task the same ratio over that task's prompts. The machine, the code (a
clean commit), the counts of questions, prompts and passes named above the table are the file's,
and "every output equals HF greedy's" is said only if the file counts every output equal. A
doctored cell, in either table, must fail (the controls below).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADER = "| decoder, same CPU and prompts |"
TASK_HEADER = "| Spec-Bench task, over "
#: README row label -> the results file's key
ROWS = {
    "HF `generate`": "hf",
    "HF prompt lookup": "hf-prompt-lookup",
    "HF assisted (the shipped draft)": "hf-assisted",
    "ours, autoregressive, eager engine": "ours-autoregressive",
    "ours, autoregressive, aot engine": "ours-autoregressive-aot",
    "ours, default (model + text), aot engine": "ours-default-aot",
    "ours, text alone, aot engine": "ours-text-aot",
    "ours, draft model alone, aot engine": "ours-draft-aot",
    "OpenVINO GenAI, plain": "openvino-plain",
    "OpenVINO GenAI, prompt lookup": "openvino-prompt-lookup",
}
#: the per-task table's column titles -> keys
COLUMNS = {
    "ours, autoregressive (aot)": "ours-autoregressive-aot", "ours, default": "ours-default-aot",
    "ours, text alone": "ours-text-aot", "ours, draft model alone": "ours-draft-aot",
    "HF prompt lookup": "hf-prompt-lookup", "HF assisted": "hf-assisted",
    "OpenVINO prompt lookup": "openvino-prompt-lookup",
}
TASKS = {"MT-bench (both turns)": "mt_bench", "translation": "translation", "summarization": "summarization",
         "QA": "qa", "math reasoning": "math_reasoning", "RAG": "rag"}
PLAIN = ("hf", "ours-autoregressive", "ours-autoregressive-aot", "openvino-plain")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _rates(records: list[dict], decoder: str, passes: int, task: str | None = None) -> list[float]:
    rates = []
    for p in range(passes):
        tokens = seconds = 0.0
        for r in records:
            if r["decoder"] == decoder and r["pass"] == p and (task is None or r["task"] == task):
                tokens += r["tokens"]
                seconds += r["seconds"]
        rates.append(tokens / seconds)
    return rates


def _table(lines: list[str], start: int) -> list[list[str]]:
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def problems(text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADER)), None)
    if start is None:
        return [f"no table headed {HEADER!r}"]
    above = " ".join(lines[max(0, start - 12):start])
    cited = re.findall(r"`(benchmarks/cpu/openvino/[\w.-]+\.json)`", above)
    if len(cited) != 1:
        return [f"the paragraph above the table must cite one results file, found {cited}"]
    data = json.loads((ROOT / cited[0]).read_text(encoding="utf-8"))
    records, passes = data["records"], data["passes"]
    bad = []
    code = str(data.get("code") or "")
    commit = re.search(r"\+g([0-9a-f]{7})", code)
    if commit is None or commit.group(1) not in above or code.endswith(".dirty"):
        bad.append(f"the file's code {code!r} is not a clean commit named above the table")
    if data["machine"]["cpu"] not in above:
        bad.append("the machine above the table is not the file's")
    for count, what in ((data["questions_per_task"], "questions per task"), (data["prompts"], "prompts"),
                        (passes, "passes")):
        if f"{count} {what}" not in above:
            bad.append(f"the text above the table does not say '{count} {what}'")
    medians = {key: _median(_rates(records, key, passes)) for key in data["decoders"]}
    base = max((k for k in PLAIN if k in medians), key=medians.get)
    base_label = next(label for label, key in ROWS.items() if key == base)
    if not lines[start].rstrip().endswith(f"| over {base_label} |"):
        bad.append(f"the last column must be over the fastest plain decoder, {base_label}")
    seen = set()
    for cells in _table(lines, start):
        label = cells[0]
        if label not in ROWS:
            bad.append(f"unknown row {label!r}")
            continue
        seen.add(label)
        key = ROWS[label]
        rates = _rates(records, key, passes)
        want = (f"{medians[key]:.1f}", f"{min(rates):.1f}-{max(rates):.1f}", f"{medians[key] / medians[base]:.2f}x")
        got = (cells[1].strip("*"), cells[2].replace("\u2013", "-"), cells[3])
        if got != want:
            bad.append(f"{label}: printed {got}, the file gives {want}")
        equal = sum(1 for r in records if r["decoder"] == key and r["equal"])
        total = sum(1 for r in records if r["decoder"] == key)
        if "every output" in above.lower() and equal != total:
            bad.append(f"{label}: the text says every output equals HF greedy's, the file counts {equal} of {total}")
    missing = set(ROWS) - seen
    if missing:
        bad.append(f"rows missing: {sorted(missing)}")
    return bad + _task_problems(lines, records, passes, base, base_label)


def _task_problems(lines: list[str], records: list[dict], passes: int, base: str, base_label: str) -> list[str]:
    start = next((i for i, line in enumerate(lines) if line.startswith(TASK_HEADER)), None)
    if start is None:
        return [f"no table headed {TASK_HEADER!r}"]
    head = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    bad = [] if head[0] == f"Spec-Bench task, over {base_label}" else [f"the task table is not over {base_label}"]
    unknown = [c for c in head[1:] if c not in COLUMNS]
    if unknown:
        return bad + [f"unknown task-table columns {unknown}"]
    seen = set()
    for cells in _table(lines, start):
        task = TASKS.get(cells[0])
        if task is None:
            bad.append(f"unknown task row {cells[0]!r}")
            continue
        seen.add(task)
        denominator = _median(_rates(records, base, passes, task))
        for title, cell in zip(head[1:], cells[1:]):
            want = f"{_median(_rates(records, COLUMNS[title], passes, task)) / denominator:.2f}x"
            if cell.strip("*") != want:
                bad.append(f"{cells[0]} / {title}: printed {cell}, the file gives {want}")
    if seen != {r["task"] for r in records}:
        bad.append(f"task rows {sorted(seen)} are not the file's tasks")
    return bad


def test_the_headline_tables_are_their_results_file() -> None:
    assert problems(README.read_text(encoding="utf-8")) == []


def _doctor(text: str, header: str, row: int, column: int) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    line = lines[start + 2 + row]
    cells = line.split("|")
    number = re.search(r"[0-9.]+", cells[column + 1])
    cells[column + 1] = cells[column + 1].replace(number.group(0), f"{float(number.group(0)) + 0.2:.2f}", 1)
    return text.replace(line, "|".join(cells), 1)


def test_control_a_doctored_rate_fails() -> None:
    text = README.read_text(encoding="utf-8")
    doctored = _doctor(text, HEADER, 3, 1)  # the autoregressive eager row's rate
    assert doctored != text and problems(doctored)


def test_control_a_doctored_task_cell_fails() -> None:
    text = README.read_text(encoding="utf-8")
    doctored = _doctor(text, TASK_HEADER, 2, 2)  # summarization, the default
    assert doctored != text and problems(doctored)


def test_control_another_baseline_fails() -> None:
    text = README.read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith(HEADER))
    other = "HF `generate`" if "| over HF `generate` |" not in header else "OpenVINO GenAI, plain"
    doctored = text.replace(header, re.sub(r"\| over [^|]+ \|$", f"| over {other} |", header.rstrip()), 1)
    assert doctored != text and problems(doctored)
