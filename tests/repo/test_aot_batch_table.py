"""The aot batch table of docs/batches.md is its data file, recomputed here from the raw records
with this test's own arithmetic (per pass: tokens over seconds; the median pass), and a doctored
cell fails (the control)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "cpu" / "aot_batch.json"
PAGE = ROOT / "docs" / "batches.md"
#: the table's decoder column -> the file's decoder names (eager, aot)
ROWS = {"batched autoregressive": ("batch-autoregressive-hf", "batch-autoregressive-aot"),
        "default (draft model + text)": ("batch-default-hf", "batch-default-aot"),
        "default": ("batch-default-hf", "batch-default-aot")}


def recomputed(data: dict) -> dict[tuple[str, str], float]:
    out = {}
    for size in {r["batch"] for r in data["records"]}:
        for name in {r["decoder"] for r in data["records"]}:
            rates = []
            for p in range(data["passes"]):
                rows = [r for r in data["records"] if r["batch"] == size and r["decoder"] == name and r["pass"] == p]
                rates.append(sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows))
            out[(str(size), name)] = statistics.median(rates)
    return out


def table(text: str) -> list[tuple[str, str, float, float]]:
    section = text.split("## On the aot engine", 1)[1].split("\n## ", 1)[0]
    return [(b, d.strip(), float(e), float(a)) for b, d, e, a in
            re.findall(r"^\| (\d+) \| ([^|]+) \| ([\d.]+) \| ([\d.]+) \|$", section, re.M)]


def mismatches(text: str, data: dict) -> list[str]:
    rates, bad = recomputed(data), []
    rows = table(text)
    if len(rows) != 4:
        bad.append(f"{len(rows)} table rows")
    for size, decoder, eager, aot in rows:
        hf, ours = ROWS[decoder]
        for cell, name in ((eager, hf), (aot, ours)):
            if abs(cell - round(rates[(size, name)], 1)) > 1e-9:
                bad.append(f"B={size} {name}: {cell} vs {rates[(size, name)]:.2f}")
    if not all(all(r["equal"]) for r in data["records"]):
        bad.append("a row differs from HF greedy")
    return bad


def test_the_table_is_its_data_file() -> None:
    assert mismatches(PAGE.read_text(), json.loads(DATA.read_text())) == []


def test_control_a_doctored_cell_fails() -> None:
    text = PAGE.read_text()
    doctored = text.replace("| 4 | batched autoregressive | 41.7 | 50.1 |", "| 4 | batched autoregressive | 41.7 | 52.1 |")
    assert doctored != text
    assert mismatches(doctored, json.loads(DATA.read_text())) != []
