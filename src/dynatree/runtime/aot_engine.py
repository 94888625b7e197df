"""The ahead-of-time compiled engine (``engine="aot"``): each decoding step an AOTInductor package,
built once per model shape and machine, loaded by later processes in milliseconds.

Why a package: HF's modeling code dispatched op by op, plus Python, is about half of a CPU step
at the embedded 135M target. ``torch.compile`` removes that, but re-traces the model with dynamo
in every process (about 7 s a graph on a 2-core AMD EPYC, 12 graphs for a pair). An AOTInductor
package is traced once; a second process only opens a shared library.

The step a package holds takes the engine's own arguments, so every tree the loop builds runs
on it: the tokens padded to the package's row count (its *bucket*), a 4-D additive mask over the
cache's columns, the positions, the cache rows to write, and the KV cache itself as tensors the
step writes in place (``InputKV``). The cache's length is a dynamic dimension, so one package
serves every cache size and the cache grows without a rebuild.

A package reads every column of the cache, masked or not, so the cache grows by an eighth (in
steps of 128 columns) rather than doubling: on the EPYC a one-row step read 2,048 columns in
23.6 ms and 128 in 17.5 (medians, ``benchmarks/cpu/aot_kv_read.jsonl``). And it reads them in place: the export runs under
:func:`~dynatree.runtime.kernels.grouped_kv.grouped_kv`, so the query heads that share a key/value
head attend to it in place, stacked as rows of one product
(:class:`~dynatree.runtime.kernels.grouped_kv.PackedGroupedAttention`), instead of HF's per-head
copy of the cache (28.7 ms at 2,048 columns).

Two kinds of package, chosen by the few-row kernel plan
(:mod:`dynatree.runtime.kernels.linear_plan`, see :func:`package_layout`):

- where the plan multiplies in row-major order (one or two rows on the 2-core EPYC), one package
  per bucket: the export runs inside the plan's layout, so few rows are multiplied as
  ``weight @ x.T``, and the package holds no weights: they are bound at load to the live model's
  tensors (``user_managed``). On the 2-core EPYC a one-row step of SmolLM2-135M took 22.8 ms so,
  against 54.0 with inductor's own linear lowering (``benchmarks/cpu/aoti_step.jsonl``);
- from the row count where the plan reads packed weights (3 rows at the latest), ONE *frozen*
  package whose row count is a dynamic dimension: inductor packs the weights for oneDNN inside it
  (the products that read one input concatenated into one, ``FROZEN_INDUCTOR``), and its key is
  the weights' digest. It runs every tree of that size or more unpadded, and the prefill's chunks.

Exactness: a step's rows are computed from the same rows of the same cache as the eager engine's,
by other kernels (float rounding differs, the tokens are verified the same way). Packages are
CPU-only here; on CUDA, ``engine="static"`` with ``compile=True`` is the compiled engine.
"""

from __future__ import annotations

import contextlib
import json
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from dynatree.errors import DynaTreeError, first_line
from dynatree.options import LinearPlan
from dynatree.runtime import aot_store, distributed
from dynatree.runtime.cache import BucketedModel, few_row_layout, padded_step_inputs
from dynatree.runtime.kernels.cpu_linear import SmallBatchLinear
from dynatree.runtime.kernels.grouped_kv import SUPPORTED as GROUPED_KV, PackedGroupedAttention, grouped_kv
from dynatree.tuning import PREFILL_CHUNK

