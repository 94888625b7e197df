"""Where the ahead-of-time compiled engine keeps its packages: built once per model shape and
machine, loaded by every later process in milliseconds.

A package is an AOTInductor ``.pt2`` file of one decoding step (:mod:`dynatree.runtime.aot_engine`).
It holds code only, never weights (the engine binds the live model's tensors at load), so its key
is what the code depends on: the model's class and config, the dtype, the step's row count and
output, the CPU, and the torch and transformers versions. A changed library or CPU gives a new
key, so a stale package is never found, let alone loaded.

Three rules keep a package from being trusted when it should not be:

- a build writes to a temporary file and renames it into place, so no reader sees half a file;
- a second process that wants the same package while it is being built waits on a lock file
  (``fcntl.flock``) and then loads the finished one instead of building it again;
- every package has a SHA-256 sidecar written after it; a package whose bytes do not match, or
  that fails to load, is deleted and built again (unless the temporary folder, where torch
  unpacks a package to load it, has less room than the package: that is a one-line error, and
  the package is kept).

Folder: ``$DYNATREE_CACHE_DIR/aot`` if the variable is set, else the platform's user cache dir,
beside the linear plans and the cost profiles. Nothing is removed from it on its own (another
virtual environment with another torch may share the folder and still load its packages):
:func:`prune`, behind ``dynatree engine-cache --prune``, removes what this environment can never
load and, if asked, what has not been used for some days.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

#: Bump when the step the packages hold changes, so older packages are never loaded.
FORMAT = 1

_T = TypeVar("_T")


def cache_dir() -> Path:
    """``$DYNATREE_CACHE_DIR/aot`` or the user cache dir."""
    from dynatree.core.costmodel import ENV_DIR

    root = os.environ.get(ENV_DIR)
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("dynatree")
    return Path(root) / "aot"


def machine() -> dict[str, Any]:
    """What compiled code depends on besides the model: the CPU and the libraries that built it."""
    import torch
    import transformers

    from dynatree.runtime.devices import cpu_model

    return {"cpu": cpu_model(), "machine": platform.machine(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def path_for(key: Mapping[str, Any]) -> Path:
    """The package file of ``key`` (which need not exist)."""
    digest = hashlib.sha256(json.dumps({"format": FORMAT, **key}, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return cache_dir() / f"{digest}.pt2"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def intact(path: Path) -> bool:
    """Whether ``path`` exists and matches the checksum written when it was built."""
    try:
        return path.is_file() and path.with_suffix(".sha256").read_text().strip() == _digest(path)
    except OSError:
        return False


def discard(path: Path) -> None:
    """Remove a package and its sidecar (a corrupt or unloadable one)."""
    for p in (path, path.with_suffix(".sha256")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``path``'s build lock: one process builds a package at a time, the others wait."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_into(path: Path, build: Callable[[str], None], meta: Mapping[str, Any]) -> float:
    """Run ``build(tmp_path)`` and move its file into place with its checksum; returns seconds."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp.pt2")
    start = time.perf_counter()
    try:
        build(str(tmp))
        path.with_suffix(".sha256").unlink(missing_ok=True)  # (no sidecar ever vouches for a file being replaced)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    record = {**meta, "format": FORMAT, "build_s": round(seconds, 1)}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1, default=str))
    path.with_suffix(".sha256").write_text(_digest(path))
    return seconds


def obtain(key: Mapping[str, Any], build: Callable[[str], None], load: Callable[[str], _T]) -> tuple[_T, bool]:
    """The loaded package of ``key``, built first if it is missing, corrupt or fails to load;
    returns it and whether it was built now. ``build`` writes a package to the path it is given;
    ``load`` turns a package path into what the caller runs (and raises if it cannot)."""
    path = path_for(key)
    if intact(path):
        with contextlib.suppress(Exception):
            return _used(path, load(str(path))), False
    with locked(path):
        if intact(path):  # (another process finished it while this one waited)
            try:
                return _used(path, load(str(path))), False
            except Exception as exc:  # noqa: BLE001 -- whatever a package that cannot load raises
                _refuse_without_room(path, exc)
        discard(path)
        build_into(path, build, key)
        return load(str(path)), True


