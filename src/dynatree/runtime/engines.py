"""Which engine a run gets and the model+cache objects it runs on.

:func:`resolve` decides what :class:`~dynatree.options.EngineOptions` leaves to "auto";
:func:`cached_model` hands out model+cache objects, keeping the static ones in a
:class:`StaticPool` (their compiled graphs are tied to the cache storage, so reusing the object is
what spares a second call from compiling again); :func:`dynatree.loop.precompile.precompile` builds
every graph of a pool up front. The decoding loop itself (:mod:`dynatree.loop.generate`) only
consumes what this module builds.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from transformers import PreTrainedModel

from dynatree.runtime import distributed
from dynatree.runtime.cache import CachedModel, StaticCachedModel
from dynatree.errors import DynaTreeError
from dynatree.options import CacheOptions, EngineOptions

from dynatree.runtime.kernels import linear_plan
from dynatree.options import LinearPlan, fixed_plan
from dynatree.tuning import AOT_SAVING_S_PER_LAYER_TOKEN, AUTO_MIN_PARAMS, CPU_AUTO_BUCKETS  # (why: there)


def resolve(options: EngineOptions, target: torch.nn.Module, tokens: int | None = None) -> EngineOptions:
    """``options`` with ``"auto"``/None decided: the fastest exact configuration that does not make
    the call wait minutes for a compiler it would not repay.

    ``"auto"``, for a real model (>= ``AUTO_MIN_PARAMS`` parameters) without KV eviction, is the
    ahead-of-time compiled ``aot`` engine on a CPU once its packages for the model are on disk
    (:mod:`dynatree.runtime.aot_engine`: built once per model shape and machine, loaded in
    milliseconds; ``compile=`` given asks for the static engine instead), or when the call will
    generate ``tokens`` or more (:func:`aot_repaid_tokens`: the packages' expected build time over
    what each token saves on them), which builds them first. Where neither holds it says once per
    model, on stderr, that ``dynatree build-engine`` would make the steps faster. Otherwise it is the
    compiled static engine (buckets up to 32 rows on a CPU) on CUDA, and on a CPU when the options'
    explicit ``pool`` already holds compiled graphs for the model (``precompile`` into it, or an
    earlier call that compiled with it) or ``compile=True`` asks for it. The process's default
    pool is never consulted: what it holds only spares recompiling. Otherwise the eager hf engine:
    uncompiled, the static engine was no faster (a same-process A/B on a 2-core AMD EPYC VM), and
    there compiling one graph of the pair took minutes even with inductor's on-disk cache warm
    while it saves tens of ms per token, so a one-shot ``dynatree generate`` of a few hundred
    tokens would only lose. Explicit engines are kept;
    their ``compile=None`` means off. ``cpu_linear=None`` is measured on this CPU for this model
    (:func:`resolve_cpu_linear`).
    """
    engine, compile, buckets = options.engine, options.compile, options.buckets
    cpu_linear, plan = resolve_cpu_linear(target, options.cpu_linear, options.linear_plan)
    if engine == "auto":
        engine, compile, buckets = _auto_engine(target, compile, buckets, options.kv_window, options.pool,
                                                plan if cpu_linear else None, tokens)
    return options.replace(engine=engine, compile=False if compile is None else compile, buckets=buckets,
                           cpu_linear=cpu_linear, linear_plan=plan)


def _auto_engine(target: torch.nn.Module, compile: bool | str | None, buckets: tuple[int, ...] | None,
                 kv_window: int | None, pool: Any, plan: LinearPlan | None = None, tokens: int | None = None,
                 ) -> tuple[str, bool | str | None, tuple[int, ...] | None]:
    if kv_window is not None or not _has_params(target, AUTO_MIN_PARAMS):
        return "hf", compile, buckets  # compile=True here is refused as needing the static engine
    device = next(target.parameters()).device.type
    aot = device == "cpu" and compile is None and _aot_applies(target)
    if aot and _aot_cached(target, buckets, plan):
        return "aot", False, buckets
    repaid = aot_repaid_tokens(target, buckets, plan) if aot and tokens is not None else None
    if repaid is not None and tokens >= repaid:
        notice(f"dynatree: {tokens} tokens repay building the aot engine (from {repaid}): engine='auto' builds it")
        return "aot", False, buckets
    built = _check_pool(pool).compiled_buckets(target) if pool is not None else None
    if compile is None:  # (the compiler is asked last: its first check runs the C++ compiler, ~0.5 s
        #                    a CPU run without compiled graphs never needs; ~6 s more where torch._dynamo
        #                    is not imported yet)
        compile = (device == "cuda" or built is not None) and _can_compile(device)
    if not compile:  # uncompiled, the static engine is no faster than hf (engine_ab.jsonl): keep hf
        if aot:
            _hint_build(target, buckets, plan)
        return "hf", False, buckets
    if buckets is None:  # reuse the graphs already built rather than compiling other buckets
        buckets = built if built is not None else CPU_AUTO_BUCKETS if device == "cpu" else None
    return "static", compile, buckets


def _aot_applies(target: torch.nn.Module) -> bool:
    """Whether the aot engine can run ``target``: not with sliding-window layers, nor sharded (the
    engine refuses those)."""
    from dynatree.runtime.window import attention_layout

    return attention_layout(target) is None and not distributed.is_sharded(target)


def _aot_cached(target: torch.nn.Module, buckets: tuple[int, ...] | None, plan: LinearPlan | None) -> bool:
    """Whether the aot engine's packages for ``target`` are built on this machine (then a run
    loads them in milliseconds: ``"auto"`` takes that engine)."""
    from dynatree.runtime import aot_engine

    return aot_engine.all_cached(target, buckets or aot_engine.BUCKETS, plan)


def aot_repaid_tokens(target: torch.nn.Module, buckets: tuple[int, ...] | None, plan: LinearPlan | None) -> int:
    """Tokens after which building ``target``'s aot packages has paid for itself: their expected
    build time over what a token saves on them (``AOT_SAVING_S_PER_LAYER_TOKEN`` per layer). The
    draft model's packages are not counted: its saving is not either."""
    from dynatree.runtime import aot_engine

    return int(_aot_build_s(target, buckets, plan) / (AOT_SAVING_S_PER_LAYER_TOKEN * aot_engine.kv_shape(target)[0])) + 1


