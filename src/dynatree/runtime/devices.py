"""Device, dtype and compiler checks: one-line errors instead of tracebacks from deep inside torch.

Why this exists: ``model.to("cuda")`` on a torch built without CUDA ends in
``AssertionError: Torch not compiled with CUDA enabled``, a wrong index in a CUDA error raised on
first use, a dtype the device's kernels lack (float16 matmul on an old CPU torch) in a
``RuntimeError`` half-way through a forward, and ``torch.compile`` without a C++ compiler (CPU) or
Triton (GPU) in a long inductor traceback on the first call. Each of these is a user-fixable
setting, so each becomes a :class:`~dynatree.errors.DynaTreeError` (the CLI prints one line and
exits with code 2) before any model is loaded.

The dtype check *runs* the operations a decoder needs (linear, softmax, SDPA with an additive mask)
on a few elements instead of consulting a table: what a device supports depends on the torch
build and the hardware, and only trying tells.
"""

from __future__ import annotations

import functools
import platform

import torch
import torch.nn.functional as F

from dynatree.errors import DynaTreeError

SUPPORTED = ("cpu", "cuda", "mps")


def check_device(device: str | torch.device, dtype: torch.dtype = torch.float32, *,
                 compile: bool | str = False) -> torch.device:
    """The parsed device, after checking it exists, runs ``dtype``, and can compile if asked.

    Raises :class:`DynaTreeError` with the fix in the message otherwise.
    """
    dev = parse_device(device)
    check_available(dev)
    check_dtype(dev, dtype)
    if compile:
        check_compiler(dev)
    return dev


def parse_device(device: str | torch.device) -> torch.device:
    """``"cuda:1"`` -> ``torch.device("cuda", 1)``; unknown or unsupported names are refused."""
    if isinstance(device, torch.device):
        dev = device
    else:
        try:
            dev = torch.device(str(device).strip())
        except (RuntimeError, ValueError):
            raise DynaTreeError(f"unknown device '{device}': use cpu, cuda or cuda:N") from None
    if dev.type not in SUPPORTED:
        raise DynaTreeError(f"device type '{dev.type}' is not supported: use cpu, cuda or cuda:N (or mps)")
    return dev


def check_available(dev: torch.device) -> None:
    """Refuse a device this torch build or this machine does not have (or an index past the last)."""
    if dev.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            raise DynaTreeError(
                f"--device {dev}: this torch ({torch.__version__}) was built without CUDA; install a CUDA "
                "build of torch (https://pytorch.org/get-started/locally/) or use --device cpu"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DynaTreeError(
                f"--device {dev}: no CUDA GPU is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides "
                "them; `nvidia-smi` should list one); use --device cpu"
            )
        if dev.index is not None and dev.index >= count:
            raise DynaTreeError(
                f"--device {dev}: there is no GPU {dev.index}; {count} visible: "
                + ", ".join(f"cuda:{i}" for i in range(count))
            )
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise DynaTreeError(f"--device {dev}: Apple MPS is not available on this machine/torch; use --device cpu")
    elif dev.index not in (None, 0):
        raise DynaTreeError(f"--device {dev}: the CPU has no index; use --device cpu")


def check_dtype(dev: torch.device, dtype: torch.dtype) -> None:
    """Refuse a dtype whose decoder operations do not run on ``dev`` (found by running them)."""
    try:
        _probe_ops(str(dev), dtype)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        name = str(dtype).removeprefix("torch.")
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DynaTreeError(
            f"--dtype {name} does not run on {dev} with torch {torch.__version__} ({first}); "
            "use --dtype float32"
        ) from None


@functools.cache
def _probe_ops(device: str, dtype: torch.dtype) -> None:
    """Run a linear layer, a softmax and masked SDPA on a few elements (cached: once per pair)."""
    x = torch.ones(2, 8, dtype=dtype, device=device)
    w = torch.ones(4, 8, dtype=dtype, device=device)
    h = F.linear(x, w).softmax(-1)
    q = torch.ones(1, 1, 2, 8, dtype=dtype, device=device)
    mask = torch.zeros(2, 2, dtype=dtype, device=device)
    F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # CUDA errors surface at the next synchronisation
    del h


def check_compiler(dev: torch.device) -> None:
    """Refuse ``torch.compile`` where inductor cannot build code: no C++ compiler (CPU), no Triton (GPU)."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        raise DynaTreeError("--compile: torch.compile is not supported by this Python/torch; drop --compile")
    if dev.type == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as exc:  # noqa: BLE001 -- inductor's InvalidCxxCompiler (and whatever a broken search raises)
            raise DynaTreeError(
                f"--compile on cpu needs a working C++ compiler for torch inductor ({type(exc).__name__}: "
                "none of torch._inductor.config.cpp.cxx runs); install one (e.g. apt install g++) or drop --compile"
            ) from None
    elif dev.type == "cuda":
        from torch.utils._triton import has_triton_package

        if not has_triton_package():
            raise DynaTreeError("--compile on cuda needs Triton: pip install triton (or drop --compile)")


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (what a timing or a measured choice was taken on). Read once per
    process: the linear plan's key asks for it on every call (reading /proc/cpuinfo: ~40 us)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "processor\t: arm")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
