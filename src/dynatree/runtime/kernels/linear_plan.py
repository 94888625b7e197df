"""Which kernel each few-row linear call uses on this CPU, decided by measuring this CPU.

Why this exists: the few-row layouts of :mod:`dynatree.runtime.kernels.cpu_linear` were tuned on
one CPU (a 2-core AMD EPYC, where the one-row ``F.linear`` was slow and ``(W @ x.T).T`` fast). On a
2-core Intel Sapphire Rapids the same layout made a one-row step about 2.2x *slower* than
``F.linear`` (the row-major layout wins there only from ~16 rows), so autoregressive decoding ran at
0.42x HF's own ``generate``. Which kernel wins for how many rows is a property of the CPU and its
BLAS, not of the algorithm: so the choice is measured here, at first use, by passes over the
model's own weights as a step reads them (:func:`measure`: a few seconds), and cached on disk per
CPU, library versions, threads, dtype and shapes.

A :class:`~dynatree.options.LinearPlan` maps row counts to one of four kernels, all of which
compute the same product up to float summation order (greedy exactness is unaffected and tested
for each):

- ``"linear"``: ``F.linear`` itself, what HF's own ``generate`` runs;
- ``"rowmajor"``: ``(W @ x.T).T`` copied back to row-major order (one row padded to two);
- ``"onednn"``: oneDNN's product on the weights as they are (fp32, and bf16 on CPUs with bf16
  instructions);
- ``"packed"``: oneDNN's product with weights packed once per tensor (only where a second copy of
  the weights fits in memory: ``cpu_linear.packing_applies``).

:func:`choose` is pure (timings in, plan out), so the decision logic is tested with fake timings;
only :func:`measure` touches a clock. The cache folder is ``$DYNATREE_CACHE_DIR/linear-plan`` or the
user cache dir, beside the cost profiles; ``DYNATREE_LINEAR_PLAN`` (read per call) pins the plan
instead: ``fixed`` (the layout tuned on a 2-core AMD EPYC) or ``off`` (``F.linear`` everywhere).
A kernel replaces ``F.linear`` at a row count only when it measured at most ``MARGIN`` of its time:
``F.linear`` is the safe default, never slower than what HF runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dynatree.runtime.kernels.cpu_linear import drop_packed, onednn_dtypes, packing_applies, small_batch_linear
from dynatree.options import LinearPlan, fixed_plan

#: Row counts timed: the one-row step, small trees, and the widest few-row call (``CPU_LINEAR_MAX_ROWS``).
PROBE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
ENV_SWITCH = "DYNATREE_LINEAR_PLAN"  # "measure" (default), "fixed" (cpu_linear=True's), "off" (F.linear)
FORMAT = 4  # 4: the fastest pass; 3: oneDNN on the weights in place too, bf16 packed; 2: over the model's weights
#: A kernel other than ``F.linear`` is chosen for a row count only below this share of its time,
#: so noise in a short measurement cannot pick a kernel that is in truth no faster.
MARGIN = 0.9
#: The most weight bytes a measurement passes over (a model's first linear weights in forward
#: order, :func:`linear_weights`): far past any CPU's cache, so each pass reads memory as a step
#: does, while a big model's measurement stays a few seconds.
MEASURE_BYTES = 1024**3


def choose(timings: Mapping[int, Mapping[str, float]], margin: float = MARGIN, why: str = "measured") -> LinearPlan:
    """The plan from measured times: ``timings[rows][kernel]`` (any unit; ``"linear"`` required
    at every row count). A row count between two timed ones takes the decision of the next timed
    one above it; past the last, ``F.linear``."""
    bands = []
    for rows in sorted(timings):
        t = timings[rows]
        base = t["linear"]
        best = min((k for k in t if k != "linear"), key=lambda k: t[k], default=None)
        bands.append((rows, best if best is not None and t[best] <= margin * base else "linear"))
    return LinearPlan(tuple(bands), why)


# ----------------------------------------------------------------------------------- measuring
def _linear_modules_weights(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    """The weight of every ``nn.Linear`` module of ``model``, in module order (a forward's order)."""
    return (m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2)


def weight_shapes(model: torch.nn.Module) -> Counter[tuple[int, int]]:
    """The shapes of ``model``'s linear weights (``nn.Linear`` modules), with how often each occurs."""
    return Counter(tuple(w.shape) for w in _linear_modules_weights(model))


def linear_weights(model: torch.nn.Module, max_bytes: int | None = None) -> list[torch.Tensor]:
    """``model``'s linear weights in the order a forward reads them (module order), each tensor
    once (a tied head is its embedding's tensor, read once per step too); with ``max_bytes``, the
    first of them up to that many bytes (at least one)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    total = 0
    for w in _linear_modules_weights(model):
        if id(w) in seen:
            continue
        if max_bytes is not None and out and total + w.nbytes > max_bytes:
            break
        seen.add(id(w))
        out.append(w)
        total += w.nbytes
    return out


def head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The LM head's weight where the head is a plain ``nn.Linear`` (what the lazy head calls on
    final hidden states apart from the step), else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head.weight if isinstance(head, torch.nn.Linear) and head.weight.dim() == 2 else None


def measure(weights: Sequence[torch.Tensor], kernels: Iterable[str], rows: Iterable[int] = PROBE_ROWS,
            reps: int = 3, clock: Callable[[], float] = time.perf_counter) -> dict[int, dict[str, float]]:
    """Seconds per pass over ``weights`` (a model's linear weights in forward order,
    :func:`linear_weights`) per kernel and row count: the fastest of ``reps`` passes (noise only
    ever adds time; a median of three once kept the row-major layout for 13-16 rows of a bf16 1.5B
    model where packed weights are twice as fast), the kernels' passes interleaved, after one
    untimed pass per kernel (it packs the weights).

    Why whole passes over the model's own weights: a decoding step reads every weight once, from
    memory, since a model's weights do not fit in the CPU's caches. Timing one weight per shape over
    and over, as this module first did, keeps that weight in cache and measures the kernels'
    arithmetic instead. On a 2-core AMD EPYC (Zen 4) the two disagree on the step that matters
    most: one row through SmolLM2-135M's weights, cached, took 17.6 ms with ``F.linear`` and 16.7
    with the row-major layout (within the margin: ``F.linear`` kept); passing over the real weights
    took 45 and 20.5 ms, and autoregressive decoding with the cached-weight plan ran at 1.09x HF's
    ``generate`` against 1.57x with the row-major layout (2026-11-27).

    Packed copies made here stay on the weights (the plan that uses them reads them next);
    :func:`plan_for` drops them where the plan takes no packed kernel."""
    kernels = tuple(kernels)
    inputs: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
    g = torch.Generator().manual_seed(0)

    def rows_for(n: int, w: torch.Tensor) -> torch.Tensor:
        key = (n, w.shape[1], w.dtype)
        if key not in inputs:
            inputs[key] = torch.randn(n, w.shape[1], generator=g, dtype=torch.float32).to(w.dtype)
        return inputs[key]

    def one_pass(kernel: str, n: int) -> float:
        xs = [rows_for(n, w) for w in weights]
        t0 = clock()
        for x, w in zip(xs, weights):
            if kernel == "linear":
                torch.nn.functional.linear(x, w)
            else:
                small_batch_linear(x, w, kernel=kernel)
        return clock() - t0

    out: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for n in rows:
            times: dict[str, list[float]] = {k: [] for k in kernels}
            for rep in range(reps + 1):
                for k in kernels:
                    t = one_pass(k, n)
                    if rep:
                        times[k].append(t)
            out[n] = {k: min(v) for k, v in times.items()}
    return out


# ------------------------------------------------------------------------------------- caching
def machine() -> dict[str, Any]:
    """What a measured plan depends on besides the model: CPU, libraries, threads."""
    from dynatree.runtime.devices import cpu_model

    return {"cpu": cpu_model(), "machine": platform.machine(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "mkldnn": torch.backends.mkldnn.is_available()}


def cache_dir() -> Path:
    """``$DYNATREE_CACHE_DIR/linear-plan`` or the user cache dir (beside the cost profiles)."""
    from dynatree.core.costmodel import ENV_DIR

    root = os.environ.get(ENV_DIR)
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("dynatree")
    return Path(root) / "linear-plan"


def plan_key(shapes: Mapping[tuple[int, int], int], dtype: torch.dtype, packing: bool) -> dict[str, Any]:
    return {"format": FORMAT, **machine(), "dtype": str(dtype).replace("torch.", ""), "packing": packing,
            "shapes": sorted([list(s) + [n] for s, n in shapes.items()])}


def _path(key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return cache_dir() / f"{digest}.json"


#: Plans already decided in this process, per model (a hit saves the disk read; it never changes
#: what a call computes: a plan only picks among kernels that compute the same product).
_DECIDED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[str, int, torch.dtype], LinearPlan]] = weakref.WeakKeyDictionary()


def plan_for(model: torch.nn.Module, log: Callable[[str], None] | None = None, refresh: bool = False) -> LinearPlan:
    """The plan for ``model`` on this machine: cached on disk, else (or with ``refresh``) measured
    now (and saved).

    ``DYNATREE_LINEAR_PLAN`` (read per call) pins it instead: ``fixed`` (the EPYC-tuned layout) or
    ``off`` (``F.linear`` everywhere)."""
    pinned = os.environ.get(ENV_SWITCH, "measure").strip().lower()
    if pinned == "off":
        return LinearPlan((), f"{ENV_SWITCH}=off")
    dtype = next(model.parameters()).dtype
    # A model already decided in this process, at these threads and dtype: no walk of its modules
    # per call (what the key needs below costs ~1.5 ms on SmolLM2-135M). A layer replaced in place
    # keeps the old plan: a plan only picks among kernels that compute the same product.
    quick = (pinned, torch.get_num_threads(), dtype)
    hit = _DECIDED.get(model)
    if hit is not None and hit[0] == quick and not refresh:
        return hit[1]
    packing = packing_applies(model)
    if pinned == "fixed":
        plan = fixed_plan()
        return plan if packing else plan.without_packing()
    shapes = weight_shapes(model)
    if not shapes:
        return LinearPlan((), "no linear layers")
    key = plan_key(shapes, dtype, packing)
    cached = None if refresh else load(key)
    head = head_weight(model)
    # (a plan cached before plans had the head's own bands gets them measured, its layers' bands
    #  kept: measured again, they could flip near a crossing, and with them the aot engine's packages)
    if cached is None or (cached.head is None and head is not None):
        if log is not None:
            log("dynatree: timing the few-row linear kernels on this CPU (once per model shape and machine)...")
        kernels = ("linear", "rowmajor") + (("onednn",) if dtype in onednn_dtypes() else ()) \
            + (("packed",) if packing else ())
        why = f"measured on {key['cpu'] or 'this CPU'}, {key['threads']} threads"
        weights = linear_weights(model, MEASURE_BYTES) if cached is None else []
        body = choose(measure(weights, kernels), why=why) if cached is None else cached
        # The LM head alone too: the lazy head calls it apart from the step, on as many rows as
        # acceptance reads (one, to a tree's whole likely chain), and its one large weight of its
        # own shape picks its own kernel.
        head_bands = choose(measure([head], kernels), why=why).bands if head is not None else None
        plan = LinearPlan(body.bands, body.why, head_bands)
        # (the measurement's packed copies that no call of this plan reads: all of them, or all
        #  but the head's where only the head's calls take packed weights)
        measured = weights + ([head] if head is not None and all(w is not head for w in weights) else [])
        if not plan.packs:
            drop_packed(measured)
        elif not body.packs:  # (its head is None: its packs are the layers')
            drop_packed(w for w in measured if w is not head)
        try:
            save(key, plan)
        except OSError:
            pass  # a read-only cache dir only costs a measurement next time
    else:
        plan = cached
    _DECIDED[model] = (quick, plan)
    return plan


def load(key: Mapping[str, Any]) -> LinearPlan | None:
    try:
        return LinearPlan.from_json(json.loads(_path(key).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(key: Mapping[str, Any], plan: LinearPlan) -> Path:
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**plan.to_json(), "key": key}, indent=1, default=str))
    tmp.replace(path)  # atomic: two processes measuring at once cannot leave a torn file
    return path