def _aot_build_s(target: torch.nn.Module, buckets: tuple[int, ...] | None, plan: LinearPlan | None) -> float:
    """The expected build time of ``target``'s aot packages (as many as its package layout has)."""
    from dynatree.runtime import aot_engine

    fixed, low = aot_engine.package_layout(target, buckets or aot_engine.BUCKETS, plan)
    return aot_engine.expected_build_s(target, len(fixed), 1 if low else 0)


#: Models already told that the aot engine is not built for them (weakly: never keeps one alive).
_HINTED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def _hint_build(target: torch.nn.Module, buckets: tuple[int, ...] | None, plan: LinearPlan | None) -> None:
    """Once per model: say that the compiled CPU engine would be faster and how to build it, rather
    than leave a user on the eager engine without knowing (a call as short as most is not worth
    building it inside: :func:`aot_repaid_tokens`)."""
    if target in _HINTED:
        return
    _HINTED.add(target)
    minutes = _aot_build_s(target, buckets, plan) / 60
    notice(f"dynatree: engine='auto' runs eager: the compiled CPU engine is not built for this model here; "
           f"`dynatree build-engine` (or dynatree.precompile(..., EngineOptions(engine='aot'))) builds it once "
           f"(about {minutes:.0f} min here) and later runs take it")


def _has_params(model: torch.nn.Module, count: int) -> bool:
    """Whether ``model`` has at least ``count`` parameters (elements). Counts only until it is sure:
    a real model's embedding alone passes, so the walk stops at its first tensor instead of
    iterating every parameter on every call (~1 ms on SmolLM2-135M)."""
    total = 0
    for p in model.parameters():
        if total >= count:
            return True
        total += p.numel()
    return total >= count


def _can_compile(device: str) -> bool:
    """Whether torch.compile can build code here: the same check ``compile=True`` refuses with."""
    from dynatree.runtime.devices import check_compiler

    try:
        check_compiler(torch.device(device))
    except DynaTreeError:
        return False
    return True




