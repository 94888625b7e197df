"""The results file: JSON Lines, one row per (strategy, prompt), appended durably and resumable.

Why this shape: a benchmark can run for hours and be killed at any moment. Each row is written
with ``flush`` + ``fsync`` as soon as it is measured, so everything completed survives a crash or
Ctrl-C; each row has a ``key`` (hash of strategy, full options, prompt id and settings), so a rerun
skips what is already there and never duplicates a row. A torn last line (crash mid-write) or a
row from another schema version is skipped by the reader and *counted*, never silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynatree.errors import DynaTreeError

SCHEMA_VERSION = 1


def row_key(strategy: str, config: Mapping[str, Any], prompt_id: str, settings: Mapping[str, Any]) -> str:
    """Stable identity of one measurement: same strategy + options + prompt + settings = same key."""
    blob = json.dumps(
        {"strategy": strategy, "config": config, "prompt": prompt_id, "settings": settings},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def settings_group(settings: Mapping[str, Any]) -> str:
    """Id of a run group: rows with equal settings share one autoregressive reference."""
    blob = json.dumps(dict(settings), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass
class LoadedResults:
    """Valid rows plus how many lines were skipped and why."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    corrupt: int = 0  # not JSON, not an object, or missing the key fields
    incompatible: int = 0  # valid JSON from another schema version
    duplicates: int = 0  # same key seen again (kept the first)

    @property
    def skipped(self) -> int:
        return self.corrupt + self.incompatible + self.duplicates

    def skipped_message(self) -> str:
        parts = [
            f"{n} {what}"
            for n, what in (
                (self.corrupt, "corrupt"),
                (self.incompatible, f"from another schema version (expected {SCHEMA_VERSION})"),
                (self.duplicates, "duplicate"),
            )
            if n
        ]
        return f"skipped {self.skipped} line(s): " + ", ".join(parts) if parts else "skipped 0 lines"


def parse_lines(lines: Iterable[str]) -> LoadedResults:
    """Pure: classify every non-empty line as a row, corrupt, incompatible or duplicate."""
    out = LoadedResults()
    seen: set[str] = set()
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            out.corrupt += 1
            continue
        if not isinstance(row, dict) or "schema" not in row:
            out.corrupt += 1
            continue
        if row["schema"] != SCHEMA_VERSION:
            out.incompatible += 1
            continue
        if not all(k in row for k in ("key", "label", "strategy", "group", "stats")):
            out.corrupt += 1
            continue
        if row["key"] in seen:
            out.duplicates += 1
            continue
        seen.add(row["key"])
        out.rows.append(row)
    return out


def load_results(path: str | Path) -> LoadedResults:
    path = Path(path)
    if not path.exists():
        raise DynaTreeError(f"results file '{path}' does not exist")
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return parse_lines(fh)
    except OSError as err:
        raise DynaTreeError(f"cannot read results file '{path}': {err.strerror}") from None


class ResultsWriter:
    """Append-only writer; ``done`` holds the keys already in the file (to resume)."""

    def __init__(self, path: str | Path, *, overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise DynaTreeError(f"--output '{self.path}' is a directory; give a .jsonl file path")
        if overwrite and self.path.exists():
            self.path.unlink()
        self.existing = load_results(self.path) if self.path.exists() else LoadedResults()
        self.done: dict[str, dict[str, Any]] = {r["key"]: r for r in self.existing.rows}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_torn_tail()
            self._fh = self.path.open("a", encoding="utf-8")
        except OSError as err:
            raise DynaTreeError(f"cannot write results file '{self.path}': {err.strerror}") from None

    def _repair_torn_tail(self) -> None:
        """A crash mid-write leaves a last line without newline; start the next row on its own line."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            last = fh.read(1)
        if last != b"\n":
            with self.path.open("ab") as fh:
                fh.write(b"\n")

    def append(self, row: dict[str, Any]) -> None:
        """Write one row durably (flush + fsync), so it survives a crash right after."""
        if row["key"] in self.done:
            return
        self._fh.write(json.dumps(row, default=_json_default) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done[row["key"]] = row

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)
