"""The README's table against OpenVINO GenAI is its results file, recomputed here.

Each row's two rates are read from the file the table cites: the pooled rate (all tokens over all
time) and the mean of per-prompt rates; the machine and the code named above the table are the
file's. A doctored cell must fail (the control below).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

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
        pooled = data["pooled_tokens_per_second"][key]
        mean = data["tokens_per_second"][key]
        if cells[1].strip("*") != f"{pooled:.1f}" or cells[2].strip("*") != f"{mean:.1f}":
            bad.append(f"{label}: printed {cells[1]} / {cells[2]}, the file gives {pooled:.1f} / {mean:.1f}")
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
