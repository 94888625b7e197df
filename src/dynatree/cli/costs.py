"""``dynatree costs`` (what a model costs on this machine, and the budgets the defaults take),
``dynatree random-model`` (a random-weight model of a real model's shape, to see those costs for a
model whose weights you do not have here), ``dynatree build-engine`` (the ahead-of-time compiled
engine's packages for a pair, built once per model shape and machine) and ``dynatree engine-cache``
(those packages listed, and pruned)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynatree.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from dynatree.cli.common import friendly_errors, set_threads

Opt = typer.Option


@friendly_errors
def costs(
    target: Annotated[str, Opt(help="Preset, model folder (e.g. one `dynatree random-model` wrote), hub id or .gguf file.")] = DEFAULT_TARGET,
    draft: Annotated[str, Opt(help=f"A draft model to price too ('default': {DEFAULT_DRAFT}; 'none': the target alone).")] = "none",
    dtype: Annotated[str, Opt(help="float32 | bfloat16")] = "float32",
    threads: Annotated[int | None, Opt(help="torch CPU threads (what your runs will use).")] = None,
    fresh: Annotated[bool, Opt("--fresh", help="Measure again and replace what is cached (e.g. a profile measured "
                                               "while the machine was busy).")] = False,
) -> None:
    """What TARGET costs on this machine's CPU: the linear kernels per row count, the verify cost by
    tree size against one read of the weights, and the tree budget and draft-call price the
    defaults read off it (measured once per model and machine, then read from the cache)."""
    set_threads(threads)
    from dynatree.bench.costs import describe, measure_costs
    from dynatree.loading.models import load_model, parse_dtype, resolve_draft
    from dynatree.runtime.engines import notice

    model, tok = load_model(target, dtype=parse_dtype(dtype))
    dmodel = None
    if draft != "none":
        dmodel = resolve_draft(DEFAULT_DRAFT if draft == "default" else draft, model, dtype=parse_dtype(dtype), tokenizer=tok)
    typer.echo(describe(measure_costs(model, dmodel, log=notice, refresh=fresh)))


@friendly_errors
def random_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model (config, weights, tokenizer) to.")],
    like: Annotated[str, Opt(help="A shape: qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-3b | qwen2.5-7b | llama-3.2-1b | "
                                  "llama-3.2-3b | llama-3.1-8b, or a config.json file.")] = "qwen2.5-1.5b",
    tokenizer: Annotated[str, Opt(help="The tokenizer to save with it (its prompts' ids must fit the shape's vocabulary).")] = DEFAULT_TARGET,
    dtype: Annotated[str, Opt(help="float32 | bfloat16")] = "float32",
) -> None:
    """Write a model of a real model's shape with random weights: its costs (`dynatree costs
    --target OUT`, `dynatree bench --target OUT`) are the real model's, its text is noise."""
    from dynatree.bench.shapes import save_random_model, shape_config
    from dynatree.loading.models import load_tokenizer, parse_dtype

    config = shape_config(like)  # (an unknown shape is refused before anything is built)
    tok = load_tokenizer(tokenizer)
    folder = save_random_model(like, out, tok, parse_dtype(dtype))
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    typer.echo(f"{folder}: a {config.model_type} model shaped like {like}, random weights ({size / 1e9:.2f} GB), "
               f"tokenizer of {tokenizer}")


@friendly_errors
def build_engine(
    target: Annotated[str, Opt(help="Preset, model folder, hub id or .gguf file.")] = DEFAULT_TARGET,
    draft: Annotated[str, Opt(help=f"The draft model to build for too ('default': {DEFAULT_DRAFT}; 'none': the "
                                   "target alone).")] = "default",
    dtype: Annotated[str, Opt(help="float32 | bfloat16")] = "float32",
    threads: Annotated[int | None, Opt(help="torch CPU threads (what your runs will use).")] = None,
    batches: Annotated[bool, Opt("--batches", help="Also build the target's package for batches of prompts (one "
                                                   "more package, about as long as the largest).")] = False,
) -> None:
    """Build the aot engine's packages for TARGET (and its draft) on this machine: minutes once, then
    every process loads them in milliseconds and `engine=auto` runs on them (on a CPU)."""
    set_threads(threads)
    import time

    from dynatree.loading.models import load_model, parse_dtype, resolve_draft
    from dynatree.loop.precompile import precompile
    from dynatree.options import EngineOptions
    from dynatree.runtime import aot_store

    model, tok = load_model(target, dtype=parse_dtype(dtype))
    dmodel = None
    if draft != "none":
        dmodel = resolve_draft(DEFAULT_DRAFT if draft == "default" else draft, model, dtype=parse_dtype(dtype), tokenizer=tok)
    start = time.perf_counter()
    precompile(model, dmodel, 1 << 12, EngineOptions(engine="aot"))
    if batches:
        from dynatree.runtime import aot_batch

        aot_batch.prepare(model)
    typer.echo(f"aot engine ready for {target}{'' if dmodel is None else ' and its draft'}"
               f"{' (batches too)' if batches else ''} in "
               f"{time.perf_counter() - start:.1f} s (packages in {aot_store.cache_dir()})")


@friendly_errors
def engine_cache(
    prune: Annotated[bool, Opt("--prune", help="Remove the packages this environment can never load (built by another "
                                               "torch, transformers or CPU, or damaged).")] = False,
    unused_days: Annotated[float | None, Opt(help="With --prune: also remove packages neither built nor loaded for "
                                                  "this many days.")] = None,
) -> None:
    """List the aot engine's packages on this machine (model, rows, size, build time, last use, and
    why one can no longer load here), or remove the dead ones with --prune. Nothing is removed
    otherwise: another environment with another torch may share the folder."""
    import datetime

    from dynatree.errors import DynaTreeError
    from dynatree.runtime import aot_store

    if unused_days is not None and (not prune or unused_days < 0):
        raise DynaTreeError(f"--unused-days {unused_days:g} needs --prune and a number of days >= 0")
    if prune:
        removed, freed = aot_store.prune(unused_days)
        for entry in removed:
            typer.echo(f"removed {entry.path.name}: {entry.stale or 'unused'}")
        typer.echo(f"{len(removed)} package(s) removed, {freed / 1e6:.0f} MB freed ({aot_store.cache_dir()})")
        return
    listed = aot_store.entries(verify=True)
    for e in listed:
        r = e.record or {}
        rows = f"{r.get('bucket')}+ rows" if r.get("frozen") else f"{r.get('bucket')} rows"
        when = datetime.datetime.fromtimestamp(e.used).strftime("%Y-%m-%d %H:%M")
        typer.echo(f"{e.path.name}  {r.get('class', '?'):<20} {rows:<9} {e.size / 1e6:7.0f} MB  "
                   f"built in {r.get('build_s', '?')} s  used {when}  {e.stale or 'loads here'}")
    dead = [e for e in listed if e.stale]
    typer.echo(f"{len(listed)} package(s), {sum(e.size for e in listed) / 1e6:.0f} MB in {aot_store.cache_dir()}"
               + (f"; {len(dead)} can never load here ({sum(e.size for e in dead) / 1e6:.0f} MB): "
                  "`dynatree engine-cache --prune` removes them" if dead else ""))
