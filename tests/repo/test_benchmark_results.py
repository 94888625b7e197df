"""benchmarks/results/<machine>.md are generated from the rows (benchmarks/results.py), so they say
what the results files hold: the committed pages equal what the script writes now, a page is found
stale when a row changes, and each machine's page names its files."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("benchmark_results", ROOT / "benchmarks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_pages_are_what_the_rows_give() -> None:
    assert _script().main(["--check"]) == 0, "run: python benchmarks/results.py"


def test_one_page_per_machine_naming_its_files() -> None:
    results = _script()
    pages = results.pages()
    assert len(pages) >= 3  # the AMD EPYC VM, the Intel Xeon VM, the H200 host
    intel = next(text for name, text in pages.items() if name.startswith("intel-xeon-processor-2"))
    assert "`spec_bench/cpu-intel.jsonl`" in intel and "`instruct/cpu.jsonl`" not in intel


def test_a_changed_row_makes_its_page_stale(tmp_path: Path) -> None:
    results = _script()
    source = ROOT / "benchmarks" / "spec_bench" / "cpu-intel.jsonl"
    copy = tmp_path / "spec_bench" / "cpu-intel.jsonl"
    copy.parent.mkdir()
    shutil.copy(source, copy)
    before = results.pages(tmp_path)
    rows = [json.loads(line) for line in copy.read_text().splitlines()]
    target = next(r for r in rows if r["label"] != "autoregressive")
    target["stats"]["tokens_per_second"] /= 2  # that row now ran at half the speed
    target["stats"]["t_total"] *= 2
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after = results.pages(tmp_path)
    assert before.keys() == after.keys() and before != after