#: The engine's buckets on a CPU: verify trees of up to 16 rows (the measured budgets at 135M-1.5B
#: choose 3-8 nodes; a text proposal takes up to 16). Those below the plan's packed rows are one
#: package each; the rest one package of dynamic rows (:func:`package_layout`).
BUCKETS = (1, 2, 4, 8, 16)
#: Build seconds of one fixed-rows package: fixed, and per decoder layer; the package of dynamic
#: rows (its weights frozen in) takes ``BUILD_FROZEN_FACTOR`` times that. Fitted on the slower of
#: the two CPUs measured, so that a machine that never built a package is not promised too little:
#: a 2-core Intel Xeon (Emerald Rapids, KVM), 2026-11-28, SmolLM2-135M (30 layers) 82-91 s a fixed
#: bucket and 148 s the dynamic one, its 2-layer draft 14-17 s and 22 s (a 2-core AMD EPYC took
#: 55-60 s and 94 s for the target). Once this machine has built packages, the estimate is scaled
#: by what they took (:func:`build_pace`).
BUILD_S_PER_LAYER, BUILD_S_FIXED, BUILD_FROZEN_FACTOR = 2.6, 10.0, 1.6
#: The package of dynamic rows serves every call of this many rows or more wherever the plan packs
#: at all (:func:`package_layout`).
DYNAMIC_BY = 3
#: Inductor's settings for a frozen package: ``freezing`` folds the weights in and packs them for
#: oneDNN; ``cpp.enable_concat_linear`` (off in inductor's defaults) makes the products that read
#: one input (a layer's q, k and v projections; its gate and up) one product over their weights
#: concatenated at build, 2 oneDNN calls a layer instead of 5. Why: a few-row product is mostly the
#: call's fixed cost (q, k and v at 4-16 rows: 0.04-0.09 ms as one call against 0.09-0.14 as three,
#: a scratch timing), and a frozen package holds its own copy of the weights anyway, so the fused
#: weights cost no memory. Measured on a 2-core Intel Xeon, SmolLM2-135M, with the package serving
#: from 3 rows (``DYNAMIC_BY``): steps of 3-16 rows took 0.84-0.92x the time at 150 cached tokens,
#: prefills of 85-768 tokens about the same (0.96-1.02x) (``benchmarks/cpu/aot_concat_linear.jsonl``).
FROZEN_INDUCTOR = {"freezing": True, "cpp.enable_concat_linear": True}
_FIRST_COLUMNS = 64  # the cache's first allocation (and the export's example length)
_GROWTH_COLUMNS = 128  # the cache grows by an eighth, rounded up to a multiple of this


def grown_columns(needed: int) -> int:
    """The capacity to allocate for ``needed`` columns: an eighth more, rounded up to
    ``_GROWTH_COLUMNS`` (every package reads the whole capacity; growing by an eighth keeps the
    copies made while growing to about 8 times the final cache)."""
    return -(-(needed + needed // 8) // _GROWTH_COLUMNS) * _GROWTH_COLUMNS


class InputKV:
    """The part of HF's cache interface a decoder layer calls: ``update`` writes this call's keys
    and values at ``rows`` of caller-owned tensors and returns the whole tensors.

    HF's ``StaticCache`` held as module buffers does not export with torch 2.13 and transformers
    5.23 (a functionalization assert at its ``cumulative_length``); tensors passed in and written
    in place do."""

    is_compileable = True

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], rows: torch.Tensor) -> None:
        self.keys, self.values, self.rows = keys, values, rows

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        self.keys[layer_idx].index_copy_(2, self.rows, key)
        self.values[layer_idx].index_copy_(2, self.rows, value)
        return self.keys[layer_idx], self.values[layer_idx]


class Step(torch.nn.Module):
    """One decoding step of ``model`` on an :class:`InputKV` cache: the function a package holds
    (and the eager fallback for prefill chunks larger than every bucket). Returns the final hidden
    states when ``hidden`` (the head is applied afterwards, to the rows that need it), else logits."""

    def __init__(self, model: torch.nn.Module, hidden: bool) -> None:
        super().__init__()
        self.model, self.hidden = model, hidden
        # An input embedding the model reads but does not own (a distilled draft shares its
        # target's): registered here, it is a named weight of the package, bound at load like the
        # rest, instead of an anonymous constant.
        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        if isinstance(embedding, torch.nn.Module) and not any(m is embedding for m in model.modules()):
            self.shared_embedding = embedding

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        cache = InputKV(keys, values, rows)
        net = self.model.base_model if self.hidden else self.model
        out = net(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                  cache_position=rows)
        return out.last_hidden_state if self.hidden else out.logits


