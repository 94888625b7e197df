"""The results file: JSON Lines, one row per (strategy, prompt), appended durably and resumable.

Why this shape: a benchmark can run for hours and be killed at any moment. Each row is written
and ``fsync``-ed as soon as it is measured, so everything completed survives a crash or
Ctrl-C; each row has a ``key`` (hash of strategy, full options, prompt id and settings), so a rerun
skips what is already there and never duplicates a row. A torn last line (crash mid-write) or a
row from another schema version is skipped by the reader and *counted*, never silently dropped.
A write that fails (full disk, read-only file system, quota) is undone: the file is cut back to
the rows before it, and the run stops with a one-line error.
"""

from __future__ import annotations

import errno
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
        try:
            if overwrite and self.path.exists():
                self.path.unlink()
        except OSError as err:
            raise DynaTreeError(f"cannot replace results file '{self.path}' (--overwrite): {err.strerror}") from None
        self.existing = load_results(self.path) if self.path.exists() else LoadedResults()
        self.done: dict[str, dict[str, Any]] = {r["key"]: r for r in self.existing.rows}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_torn_tail()
            # Unbuffered bytes: a row reaches the file in the write calls of append, never later in
            # a flush, so append knows whether it is all there.
            self._fh = self.path.open("ab", buffering=0)
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
        """Write one row durably (fsync), so it survives a crash right after; all or nothing.

        The row goes out as one line; should the disk fill up (or the file system turn read-only)
        part-way, the file is cut back to its length before the row, so the rows already saved stay
        valid and no half row is left for a rerun to skip.
        """
        if row["key"] in self.done:
            return
        line = (json.dumps(row, default=_json_default) + "\n").encode("utf-8")
        fd = self._fh.fileno()
        start = os.fstat(fd).st_size  # the file is opened for appending: the row lands here
        view = memoryview(line)
        try:
            while view:  # a raw write may take only part of the line (a disk filling up)
                written = self._fh.write(view)
                if not written:
                    raise OSError(errno.EIO, "the write made no progress")
                view = view[written:]
            os.fsync(fd)
        except OSError as err:
            undone = self._cut_back(fd, start)
            raise DynaTreeError(
                f"cannot write results file '{self.path}': {err.strerror or err}; "
                + (f"the {len(self.done)} row(s) saved before are intact, rerun the same command to continue"
                   if undone else f"a partial row may remain after byte {start} (rerunning skips it)")
            ) from None
        except BaseException:  # Ctrl-C between two parts of the line: take the part back too
            if view:
                self._cut_back(fd, start)
            raise
        self.done[row["key"]] = row

    @staticmethod
    def _cut_back(fd: int, length: int) -> bool:
        """Truncate the file to ``length`` bytes (undo a partial row); False if even that failed."""
        try:
            os.ftruncate(fd, length)
            os.fsync(fd)
        except OSError:
            return False
        return True

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