def resolve_cpu_linear(model: torch.nn.Module, cpu_linear: bool | None,
                       plan: LinearPlan | None = None) -> tuple[bool, LinearPlan | None]:
    """``generate``'s ``cpu_linear`` (and ``linear_plan``) decided: whether few-row linear calls
    leave ``F.linear``, and the plan of kernels by row count they take.

    None: off for a sharded model and off the CPU; on a CPU, the plan measured on this machine
    (:func:`~dynatree.runtime.kernels.linear_plan.plan_for`; a given ``linear_plan`` instead), on
    only where it leaves ``F.linear`` somewhere. The fixed rule it replaces (on from 2 threads) was
    measured on one CPU: on a 2-core Intel Sapphire Rapids it made autoregressive decoding 0.42x as
    fast as HF's own ``generate``. True: the given plan, or the layout tuned on the 2-core EPYC.
    """
    sharded = distributed.resolve_cpu_linear(model, cpu_linear)
    if sharded is not None:
        return sharded, None
    if cpu_linear is False:
        return False, None
    if cpu_linear is None:
        if next(model.parameters()).device.type != "cpu":
            return False, None
        plan = plan if plan is not None else linear_plan.plan_for(model, log=notice)
        return plan.active, plan if plan.active else None
    return True, plan if plan is not None else fixed_plan()


ROLES = ("target", "draft")


class StaticPool:
    """The static engine's model+cache objects kept between calls, and with them the graphs
    compiled against their storage (a second call then runs without compiling again).

    Keyed per model (weakly: a pool never keeps a model alive), role, vocabulary and cache options.
    The role keeps the target's cache and a draft's apart when one model is both (the target passed
    as its own draft): keyed on the model alone, both would get the same object once their rounded
    capacities agree, and the draft's prefill would write into the target's cache.

    Pass one as ``EngineOptions(pool=...)`` to decide what carries over between calls:
    :func:`dynatree.precompile` fills it, ``"auto"`` then takes the static engine for the models it
    holds graphs for, :meth:`clear` drops everything. Options without a pool use
    :data:`DEFAULT_POOL`, which ``"auto"`` never consults.
    """

    def __init__(self) -> None:
        self._models: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[str, int, CacheOptions], StaticCachedModel]]" = (
            weakref.WeakKeyDictionary())

    def get(self, model: torch.nn.Module, role: str, vocab: int, cache: CacheOptions, capacity: int) -> StaticCachedModel:
        """The object for (``model``, ``role``, ``vocab``, ``cache``) with room for ``capacity``
        rows, built (and compiled, if ``cache.compile``) when the pool has none that large."""
        entries = self._models.setdefault(model, {})
        kv = entries.get((role, vocab, cache))
        if kv is None or kv.capacity - kv.buckets[-1] < capacity:
            if cache.compile:
                notice(f"dynatree: compiling {type(model).__name__} for the static engine, once per pool (can take "
                       "minutes on a CPU; inductor's on-disk cache saves part of it next time)...")
            kv = StaticCachedModel(model, vocab, capacity, compile=cache.compile, compile_mode=cache.compile_mode,
                                   buckets=cache.buckets, cpu_linear=cache.linear_plan or False)
            entries[(role, vocab, cache)] = kv
        kv.reset()
        return kv

    def entries(self, model: torch.nn.Module) -> dict[tuple[str, int, CacheOptions], StaticCachedModel]:
        """What the pool holds for ``model``, by (role, vocabulary, cache options)."""
        return dict(self._models.get(model, {}))

    def compiled_buckets(self, model: torch.nn.Module) -> tuple[int, ...] | None:
        """The buckets of compiled graphs the pool holds for ``model`` (None: none)."""
        return next((kv.buckets for kv in self._models.get(model, {}).values() if kv._compiled), None)

    def clear(self) -> None:
        """Drop every object (and its compiled graphs)."""
        self._models = weakref.WeakKeyDictionary()


#: Where options without a ``pool`` keep their static objects: it spares recompiling across calls
#: and changes nothing else (``"auto"`` never reads it).
DEFAULT_POOL = StaticPool()