def prefill_layout(plan: LinearPlan | None, rows: int) -> contextlib.AbstractContextManager:
    """The linear kernel of an eager prefill chunk of ``rows`` rows (more than any bucket): oneDNN
    on the weights in place where the measured plan takes oneDNN at its largest row count (packed
    there: the packed copies are the frozen packages' own, so the chunk reads the weights as they
    are), else the plan's own choice (``F.linear`` past its last band).

    Why: a prefill chunk is compute-bound, and on the 2-core EPYC oneDNN's product ran it faster
    than ``F.linear``'s: the prefills of 6 Spec-Bench prompts (40-769 tokens, chunks of 256) took
    0.93x the time, 4 interleaved passes (``benchmarks/cpu/aot_prefill.jsonl``)."""
    if plan is not None and plan.active and plan.kernel(plan.max_rows) in ("packed", "onednn") and rows > plan.max_rows:
        return SmallBatchLinear(plan=LinearPlan(((rows, "onednn"),)))
    return few_row_layout(plan, rows)


def kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, KV heads, head size) of ``model``'s cache."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads, head_dim


def package_layout(model: torch.nn.Module, buckets: Sequence[int],
                   plan: LinearPlan | None) -> tuple[tuple[int, ...], int | None]:
    """The packages of ``buckets``: the fixed buckets (one unfrozen package each), and the fewest
    rows the one frozen package of dynamic rows serves (None: no such package).

    Where the plan packs at any bucket's rows and a copy of the weights fits the packing budget,
    the dynamic package starts at the first bucket the plan runs on packed weights at its row count
    or at any fewer rows (from the row after the bucket below it), or at ``DYNAMIC_BY`` rows if
    that is fewer; it serves every call of that many rows or more, unpadded, prefill chunks
    included. Why:

    - frozen, inductor packs the weights for oneDNN inside the package: traced instead, the plan's
      kernels become ``weight @ x.T`` (a packed oneDNN weight cannot be a bound input), which reads
      the weights once for one or two rows but not for more. A step of 8 rows of SmolLM2-135M took
      30.8 ms frozen against 44.6 traced (4 rows 25.7 against 30.3; 2-core EPYC);
    - one package of dynamic rows instead of a frozen one per bucket: a tree is not padded (at 300
      cached tokens, 5-6 rows 21.8-22.5 ms against 26.1-26.3 padded to 8, 10-12 rows 27.7-29.7
      against 34.0-34.4 padded to 16; medians, ``benchmarks/cpu/aot_dynamic_rows.jsonl``; at the
      buckets' own sizes it took the time of the bucket's own package, with the same outputs), and
      the weights are packed once (543 MB for the embedded target, on disk and in memory) instead
      of once per bucket. The prompt's chunks run on it too, about level with the eager chunks
      (12 Spec-Bench prompts: 5.49 s against 5.41; 0.79-1.06x prompt by prompt);
    - from ``DYNAMIC_BY`` (3) rows at the latest, wherever the plan packs at all: the frozen
      package fuses what the plan cannot (its oneDNN products take the layer's norm before them
      and the residual add after, and the products that read one input run as one,
      ``FROZEN_INDUCTOR``), so it beat the traced bucket at 3-4 rows where the plan, timing each
      product alone, chose ``F.linear`` up to 4 rows (2-core Intel Xeon, SmolLM2-135M, 150 cached
      tokens, medians: a 4-row step 30.5 ms frozen against 36.5 traced, 3 rows 30.6 against 34.9,
      ``benchmarks/cpu/aot_concat_linear.jsonl``; at 2 rows level in a scratch timing, 27.3-29.7
      against 26.9-27.9);
    - "or fewer rows": the plan is measured row count by row count over the model's weights, and
      near the crossing its choice flips with the machine's noise (the embedded target's plan on
      the EPYC: row-major for 1-2 rows, packed for 3, row-major for 4, packed from 6); packing
      only gains with rows (the 4-row step: 27.5 ms frozen against 31.4 traced row-major).
    """
    from dynatree.runtime.kernels.cpu_linear import packing_budget

    buckets = tuple(sorted(buckets))
    if plan is None:
        return buckets, None
    first = next((i for i, b in enumerate(buckets) if any(plan.kernel(r) == "packed" for r in range(1, b + 1))), None)
    if first is None or sum(p.numel() * p.element_size() for p in model.parameters()) > packing_budget():
        return buckets, None
    low = max(2, buckets[first - 1] + 1 if first else 2)  # (an export of dynamic rows needs 2 or more)
    low = min(low, DYNAMIC_BY)
    return tuple(b for b in buckets if b < low), low


