"""The README's table against OpenVINO GenAI is its results file, recomputed here.

Each row's rates are recomputed from the raw counts of the file the table cites, with this test's
own arithmetic: per pass, all tokens over all seconds (pooled); the median of the passes, and
their lowest and highest. The machine and the code named above the table are the file's, and
"every output equals HF greedy's" is said only if the file counts every output equal. A doctored
cell must fail (the control below).
"""

from __future__ import annotations

import json
import re
from pathlib import Path


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADER = "| decoder, same CPU and prompts |"
#: README row label -> the results file's key
ROWS = {
    "HF `generate`": "hf",
    "ours, autoregressive, eager engine": "ours-autoregressive",
    "ours, autoregressive, aot engine": "ours-autoregressive-aot",
    "ours, default (model + text), eager engine": "ours-default",
    "ours, default (model + text), aot engine": "ours-default-aot",
    "ours, text alone, aot engine": "ours-text-aot",
    "OpenVINO GenAI, plain": "openvino-plain",
    "OpenVINO GenAI, prompt lookup": "openvino-prompt-lookup",
}


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
    bad = []
    code = str(data.get("code") or "")
    commit = re.search(r"\+g([0-9a-f]{7})", code)
    if commit is None or commit.group(1) not in above or code.endswith(".dirty"):
        bad.append(f"the file's code {code!r} is not a clean commit named above the table")
    if "AMD EPYC" not in above or data["machine"]["cpu"] not in above:
        bad.append("the machine above the table is not the file's")
    seen = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        label = cells[0].strip("*")
        if label not in ROWS:
            bad.append(f"unknown row {label!r}")
            continue
        seen.add(label)
        key = ROWS[label]
        rates = [r["tokens"] / r["seconds"] for r in data["per_pass"][key]]
        want = (f"{_median(rates):.1f}", f"{min(rates):.1f}-{max(rates):.1f}")
        if (cells[1].strip("*"), cells[2].replace("\u2013", "-")) != want:
            bad.append(f"{label}: printed {cells[1]} / {cells[2]}, the file gives {want[0]} / {want[1]}")
        tally = data["outputs_equal_to_hf"][key].split(" of ")
        if "every output" in above.lower() and tally[0] != tally[1]:
            bad.append(f"{label}: the text says every output equals HF greedy's, the file counts {tally}")
    missing = set(ROWS) - seen
    if missing:
        bad.append(f"rows missing: {sorted(missing)}")
    return bad


def test_the_openvino_table_is_its_results_file() -> None:
    assert problems(README.read_text(encoding="utf-8")) == []


def test_control_a_doctored_cell_fails() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    row = lines[start + 3]  # the autoregressive eager row
    cells = row.split("|")
    cells[2] = f" {float(cells[2].strip().strip('*')) + 1.0:.1f} "
    doctored = text.replace(row, "|".join(cells), 1)
    assert doctored != text and problems(doctored)
