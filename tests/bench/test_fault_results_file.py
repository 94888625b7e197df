"""The bench results file when the disk fills up or the folder cannot be written: a one-line error,
the rows saved before intact, and never half a row on disk.

A full disk is made two ways: in-process, a file object that takes part of a row and then fails
with the errno the OS would give; and for real, the CLI in a subprocess under ``RLIMIT_FSIZE``,
where the kernel itself cuts the row short and then refuses to write (``EFBIG``), the same
sequence a filling disk produces. Tests run as root, whom ``chmod`` does not stop, so a read-only
folder is an ``open``/``unlink`` that raises what the OS raises there.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dynatree.bench.store import SCHEMA_VERSION, ResultsWriter, load_results
from dynatree.errors import DynaTreeError
from cli_helpers import error_lines, save_pair, subprocess_env
from tiny import tiny_model
from tiny_tok import VOCAB


def row(n: int) -> dict[str, Any]:
    """A valid results row (the fields the reader requires) with a payload long enough to be split."""
    return {"schema": SCHEMA_VERSION, "key": f"key-{n}", "label": "linear", "strategy": "linear", "group": "g",
            "stats": {"tokens_per_second": 10.0 + n}, "output_ids": list(range(200))}


class FillingDisk:
    """Stands in for the writer's raw file: the first write stores only ``room`` bytes (a short
    write, as the OS makes when the disk fills up mid-row); every later write fails with ``err``."""

    def __init__(self, real: Any, room: int, err: int) -> None:
        self.real, self.room, self.err, self.writes = real, room, err, 0

    def write(self, data: memoryview) -> int:
        self.writes += 1
        if self.writes > 1:
            raise OSError(self.err, os.strerror(self.err))
        return self.real.write(data[: self.room])

    def fileno(self) -> int:
        return self.real.fileno()

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EDQUOT], ids=["ENOSPC", "EROFS", "EDQUOT"])
def test_a_failed_row_is_taken_back_and_the_earlier_rows_stay(tmp_path: Path, err: int) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.append(row(0))
        writer.append(row(1))
        before = path.read_bytes()
        real = writer._fh
        writer._fh = FillingDisk(real, room=40, err=err)
        with pytest.raises(DynaTreeError) as info:
            writer.append(row(2))
        assert writer._fh.writes == 2  # the short write happened: there was half a row to take back
        message = str(info.value)
        assert "\n" not in message
        assert f"cannot write results file '{path}': {os.strerror(err)}" in message
        assert "the 2 row(s) saved before are intact" in message
        assert path.read_bytes() == before  # no half row
        assert "key-2" not in writer.done

        writer._fh = real  # space again: the same writer carries on where it stopped
        writer.append(row(2))
    loaded = load_results(path)
    assert [r["key"] for r in loaded.rows] == ["key-0", "key-1", "key-2"] and loaded.skipped == 0


def test_a_failing_fsync_takes_the_row_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems report a full disk only when the data is flushed (fsync): the row is then
    on disk but not durable, and is removed like a short one."""
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.append(row(0))
        before = path.read_bytes()
        real_fsync = os.fsync
        calls: list[int] = []

        def fsync(fd: int) -> None:
            calls.append(fd)
            if len(calls) == 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        with pytest.raises(DynaTreeError, match="No space left on device; the 1 row"):
            writer.append(row(1))
    assert path.read_bytes() == before


def test_a_folder_that_cannot_be_written_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ro" / "results.jsonl"
    path.parent.mkdir()
    real_open = Path.open

    def read_only(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self == path and any(c in mode for c in "wax+"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    with pytest.raises(DynaTreeError) as info:
        ResultsWriter(path)
    assert str(info.value) == f"cannot write results file '{path}': Permission denied"
    assert not path.exists()


def test_overwrite_in_a_read_only_folder_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "results.jsonl"
    with ResultsWriter(path) as writer:
        writer.append(row(0))
    before = path.read_bytes()

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(DynaTreeError) as info:
        ResultsWriter(path, overwrite=True)
    assert str(info.value) == f"cannot replace results file '{path}' (--overwrite): Permission denied"
    assert path.read_bytes() == before


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    target, draft = save_pair(root, tiny_model("llama", 0, vocab=VOCAB))
    prompts = root / "prompts.txt"
    prompts.write_text("the quick brown fox jumps over\n\nthe lazy dog sleeps under the tree\n")
    return target, draft, prompts


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE semantics are Linux's")
def test_bench_on_a_full_disk_keeps_the_saved_rows(saved_pair, tmp_path: Path) -> None:
    """The real CLI, with the kernel refusing to let the results file grow past the saved rows plus
    a few bytes: the first new row is cut short by the OS and then refused."""
    import resource

    target, draft, prompts = saved_pair
    out = tmp_path / "results.jsonl"
    with ResultsWriter(out) as writer:  # rows of an earlier run
        writer.append(row(0))
        writer.append(row(1))
    before = out.read_bytes()
    limit = len(before) + 50

    def small_disk() -> None:  # runs in the child before it starts Python
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [sys.executable, "-m", "dynatree", "bench", "--target", str(target), "--draft", str(draft),
           "--strategies", "autoregressive,linear:k=3", "--dataset", str(prompts), "--num-prompts", "2",
           "--max-prompt-tokens", "16", "--max-new-tokens", "8", "--warmup", "0", "--no-progress",
           "--threads", "1", "--output", str(out)]
    env = subprocess_env(PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, preexec_fn=small_disk)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert error_lines(done.stderr) == [f"error: cannot write results file '{out}': File too large; the 2 row(s) "
                                        "saved before are intact, rerun the same command to continue"], done.stderr
    assert out.read_bytes() == before