def _stamp(model: torch.nn.Module) -> tuple:
    """What a package's binding and a frozen package's key read of ``model``: the storage, version
    (an in-place change) and shape of each tensor a step holds (an input embedding shared with
    another model included, as a distilled draft reads its target's)."""
    return tuple((t.data_ptr(), -1 if t.is_inference() else t._version, tuple(t.shape))
                 for t in _constants(model, False).values())


#: The weights' digest per model, with the (storage, version) of every tensor it was taken from.
_DIGESTS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, str]]" = weakref.WeakKeyDictionary()


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer of ``model`` (a frozen package holds their values).

    Taken once per model and kept while no tensor is replaced or changed in place (their storage
    and version counters are compared: about a millisecond); about 0.4 s for the 135M target."""
    import hashlib

    stamp = _stamp(model)
    hit = _DIGESTS.get(model)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    h = hashlib.sha256()
    for t in _constants(model, False).values():
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    _DIGESTS[model] = (stamp, h.hexdigest())
    return _DIGESTS[model][1]


def package_key(model: torch.nn.Module, bucket: int, hidden: bool, plan: LinearPlan | None,
                frozen: bool = False) -> dict[str, Any]:
    """What a package depends on (``aot_store``'s key): its code, and for a frozen package (the
    one of dynamic rows, from ``bucket`` rows) the weights it holds (their digest); an unfrozen one
    holds no weights."""
    dtype = next(model.parameters()).dtype
    key = {"class": type(model).__name__, "config": model.config.to_json_string(use_diff=False),
           "dtype": str(dtype), "bucket": bucket, "hidden": hidden,
           "few_row": plan is not None and plan.kernel(bucket) != "linear", "grouped_kv": "packed" if GROUPED_KV else False,
           **aot_store.machine()}
    if frozen:
        key.update(frozen=True, rows="dynamic", weights=weights_digest(model), inductor=FROZEN_INDUCTOR)
    return key


def _package_s(layers: int, frozen: bool) -> float:
    return (BUILD_S_FIXED + BUILD_S_PER_LAYER * layers) * (BUILD_FROZEN_FACTOR if frozen else 1.0)


def build_pace() -> float:
    """What this machine's packages took to build over what the constants above predict for them
    (1.0 before it built any): the records in the store of builds this environment can load (same
    CPU, torch and transformers as now). Bounded to 0.25-4 so that one odd build does not make the
    estimate absurd."""
    took = predicted = 0.0
    for entry in aot_store.entries():
        record = entry.record or {}
        if entry.stale is not None or "build_s" not in record or "config" not in record:
            continue
        try:
            config = json.loads(record["config"])
        except (TypeError, ValueError):
            continue
        layers = (config.get("text_config") or config).get("num_hidden_layers")
        if isinstance(layers, int):
            took += float(record["build_s"])
            predicted += _package_s(layers, bool(record.get("frozen")))
    return min(max(took / predicted, 0.25), 4.0) if predicted else 1.0


def expected_build_s(model: torch.nn.Module, fixed: int, frozen: int = 0) -> float:
    """Seconds to build ``fixed`` packages of fixed rows and ``frozen`` of dynamic rows for
    ``model`` on this machine (the constants above, times :func:`build_pace`)."""
    layers = kv_shape(model)[0]
    return (fixed * _package_s(layers, False) + frozen * _package_s(layers, True)) * build_pace()


def build_package(path: str, model: torch.nn.Module, bucket: int, hidden: bool, plan: LinearPlan | None,
                  frozen: bool = False, batch: bool = False) -> None:
    """Export ``Step`` for ``bucket`` rows (the cache length dynamic) and package it: weights left
    out and the plan's few-row kernel traced in, or ``frozen``: weights packed into the package,
    and the row count dynamic too (``bucket`` rows or more; traced with 8 or more). ``batch``
    (frozen only): the batch dimension dynamic as well, for :mod:`dynatree.runtime.aot_batch`
    (any batch and row count, one or more; traced with 2 rows of 8)."""
    layers, heads, dim = kv_shape(model)
    param = next(model.parameters())
    cols = torch.export.Dim("columns", min=bucket + 2, max=1 << 22)
    # (Dim.AUTO: a named range fails export's proof of guards it cannot simplify, such as
    #  ``rows * min(64, 192 * rows) == 64 * rows`` from the stacked heads; checked below instead)
    rows = torch.export.Dim.AUTO
    if batch and not frozen:
        raise ValueError("a package of dynamic batches is a frozen one")
    if frozen:
        bucket = max(bucket, 8)
    b = 2 if batch else 1
    layout = contextlib.nullcontext() if frozen else few_row_layout(plan, bucket)
    packed = PackedGroupedAttention() if GROUPED_KV else contextlib.nullcontext()
    with torch.inference_mode(False), torch.no_grad(), layout, grouped_kv(GROUPED_KV), packed:
        keys = [torch.zeros(b, heads, _FIRST_COLUMNS, dim, dtype=param.dtype) for _ in range(layers)]
        values = [torch.zeros_like(k) for k in keys]
        mask = torch.zeros(b, 1, bucket, _FIRST_COLUMNS, dtype=param.dtype)
        args = (torch.zeros(b, bucket, dtype=torch.long), mask, torch.arange(bucket).repeat(b, 1),
                torch.arange(bucket), keys, values)
        if batch:
            shapes = ({0: rows, 1: rows}, {0: rows, 2: rows, 3: cols}, {0: rows, 1: rows}, {0: rows}) \
                + ([{0: rows, 2: cols}] * layers, [{0: rows, 2: cols}] * layers)
        elif frozen:
            shapes = ({1: rows}, {2: rows, 3: cols}, {1: rows}, {0: rows}) + ([{2: cols}] * layers, [{2: cols}] * layers)
        else:
            shapes = (None, {3: cols}, None, None) + ([{2: cols}] * layers, [{2: cols}] * layers)
        try:
            program = torch.export.export(Step(model, hidden), args, dynamic_shapes=shapes, strict=False)
        except Exception as exc:  # (torch.export's errors run over many lines)
            raise DynaTreeError(f"engine='aot' cannot export {type(model).__name__}: {first_line(exc)}") from exc
        ids = next(n for n in program.graph.nodes if n.op == "placeholder" and n.meta["val"].dim() == 2
                   and n.meta["val"].dtype == torch.long)
        dims = ids.meta["val"].shape[:2] if batch else ids.meta["val"].shape[1:2]
        if frozen and not all(isinstance(d, torch.SymInt) for d in dims):
            raise DynaTreeError(f"engine='aot' cannot export {type(model).__name__} with a dynamic "
                                f"{'batch and ' if batch else ''}row count (the export fixed it); use engine='hf'")
        config = dict(FROZEN_INDUCTOR) if frozen else {"aot_inductor.package_constants_in_so": False}
        torch._inductor.aoti_compile_and_package(program, package_path=path, inductor_configs=config)


def _constants(model: torch.nn.Module, hidden: bool) -> dict[str, torch.Tensor]:
    step = Step(model, hidden)
    named = dict(step.named_parameters(remove_duplicate=False))
    named.update(step.named_buffers(remove_duplicate=False))
    return named


class _Bound:
    """A loaded package with the model's tensors bound (rebound if the model's storage moved)."""

    def __init__(self, runner: Any, frozen: bool = False) -> None:
        self.runner, self.ptrs, self.frozen = runner, (), frozen

    def bind(self, model: torch.nn.Module, hidden: bool) -> None:
        if self.frozen:  # (its weights are inside it; its key is their digest)
            return
        named = _constants(model, hidden)
        wanted = self.runner.get_constant_fqns()
        ptrs = tuple(named[n].data_ptr() if n in named else 0 for n in wanted)
        if ptrs != self.ptrs:
            missing = [n for n in wanted if n not in named]
            if missing:
                raise DynaTreeError(f"engine='aot' cannot bind {type(model).__name__}'s package: it reads tensors "
                                    f"that are not the model's weights ({', '.join(missing[:3])}); use engine='hf'")
            self.runner.load_constants({n: named[n] for n in wanted}, check_full_update=True, user_managed=True)
            self.ptrs = ptrs


#: Loaded packages per model (weakly: never keeps a model alive) and package key.
_LOADED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, _Bound]]" = weakref.WeakKeyDictionary()
#: :func:`packages`' answers per model and layout, with the stamp of the weights they are bound to.
_READY: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, tuple[tuple, dict[int, _Bound]]]]" = \
    weakref.WeakKeyDictionary()


def forget() -> None:
    """Drop every loaded package of this process (they load again from the store on next use)."""
    _LOADED.clear()
    _READY.clear()


def packages(model: torch.nn.Module, buckets: Sequence[int], hidden: bool, plan: LinearPlan | None,
             log: Any = None) -> dict[int, _Bound]:
    """The bound packages of :func:`package_layout`, keyed by their fewest rows (each fixed bucket,
    and the dynamic package's lower end): loaded from the store, built first where missing.

    A second call for the same model, layout and weights (the stamp of every tensor unchanged)
    returns the first call's packages as they are: each ``generate`` opens an engine, and the keys
    (the config's JSON, the weights' digest) and the binding's walk over the model's tensors took
    6.3 ms a call for the embedded target, 1.0 with the stamp (2-core Intel Xeon; a short prompt's
    first token takes about 100 ms there)."""
    ready = _READY.setdefault(model, {})
    memo, stamp = (tuple(buckets), hidden, plan), _stamp(model)
    hit = ready.get(memo)
    if hit is not None and hit[0] == stamp:
        return dict(hit[1])
    out = _packages(model, buckets, hidden, plan, log)
    ready[memo] = (stamp, out)
    return dict(out)


def _packages(model: torch.nn.Module, buckets: Sequence[int], hidden: bool, plan: LinearPlan | None,
              log: Any = None) -> dict[int, _Bound]:
    loaded = _LOADED.setdefault(model, {})
    fixed, low = package_layout(model, buckets, plan)
    buckets = fixed + ((low,) if low else ())
    keys = {b: package_key(model, b, hidden, plan, b == low) for b in buckets}
    names = {b: json.dumps(k, sort_keys=True) for b, k in keys.items()}
    todo = [b for b in buckets if names[b] not in loaded and not aot_store.cached(keys[b])]
    bar = _announce(model, len(todo), expected_build_s(model, sum(b != low for b in todo), int(low in todo)), log) \
        if todo else None
    out = {}
    try:
        for b in buckets:
            if names[b] not in loaded:
                def load(path: str, b: int = b) -> _Bound:
                    bound = _Bound(torch._inductor.aoti_load_package(path), b == low)
                    bound.bind(model, hidden)
                    return bound

                loaded[names[b]], _ = aot_store.obtain(
                    keys[b], lambda path, b=b: build_package(path, model, b, hidden, plan, b == low), load)
                if bar is not None and b in todo:
                    bar.update(1)
            out[b] = loaded[names[b]]
            out[b].bind(model, hidden)
    finally:
        if bar is not None:
            bar.close()
    return out


def _announce(model: torch.nn.Module, count: int, seconds: float, log: Any) -> Any:
    """Say that ``count`` packages are being built and about how long that takes; a progress bar."""
    (log or _notice)(f"dynatree: building the aot engine for {type(model).__name__}: {count} package(s), about "
                     f"{seconds / 60:.1f} min here, once per model shape and machine (kept in {aot_store.cache_dir()})")
    from tqdm.auto import tqdm

    return tqdm(total=count, desc="aot packages", unit="pkg", dynamic_ncols=True, file=sys.stderr)


def batch_key(model: torch.nn.Module, hidden: bool, plan: LinearPlan | None) -> dict[str, Any]:
    """The key of ``model``'s package of dynamic batches (:mod:`dynatree.runtime.aot_batch`)."""
    return {**package_key(model, 1, hidden, plan, frozen=True), "batch": "dynamic"}


def batch_package(model: torch.nn.Module, hidden: bool, plan: LinearPlan | None, log: Any = None) -> _Bound:
    """``model``'s one frozen package of dynamic batch and row counts, loaded from the store or
    built first (about as long as the package of dynamic rows)."""
    loaded = _LOADED.setdefault(model, {})
    key = batch_key(model, hidden, plan)
    name = json.dumps(key, sort_keys=True)
    if name not in loaded:
        bar = None if aot_store.cached(key) else _announce(model, 1, expected_build_s(model, 0, 1), log)
        try:
            loaded[name], _ = aot_store.obtain(
                key, lambda path: build_package(path, model, 1, hidden, plan, frozen=True, batch=True),
                lambda path: _Bound(torch._inductor.aoti_load_package(path), frozen=True))
        finally:
            if bar is not None:
                bar.update(1)
                bar.close()
    return loaded[name]


def loaded_records(model: torch.nn.Module) -> list[dict[str, Any]]:
    """The build records (key, ``build_s``) of the packages this process loaded for ``model``."""
    records = []
    for name in _LOADED.get(model, {}):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(aot_store.path_for(json.loads(name)).with_suffix(".json").read_text()))
    return records


