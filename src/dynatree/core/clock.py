"""The one synchronising clock the loop, the bench and the cost model time with."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def sync_clock(device: torch.device) -> Callable[[], float]:
    """A wall clock that first waits for the device's queued work (CUDA kernels run asynchronously),
    so per-phase times are real; on a CPU it is ``time.perf_counter``. The one clock the engine,
    the bench and the cost model time with."""
    if device.type != "cuda":
        return time.perf_counter

    def tick() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return tick
