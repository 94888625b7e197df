"""The README's table of verify costs by rows ("Bigger models") says what its results file says.

Every cell is recomputed here from the rows of the ``.jsonl`` file the paragraph above the table
cites, with this test's own arithmetic (the one-row verify in ms rounded to a whole ms, every other
row count as its ratio to that row with two decimals, the floor in ms), not with the benchmark's
table printer; a README with one doctored cell must fail the same check (the control), and so must
one whose table names a plan or model the file does not hold.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADER = "| model | kernels | 1 row (ms) |"
PLANS = {"F.linear (HF's path)": "F.linear", "before oneDNN's kernels": "previous", "measured plan (the default)": "measured"}


def table_and_file(text: str) -> tuple[list[list[str]], Path]:
    """The table's data rows (cells) and the results file cited in the paragraph above it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    above = "\n".join(lines[max(0, start - 12):start])
    cited = re.findall(r"`([\w./-]+\.jsonl)`", above)
    assert len(cited) == 1, f"the paragraph above the table must cite one .jsonl file, found {cited}"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows, ROOT / cited[0]


def problems(text: str) -> list[str]:
    """Every cell of the table that its file does not give (empty: the table is right)."""
    rows, path = table_and_file(text)
    data = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_key = {(f"{r['model']} {r['dtype']}", r["plan"]): r for r in data}
    bad = []
    for cells in rows:
        model, plan, first, *rest = cells
        row = by_key.get((model, PLANS.get(plan, "?")))
        if row is None:
            bad.append(f"no row for {model} / {plan} in {path.name}")
            continue
        ms = row["verify_ms"]
        ratios, floor = rest[:-1], rest[-1]
        if len(ratios) != len(ms) - 1:
            bad.append(f"{model} / {plan}: {len(ratios)} ratios for {len(ms) - 1} row counts")
            continue
        if first != str(round(ms[0])):
            bad.append(f"{model} / {plan}: 1 row {first} ms, the file {ms[0]:.2f}")
        for n, cell, m in zip(row["rows"][1:], ratios, ms[1:]):
            want = f"{m / ms[0]:.2f}x"
            if cell != want:
                bad.append(f"{model} / {plan}: {n} rows {cell}, the file {want}")
        if floor != str(round(row["floor_ms"])):
            bad.append(f"{model} / {plan}: floor {floor} ms, the file {row['floor_ms']:.2f}")
    return bad


def test_the_curve_table_matches_its_file() -> None:
    text = README.read_text()
    rows, path = table_and_file(text)
    assert path.is_file() and len(rows) >= 3
    assert problems(text) == []


@pytest.mark.parametrize("doctor", ["ratio", "one row", "plan"])
def test_a_doctored_cell_fails_the_check(doctor: str) -> None:
    """The control: change one figure (or name a plan the file lacks) and the check must say so."""
    text = README.read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    cells = lines[start + 2].split("|")
    if doctor == "ratio":
        cells[4] = " 0.50x "
    elif doctor == "one row":
        cells[3] = f" {int(cells[3]) + 7} "
    else:
        cells[2] = " a plan nobody ran "
    lines[start + 2] = "|".join(cells)
    assert problems("\n".join(lines))