def all_cached(model: torch.nn.Module, buckets: Sequence[int], plan: LinearPlan | None) -> bool:
    """Whether every package of ``buckets`` is on disk for ``model`` (what ``engine="auto"`` asks)."""
    from dynatree.runtime.cache import plain_head

    hidden, (fixed, low) = plain_head(model), package_layout(model, buckets, plan)
    # (the unfrozen ones first: a frozen package's key needs the weights' digest, about 0.4 s for
    # the 135M target, which a machine that never built the engine should not pay on every call)
    order = fixed + ((low,) if low else ())
    return all(aot_store.cached(package_key(model, b, hidden, plan, b == low)) for b in order)


def _notice(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class AOTCachedModel(BucketedModel):
    """A model and its KV cache, each step run by an AOTInductor package (see the module's doc).

    Calls below the dynamic package's rows are padded to the smallest fixed bucket that holds them,
    as on the static engine: padding rows write KV rows after the real ones, are masked from every
    later query, and are then overwritten. ``buckets`` lists every row count a call runs at (each
    fixed bucket, then every count the dynamic package serves up to the largest tree), so a cost
    profile timed at them is exact. Compaction gathers accepted rows in place."""

    engine = "aot"

    def __init__(self, model: torch.nn.Module, vocab_size: int, capacity: int, buckets: Sequence[int] | None = None,
                 cpu_linear: bool | LinearPlan = False) -> None:
        super().__init__(model, vocab_size, cpu_linear)
        if self.device.type != "cpu":
            raise DynaTreeError(f"engine='aot' runs on a CPU; on {self.device.type} use engine='static' with compile=True")
        if self.layout is not None:
            raise DynaTreeError(f"engine='aot' supports full-attention models only; {type(model).__name__} has "
                                "sliding-window layers (use engine='hf')")
        if distributed.is_sharded(model):  # (a package holds one process's graph: no collectives)
            raise DynaTreeError("engine='aot' does not run a tensor-parallel (sharded) model; use engine='hf'")
        self.cache = None  # (the KV lives in self.keys / self.values)
        wanted = tuple(sorted(buckets)) if buckets else BUCKETS
        self.max_tree_rows = wanted[-1]
        self._hidden = self.plain_head()
        self._packages = packages(model, wanted, self._hidden, self.linear_plan)
        # (read off the packages themselves: a second layout could see other free memory)
        fixed = tuple(b for b, p in self._packages.items() if not p.frozen)
        low = self._dynamic_from = next((b for b, p in self._packages.items() if p.frozen), None)
        self.buckets = fixed + (tuple(range(low, max(low, self.max_tree_rows) + 1)) if low else ())
        # (what the steps were built with: a cost profile timed on other packages is not theirs)
        self.build = {"grouped_kv": "packed" if GROUPED_KV else False, "dynamic_from": low,
                      "frozen": FROZEN_INDUCTOR if low else None}
        self._eager = Step(model, self._hidden)
        layers, heads, dim = kv_shape(model)
        self._kv_shape = (layers, heads, dim)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._allocate(_FIRST_COLUMNS)  # (``capacity`` is not needed: the cache grows as it fills)
        self._length = 0

    # -------------------------------------------------------------------------------- storage
    def _allocate(self, columns: int) -> None:
        """(Re)allocate the cache with ``columns`` columns, keeping the rows cached so far."""
        layers, heads, dim = self._kv_shape
        old_k, old_v = self.keys, self.values
        self.keys = [torch.zeros(1, heads, columns, dim, dtype=self.dtype) for _ in range(layers)]
        self.values = [torch.zeros(1, heads, columns, dim, dtype=self.dtype) for _ in range(layers)]
        for new, old in zip(self.keys + self.values, old_k + old_v):
            n = min(old.shape[2], columns)
            new[:, :, :n] = old[:, :, :n]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self._length = 0
        self.calls = 0

    # -------------------------------------------------------------------------------- calls
    def call(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
             base: bool = False, **inputs: Any) -> Any:
        raise DynaTreeError("engine='aot' runs plain steps only (extra model inputs need engine='hf')")

    def prefill(self, tokens: Sequence[int], hidden: bool = False, layers: Sequence[int] = (),
                logits: bool = False) -> torch.Tensor | None:
        """Causal prefill in even chunks of at most ``PREFILL_CHUNK`` tokens (those larger than
        every bucket run the same step eagerly, unpadded), each on a cache of exactly the columns
        it fills.

        Why exact: a package reads every column of the cache, masked or not, and a prompt's chunks
        are the calls with the most rows: grown by an eighth, a 768-token prompt's chunks read 25%
        more columns than they filled, and attention is about a third of its prefill (2-core Intel
        Xeon, SmolLM2-135M: 0.46 ms per column read by a 768-row prefill, a scratch timing). Why even: 769 tokens in
        chunks of 256 leave a one-token chunk that reads all the weights for one row. Measured on
        12 Spec-Bench prompts (39-768 tokens), same argmax: 0.97x the prefill time of the replaced
        policy in all, 0.88x at 768 tokens, 0.96-1.04x at 659-766, level below 100
        (``benchmarks/cpu/aot_prefill_exact.jsonl``). Decoding then grows the cache by an eighth."""
        n = len(tokens)
        step = max(self.max_tree_rows, PREFILL_CHUNK)
        size = -(-n // -(-n // step)) if n else step  # (the fewest chunks, as even as they go)
        parts = []
        for i in range(0, n, size):
            chunk = list(tokens[i : i + size])
            width = self.bucket_for(len(chunk)) or len(chunk)
            if self._length + width > self.capacity:
                self._allocate(self._length + width)
            parts.append(super(AOTCachedModel, self).prefill(chunk, hidden, layers, logits and i + size >= n))
        if not hidden:
            return parts[-1] if logits and parts else None
        return torch.cat(parts) if parts else super().prefill([], hidden, layers)


    def forward_features(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                         since: int, layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        if layers:
            raise DynaTreeError(f"fused target features (layers {list(layers)}) need the hf engine, not 'aot'")
        hidden = self.forward_hidden(tokens, positions, visible, since)
        return hidden, hidden

    def _run(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
             last_only: bool) -> torch.Tensor:
        """One step by its package: a fixed bucket's (padded), or the package of dynamic rows
        (unpadded, prefill chunks too), else an unpadded eager one for a prefill chunk larger than
        every bucket; the real rows of its output."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        q, length = tokens.numel(), self._length
        bucket = self.bucket_for(q)
        dynamic = self._dynamic_from is not None and (bucket or q) >= self._dynamic_from
        if bucket is None and not (visible.shape[1] == q and torch.equal(visible, torch.ones(q, q, dtype=torch.bool).tril())):
            raise DynaTreeError(f"a call of {q} tree rows exceeds the aot engine's largest bucket ({self.buckets[-1]})")
        width = bucket or q
        if length + width > self.capacity:
            self._allocate(grown_columns(length + width))
        self.calls += 1
        # A package reads the whole cache (its length is the package's dynamic dimension); an eager
        # chunk reads only the rows it attends to, through views (a package's inputs must be whole).
        columns = self.capacity if bucket or dynamic else length + q
        ids, pos, allowed = padded_step_inputs(tokens, positions, visible, since, length, width, columns)
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        args = (ids, mask.view(1, 1, width, -1), pos, torch.arange(length, length + width))
        if dynamic:
            out = self._packages[self._dynamic_from].runner(*args, self.keys, self.values)
        elif bucket is None:
            with prefill_layout(self.linear_plan, q), grouped_kv(GROUPED_KV):
                out = self._eager(*args, [k[:, :, :columns] for k in self.keys], [v[:, :, :columns] for v in self.values])
        else:
            out = self._packages[bucket].runner(*args, self.keys, self.values)
        self._length = length + q
        return out[0, q - 1 : q] if last_only else out[0, :q]

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        keep_t = torch.as_tensor(keep, dtype=torch.long)
        k = int(keep_t.numel())
        if k and not (int(keep_t[0]) == start and int(keep_t[-1]) == start + k - 1):
            for t in self.keys + self.values:
                t[:, :, start : start + k] = t[:, :, keep_t]
        self._length = start + k