def _check_pool(pool: Any) -> StaticPool:
    if not isinstance(pool, StaticPool):
        raise DynaTreeError(f"EngineOptions(pool=...) must be a dynatree.runtime.engines.StaticPool, got "
                            f"{type(pool).__name__}")
    return pool


def cached_target(target: torch.nn.Module, vocab: int, options: EngineOptions, rows: int) -> CachedModel:
    """The target's model+cache for runs of up to ``rows`` tokens under resolved ``options``, plus
    room for one tree of the largest bucket."""
    cache = options.cache_options(next(target.parameters()).device.type)
    return cached_model(target, vocab, options.engine, rows + StaticCachedModel.BUCKETS[-1], cache, role="target",
                        pool=options.pool)


def cached_model(model: torch.nn.Module, vocab: int, engine: str, capacity: int, cache: CacheOptions,
                 role: str = "draft", pool: StaticPool | None = None) -> CachedModel:
    """A fresh model+cache for one generation; static ones come from ``pool`` (None:
    :data:`DEFAULT_POOL`) per model and ``role`` (``"target"`` or ``"draft"``: one model serving
    as both gets two caches).

    Compiled graphs are tied to the static cache's storage, so reusing the same object across
    calls (reset to length 0) is what makes the second call run without recompiling.
    """
    if role not in ROLES:
        raise DynaTreeError(f"role must be one of {ROLES}, got {role!r}")
    if engine == "hf":
        return CachedModel(model, vocab, cpu_linear=cache.linear_plan or False)
    if engine == "aot":  # (its cache grows as needed; capacity is a hint)
        from dynatree.runtime.aot_engine import AOTCachedModel

        return AOTCachedModel(model, vocab, capacity, buckets=cache.buckets, cpu_linear=cache.linear_plan or False)
    # Round up so that prompts of similar length reuse one cache (a new cache means new graphs).
    capacity = max(256, 1 << (capacity - 1).bit_length())
    return (DEFAULT_POOL if pool is None else _check_pool(pool)).get(model, role, vocab, cache, capacity)


@contextlib.contextmanager
def eval_mode(models: list[torch.nn.Module]) -> Iterator[None]:
    """Dropout would make verification random: run in eval mode, restore the caller's mode after.

    A model already wholly in eval mode (the usual case: ``from_pretrained`` returns one) is left
    alone: ``eval()`` and ``train(False)`` would only rewrite every module's flag with the value it
    has, and those two recursive walks cost ~4 ms per call on SmolLM2-135M and 0.3 ms on the tiny
    test models (2-core Intel Sapphire Rapids, 1 thread). The check walks the modules too, but only reads.
    """
    was = [m.training for m in models]
    untouched = [_wholly_eval(m) for m in models]
    for m, skip in zip(models, untouched):
        if not skip:
            m.eval()
    try:
        yield
    finally:
        for m, w, skip in zip(models, was, untouched):
            # (a skipped model is still put back if something switched it to training meanwhile)
            if not skip or not _wholly_eval(m):
                m.train(w)


#: ``train``/``eval`` implementations that do nothing but set ``training`` flags when no flag
#: changes (transformers' ``PreTrainedModel.train`` does more only on a change of mode).
_PLAIN_TRAIN = frozenset({torch.nn.Module.train, PreTrainedModel.train})
_PLAIN_EVAL = frozenset({torch.nn.Module.eval, PreTrainedModel.eval})


def _wholly_eval(model: torch.nn.Module) -> bool:
    """True if ``model`` and every submodule are in eval mode and use the plain ``train``/``eval``:
    then ``model.eval()`` and ``model.train(False)`` would change nothing."""
    if not isinstance(model, torch.nn.Module) or type(model).eval not in _PLAIN_EVAL:
        return False
    stack, seen = [model], {id(model)}
    while stack:
        m = stack.pop()
        if m.training or type(m).train not in _PLAIN_TRAIN:
            return False
        for child in m._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return True


def notice(message: str) -> None:
    """A one-line progress notice on stderr for slow one-time work (profiling, compiling)."""
    print(message, file=sys.stderr, flush=True)
