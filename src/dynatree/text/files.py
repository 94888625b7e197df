"""Reading the user's own text files (prompt files, question files) with errors a user can act on."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dynatree.errors import DynaTreeError


def read_utf8(path: Path, what: str = "prompt file") -> str:
    """The text of a file that must be UTF-8 (a leading byte-order mark is dropped): invalid bytes,
    and NUL bytes (a UTF-16 or binary file, which would otherwise tokenize as garbage), are refused
    with the byte offset of the first one; ``what`` names the file in the message."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DynaTreeError(f"cannot read {what} {path}: {exc.strerror}") from exc
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        content = data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        raise DynaTreeError(f"{what} {path} is not UTF-8 text: byte 0x{data[at]:02x} at byte offset {at} "
                            f"({exc.reason}); save it as UTF-8") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise DynaTreeError(f"{what} {path} has a NUL byte at byte offset {nul} (a UTF-16 or binary file?); "
                            "save it as UTF-8 text")
    return content


def jsonl_records(content: str, path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for each non-blank line of a JSONL file's ``content``; a line
    that is not JSON is refused in one line naming ``path`` and the line."""
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DynaTreeError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
