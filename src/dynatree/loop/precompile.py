"""Compile every graph a run could need before timing it (the public :func:`dynatree.precompile`)."""

from __future__ import annotations

import torch

from dynatree.drafts.model import draft_rows
from dynatree.drafts.registry import proposer_for
from dynatree.errors import DynaTreeError
from dynatree.loop.generate import max_positions
from dynatree.options import EngineOptions
from dynatree.runtime.cache import vocab_size
from dynatree.runtime.engines import cached_model, cached_target, eval_mode, resolve


def precompile(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    max_rows: int,
    options: EngineOptions | None = None,
    *,
    compile: bool | str | None = None,
    buckets: tuple[int, ...] | None = None,
    cpu_linear: bool | None = None,
) -> EngineOptions:
    """Build every bucket's graph of the static engines (or, with ``engine="aot"``, every package
    of the aot engine, built once per model shape and machine) now, for runs of up to ``max_rows``
    (prompt + new tokens), so that no compilation lands inside a timed generation; returns the
    resolved options to pass to those runs (``generate(..., options=...)``).

    Which buckets a run touches depends on the trees it happens to build, so warm-up runs alone
    can leave a graph to be compiled in the middle of a measurement (vLLM likewise captures all
    its CUDA-graph batch sizes at start-up). ``options`` (or the keywords) are those the runs will
    use; the engine is the static one, compiled unless ``compile=False``. The objects go into
    ``options.pool`` (a :class:`~dynatree.runtime.engines.StaticPool`; None: the default pool).
    """
    options = EngineOptions.merge(options, compile=compile, buckets=buckets, cpu_linear=cpu_linear)
    if options.engine == "hf":
        raise DynaTreeError("precompile builds the static engine's graphs, and these options pick engine='hf'")
    if options.engine != "aot":
        options = options.replace(engine="static", compile=True if options.compile is None else options.compile)
    options = resolve(options, target)
    vocab = vocab_size(target)
    cache = options.cache_options(next(target.parameters()).device.type)
    proposer = proposer_for(draft) if draft is not None else None
    drafts = proposer.models(draft) if proposer is not None else []
    # No run goes past the models' positions (generate refuses it): a larger max_rows would only
    # allocate cache rows that are never used -- gigabytes for max_new_tokens=10**9.
    max_rows = min([max_rows, *(n for n in map(max_positions, [target, *drafts]) if n is not None)])
    with torch.inference_mode(), eval_mode([target, *drafts]):  # (draft may be a TextDraft, not a module)
        kvs = [cached_target(target, vocab, options, max_rows)]
        if proposer is not None:
            engine = proposer.draft_engine(options)
            kvs += [cached_model(m, vocab, engine, draft_rows(max_rows), cache, pool=options.pool) for m in drafts]
        for kv in kvs:
            if kv.engine == "static":
                kv.precompile()
    return options
