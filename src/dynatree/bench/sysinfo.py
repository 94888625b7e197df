"""Machine, library versions and peak memory: what a result row needs to be interpretable later.

Timings mean nothing without the machine (CPU model, cores, torch threads, GPU) and the library
versions, so every row carries them. Peak memory follows the issue: on CUDA the allocator peak
(``torch.cuda.max_memory_allocated``, reset before each run, so it is per run); on CPU the process
RSS high-water mark from ``getrusage``, which the OS cannot reset, so it is the peak *so far in the
process* (monotone across rows; compare strategies only via the CUDA figure or separate runs).
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from dynatree.runtime.devices import cpu_model

PACKAGES = ("torch", "transformers", "dynatree", "numpy", "safetensors", "accelerate", "gguf")


@lru_cache(maxsize=1)
def _static_machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
    else:
        info["gpu"] = None
    return info


def machine_info() -> dict[str, Any]:
    """Static machine facts plus the *current* torch thread count (the user may change it)."""
    return {**_static_machine(), "torch_threads": torch.get_num_threads()}


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


@lru_cache(maxsize=1)
def code_version() -> str:
    """The package version, plus the git commit when it runs from a checkout (``0.1.0+g1a2b3c4d5e6f``,
    ``.dirty`` appended with uncommitted changes to tracked files): a row measured by other code is
    another measurement."""
    try:
        version = metadata.version("dynatree")
    except metadata.PackageNotFoundError:  # run from a source tree on PYTHONPATH, not installed
        version = "0+unknown"
    root = Path(__file__).resolve().parents[3]  # src/dynatree/bench/sysinfo.py -> the checkout
    if not (root / ".git").exists():
        return version
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+g{sha}{'.dirty' if dirty else ''}"


def provenance() -> dict[str, Any]:
    """What else decides a measurement besides its settings: the machine (CPU, cores, GPU), the
    library versions and the code. Part of every row's resume key and run group, so re-running a
    recorded command on another machine, after an upgrade or after a code change measures again
    instead of reprinting old rows."""
    machine = _static_machine()
    return {"machine": {k: machine.get(k) for k in ("cpu", "cpu_count", "cpus_usable", "gpu", "gpu_count")},
            "versions": library_versions(), "code": code_version()}


def record_meta(threads: int) -> dict[str, Any]:
    """What a benchmark script's every record carries beside its numbers: threads, code, date,
    machine and torch. Call it at the script's start: the code is read once (``code_version`` is
    cached), so it names the code that ran, not what the tree holds when the run ends."""
    import time

    return {"threads": threads, "code": code_version(), "date": time.strftime("%Y-%m-%d"),
            "machine": machine_info(), "torch": torch.__version__}


def reset_peak_memory(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def peak_memory_mb(device: torch.device | str) -> tuple[float, str]:
    """(peak MiB, what was measured). See the module docstring for the CPU caveat."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**20, "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return rss * scale / 2**20, "process_rss_peak"