def _refuse_without_room(path: Path, exc: Exception) -> None:
    """Raise a one-line error, keeping the package, where an intact package failed to load while
    the temporary folder has less room than the package: torch unpacks every package there to
    load it, so the failure says nothing about the package (a rebuild would delete a good one and
    then fail on the same full disk: seen when a process had filled ``/tmp`` with unpacked copies)."""
    import shutil
    import tempfile

    from dynatree.errors import DynaTreeError, first_line

    folder = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        size = path.stat().st_size
        if shutil.disk_usage(folder).free < size:
            raise DynaTreeError(
                f"cannot load the aot package {path.name} ({type(exc).__name__}: {first_line(exc)}): torch unpacks "
                f"it into {folder}, which has less free space than its {size / 1e6:.0f} MB; free "
                "space there or point TMPDIR elsewhere (the package is kept)") from exc


def _used(path: Path, loaded: _T) -> _T:
    """``loaded``, after stamping ``path``'s record with the time (what ``prune``'s
    ``unused_days`` reads: a file's access time is not kept on every filesystem)."""
    with contextlib.suppress(OSError):
        os.utime(path.with_suffix(".json"))
    return loaded


def cached(key: Mapping[str, Any]) -> bool:
    """Whether an intact package of ``key`` is on disk (what ``engine="auto"`` asks)."""
    return intact(path_for(key))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One package in the folder: its file, the record written when it was built (None if there is
    none), its size with its sidecars, when it was last built or loaded, and why this environment
    can never load it (None: it can)."""

    path: Path
    record: dict[str, Any] | None
    size: int
    used: float
    stale: str | None


def _stale(path: Path, record: dict[str, Any] | None, here: Mapping[str, Any], verify: bool) -> str | None:
    if record is None:
        return "no build record"
    if record.get("format", 1) != FORMAT:
        return f"package format {record.get('format', 1)}"
    for field in here:  # (what a package's code depends on besides the model: :func:`machine`)
        if record.get(field) != here[field]:
            return f"built for {field} {record.get(field)}"
    return "checksum mismatch" if verify and not intact(path) else None


def entries(verify: bool = False) -> list[Entry]:
    """Every package in :func:`cache_dir`, oldest use first; ``verify`` checks each one's checksum
    too (reading every byte: about a second for the embedded target's frozen package)."""
    here, out = machine(), []
    for path in cache_dir().glob("*.pt2"):
        if ".tmp." in path.name:
            continue
        try:
            record = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            record = None
        stats = []
        for f in (path, path.with_suffix(".json"), path.with_suffix(".sha256")):
            with contextlib.suppress(FileNotFoundError):
                stats.append(f.stat())
        if not stats:  # (removed since the glob)
            continue
        out.append(Entry(path, record, sum(st.st_size for st in stats), max(st.st_mtime for st in stats),
                         _stale(path, record, here, verify)))
    return sorted(out, key=lambda e: e.used)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # (signal 0 only asks; PermissionError means it exists under another user)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def prune(unused_days: float | None = None) -> tuple[list[Entry], int]:
    """Remove the packages this environment can never load (another torch, transformers, CPU or
    package format, a checksum that fails, no build record), and with ``unused_days`` those neither
    built nor loaded for that many days; also the temporary files of builds whose process is gone.
    A package being built (its lock held) is left alone, and so are the empty lock files: one
    removed while another process waits on it would let a third build beside that one. Returns
    the removed packages and every byte freed."""
    import fcntl

    cutoff = None if unused_days is None else time.time() - unused_days * 86400
    removed, freed = [], 0
    for tmp in cache_dir().glob("*.tmp.pt2"):
        pid = tmp.name.split(".")[1]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                freed += tmp.stat().st_size
                tmp.unlink()
    for entry in entries(verify=True):
        if entry.stale is None and (cutoff is None or entry.used >= cutoff):
            continue
        with open(entry.path.with_suffix(".lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # (being built or rebuilt now)
            discard(entry.path)
            entry.path.with_suffix(".json").unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)
        removed.append(entry)
        freed += entry.size
    return removed, freed
