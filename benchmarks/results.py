"""Write ``benchmarks/results/<machine>.md``: one page per machine, generated from the rows.

Every ``dynatree bench`` row records the machine it ran on (CPU, cores, GPU), the library versions
and a timestamp, so the current numbers of a machine can be rebuilt from the results files alone
instead of being copied by hand into READMEs that drift. For each machine this lists every results
file measured on it (outside ``history/``), newest first, each with:

* for prompts of Spec-Bench's own questions or the project's instruct sets, the Spec-Bench table
  (speedup per task over our autoregressive decoding of the same run, the mean over tasks, τ; and
  over HF ``generate`` where the run has it: :mod:`dynatree.bench.specbench`);
* for any other prompt set, one line per method: tokens per second and speedup over the run
  group's autoregressive rows (:func:`dynatree.bench.metrics.summarize`), prompts, mismatches.

The topic folders' READMEs keep the story (why a run was made, what it showed). Usage, from the
repository root: ``python benchmarks/results.py`` (rewrite) or ``--check`` (exit 1 when a page is
not what the rows give; the test suite runs the same check).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dynatree.bench.metrics import summarize
from dynatree.bench.specbench import row_task, specbench_lines, specbench_tables

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
Row = dict[str, Any]


def machine_name(row: Row) -> str:
    """``"Intel(R) Xeon(R) Processor, 2 cores"``, with the GPU first when there is one."""
    m = row["machine"]
    cpu = f"{m.get('cpu') or 'unknown CPU'}, {m.get('cpu_count')} cores"
    return f"{m['gpu']} ({cpu})" if m.get("gpu") else cpu


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", re.sub(r"\(r\)|\(tm\)", "", name.lower())).strip("-")


def results_files(root: Path = ROOT) -> list[Path]:
    """Every results file under ``root`` but ``history/`` (superseded runs) and ``results/``."""
    skip = {"history", "results"}
    found = [p for pattern in ("*.jsonl", "*.jsonl.gz") for p in root.rglob(pattern)]
    return sorted(p for p in found if not skip & set(p.relative_to(root).parts[:-1]))


def bench_rows(path: Path) -> Iterator[Row]:
    """The ``dynatree bench`` rows of a results file (other scripts' records are skipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            row = json.loads(line) if line.strip() else None
            if isinstance(row, dict) and "machine" in row and "stats" in row and "label" in row:
                yield row


def _versions(rows: Sequence[Row]) -> str:
    seen = sorted({f"{k} {v}" for r in rows for k, v in (r.get("versions") or {}).items()
                   if k in ("torch", "transformers", "dynatree")})
    return ", ".join(seen) or "not recorded"


def _setup(settings: dict[str, Any]) -> str:
    return (f"`{settings.get('dataset')}`, {settings.get('max_new_tokens')} new tokens, {settings.get('dtype')} "
            f"on {settings.get('device')}, {settings.get('threads')} threads, T = {settings.get('temperature')}")


def _plain_lines(rows: Sequence[Row]) -> list[str]:
    """Methods of a prompt set with no Spec-Bench layout: tok/s and speedup over the group's AR."""
    lines = ["| method | prompts | tok/s | speedup over AR | mismatches |", "|---|---|---|---|---|"]
    for s in summarize(rows):
        tps = s.get("throughput")
        lines.append(f"| {s.label} | {s.prompts} | {tps.mean:.1f} | "
                     f"{'—' if s.speedup is None else f'{s.speedup:.2f}×'} | {s.mismatches} |" if tps else
                     f"| {s.label} | {s.prompts} | — | — | {s.mismatches} |")
    return lines


def file_section(path: Path, rows: Sequence[Row], root: Path = ROOT) -> list[str]:
    """One results file's part of a machine's page."""
    stamps = sorted(r.get("timestamp", "") for r in rows)
    codes = sorted({r["code"] for r in rows if r.get("code")})
    md = [f"## `{path.relative_to(root)}`", "",
          f"{len(rows)} rows, {stamps[0][:10]} to {stamps[-1][:10]}; {_versions(rows)}; code "
          f"{', '.join(f'`{c}`' for c in codes) if codes else 'not recorded (rows older than the code field)'}.", ""]
    tables = specbench_tables(rows)
    for table in tables:
        md += [f"**{_setup(table.settings)}**", "", *specbench_lines(table), ""]
    rest = [r for r in rows if row_task(r) is None or r.get("origin", "bench") != "bench"]
    by_setup: dict[str, list[Row]] = defaultdict(list)
    for r in rest:
        by_setup[json.dumps(r["settings"], sort_keys=True)].append(r)
    for group in by_setup.values():
        md += [f"**{_setup(group[0]['settings'])}**", "", *_plain_lines(group), ""]
    return md


def pages(root: Path = ROOT) -> dict[str, str]:
    """slug -> page text, for every machine with bench rows under ``root``."""
    by_machine: dict[str, dict[Path, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for path in results_files(root):
        for row in bench_rows(path):
            by_machine[machine_name(row)][path].append(row)
    out = {}
    for machine, files in sorted(by_machine.items()):
        newest = sorted(files, key=lambda p: max(r.get("timestamp", "") for r in files[p]), reverse=True)
        md = [f"# Results on {machine}", "",
              "Generated by `python benchmarks/results.py` from the rows of every results file measured on this "
              "machine (newest first); do not edit by hand. Each ratio is against the autoregressive rows of the "
              "same run. Why each run was made and what it showed: the README of its folder.", ""]
        for path in newest:
            md += file_section(path, files[path], root)
        out[slug(machine)] = "\n".join(md).rstrip() + "\n"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from what the rows give")
    args = parser.parse_args(argv)
    want = pages()
    have = {p.stem: p.read_text() for p in OUT.glob("*.md")} if OUT.is_dir() else {}
    if args.check:
        stale = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
        for k in stale:
            print(f"benchmarks/results/{k}.md is not what the rows give: run python benchmarks/results.py")
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for k in have.keys() - want.keys():
        (OUT / f"{k}.md").unlink()
    for k, text in want.items():
        (OUT / f"{k}.md").write_text(text)
        print(f"wrote benchmarks/results/{k}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
