"""``dynatree bench``, ``dynatree sweep`` and ``dynatree report`` (:mod:`dynatree.cli.main` registers them on the app).

Heavy modules (torch, transformers, matplotlib) are imported inside the commands so ``--help``
stays fast. Every command writes results row by row (flush + fsync): Ctrl-C or a crash leaves all
completed rows on disk, and running the same command again continues where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dynatree.catalog import DEFAULT_DRAFT, PROMPT_SETS
from dynatree.cli.common import TP_HELP, after_interrupt, dataclass_flags, engine_flags, friendly_errors, set_threads
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions

if TYPE_CHECKING:
    import torch

    from dynatree.bench.metrics import Summary
    from dynatree.bench.runner import BenchSettings, Prompt
    from dynatree.bench.specs import StrategySpec

DEFAULT_STRATEGIES = "autoregressive,linear,fixed,dynatree,dyspec,hf-assisted"
#: ``--batch-size`` without ``--strategies``: the two defaults a batch runs with (the text alone, and
#: a draft model with the text: what ``generate`` does without and with a draft) against our batched
#: autoregressive decoding and HF's batched generate; without a draft model, the text alone.
BATCH_STRATEGIES = "autoregressive,dynatree:source=text@text,dynatree:source=hybrid@hybrid,hf-generate"
BATCH_STRATEGIES_NO_DRAFT = "autoregressive,dynatree:source=text@text,hf-generate"
HF_ASSISTED = "hf-assisted"  # (bench.specs.HF_ASSISTED; not imported here, to keep --help free of torch)
STRATEGY_HELP = (
    "Comma-separated specs NAME:key=value:...@LABEL (options and label optional), e.g. \"linear:k=8,fixed:depth=8:branch=3,dynatree\". "
    "Names: autoregressive, linear, fixed, dynatree, dyspec, dyspec-threshold; HF's own: hf-generate (plain greedy "
    "generate), hf-assisted (generate(assistant_model=draft); a distilled draft is exported for it), hf-prompt-lookup "
    "(prompt_lookup_num_tokens=10, no draft model); presets: paper, "
    "ablation. The same name may appear twice with different options. autoregressive is always run first. "
    "source=model|text|hybrid picks what drafts (the draft model, the text itself, or both in one tree), e.g. "
    "\"dynatree,dynatree:source=text@dt-text,dynatree:source=hybrid@dt-hybrid\". "
    "text_cache=true|N (with source=text|hybrid) shares one cache of the earlier prompts and their outputs "
    "(at most N tokens) across the spec's prompts, in prompt order, e.g. \"dynatree:source=text:text_cache=true@dt-cached\". "
    "engine=hf|static|aot and compile=true|false override --engine/--compile for one spec, e.g. "
    "\"autoregressive,autoregressive:engine=static:compile=true@ar-compiled,dynatree,dynatree:engine=static:compile=true@dt-compiled\" "
    "(the first autoregressive is the reference; every row also gets a speedup over the others)."
)


Opt = typer.Option


_PAPER_CAPS = ", ".join(f"{cap} for " + "/".join(n for n, i in PROMPT_SETS.items() if i.paper_max_prompt_tokens == cap)
                        for cap in sorted({i.paper_max_prompt_tokens for i in PROMPT_SETS.values()} - {None}))


@dataclass(frozen=True)
class RunArgs:
    """What bench and sweep both take besides the strategies and the engine (models, prompts, the
    results file, the measurement protocol), declared once: each field is a flag of both commands
    (:func:`~dynatree.cli.common.dataclass_flags`), which receive them as one ``run`` value."""

    target: Annotated[str, Opt(help="Target model: preset, HF id or local path.")] = "smollm2-135m"
    draft: Annotated[str, Opt(help="Draft: preset, HF id, local path, early-exit:K, 'default', or 'none' (every "
                                   "strategy drafts from the text itself).")] = "default"
    dataset: Annotated[str, Opt(help=f"Prompt set: {', '.join(PROMPT_SETS)} (see `dynatree list`), "
                                     "or a .txt/.jsonl path (a .jsonl of Spec-Bench questions is run as spec-bench).")] = "pydoc"
    num_prompts: Annotated[int, Opt(help="Measured prompts (warm-up runs come on top); for spec-bench, questions "
                                         "per task (80: all 480; an MT-bench question is two prompts, its turns).")] = 10
    max_prompt_tokens: Annotated[int, Opt(help="Prompt length cap in tokens (the DynaTree paper's caps: " + _PAPER_CAPS + ").")] = 256
    max_new_tokens: Annotated[int, Opt(help="Tokens to generate per prompt (T).")] = 128
    warmup: Annotated[int, Opt(help="Unrecorded warm-up passes of every strategy before measuring.")] = 2
    warmup_tokens: Annotated[int, Opt(help="Tokens per warm-up run (capped at --max-new-tokens).")] = 32
    output: Annotated[Path, Opt(help="Results JSONL (appended; an existing file is resumed).")] = Path("results.jsonl")
    threads: Annotated[int | None, Opt(help="torch CPU threads (fix it for stable timings).")] = None
    dtype: Annotated[str, Opt(help="float32 | float16 | bfloat16")] = "float32"
    device: Annotated[str, Opt(help="cpu | cuda | cuda:N")] = "cpu"
    seed: Annotated[int, Opt(help="Prompt sampling seed.")] = 0
    overwrite: Annotated[bool, Opt(help="Start a fresh results file instead of resuming.")] = False
    progress: Annotated[bool, Opt(help="Show a progress bar.")] = True


def _check_run(run: RunArgs, new_tokens: bool = True) -> None:
    """Refuse what bench and sweep would refuse only after loading the models (seconds; the
    prompts' tokens need the tokenizer): counts out of range and a prompt set that is not there.
    ``new_tokens``: whether ``--max-new-tokens`` is used (sweep's ``--lengths`` replace it)."""
    from dynatree.bench.datasets import check_prompt_set

    if new_tokens and run.max_new_tokens < 1:
        raise DynaTreeError(f"--max-new-tokens must be a positive integer, got {run.max_new_tokens}")
    for flag, value in (("--num-prompts", run.num_prompts), ("--max-prompt-tokens", run.max_prompt_tokens)):
        if value < 1:
            raise DynaTreeError(f"{flag} must be at least 1, got {value}")
    if run.warmup < 0:
        raise DynaTreeError(f"--warmup must be >= 0, got {run.warmup}")
    if run.warmup_tokens < 0:
        raise DynaTreeError(f"--warmup-tokens must be >= 0 (0: as many as --max-new-tokens), got {run.warmup_tokens}")
    check_prompt_set(run.dataset, run.num_prompts)


def _loaded(target: str, draft: str, dtype: str, device: str, needs_draft: bool
            ) -> tuple[torch.nn.Module, torch.nn.Module | None, Any, str | None]:
    from dynatree.loading import models

    torch_dtype = models.parse_dtype(dtype)
    draft_name = DEFAULT_DRAFT if draft == "default" else draft
    if needs_draft and draft != "none":  # a draft name that names nothing: refused before the target loads
        models.check_draft_spec(draft_name)
    tmodel, tokenizer = models.load_model(target, dtype=torch_dtype, device=device)
    if not needs_draft or draft == "none":
        return tmodel, None, tokenizer, None
    dmodel = models.resolve_draft(draft_name, tmodel, dtype=torch_dtype, device=device, tokenizer=tokenizer)
    return tmodel, dmodel, tokenizer, draft_name


def _prompts(run: RunArgs, tokenizer: Any, target: torch.nn.Module | None = None,
             options: EngineOptions | None = None, max_new_tokens: int | None = None,
             first_turns: bool = False) -> list[Prompt]:
    """The run's prompts as token ids with stable ids. Spec-Bench's later turns hold ``target``'s
    greedy answers to the earlier ones (``options``: the reference autoregressive spec's engine;
    ``max_new_tokens``: the answers' cap, the run's), built here once so every strategy sees the
    same prompt (see :mod:`dynatree.bench.specbench_questions`)."""
    from dynatree.bench.datasets import load_prompt_ids
    from dynatree.bench.instruct import instruct_set, is_instruct_set
    from dynatree.bench.runner import Prompt
    from dynatree.bench.specbench_questions import greedy_answerer, is_specbench, specbench_prompts

    if is_specbench(run.dataset):  # the prompt id carries the question, turn and task (specbench reads it)
        answer = (greedy_answerer(target, max_new_tokens or run.max_new_tokens, options)
                  if target is not None else None)
        pairs = specbench_prompts(run.dataset, tokenizer, run.num_prompts, run.max_prompt_tokens, answer,
                                  progress=run.progress, first_turns=first_turns)
        return [Prompt(id=prompt_id, ids=tuple(ids)) for prompt_id, ids in pairs]
    if is_instruct_set(run.dataset):  # the prompt id carries the category (instruct.row_category reads it)
        pairs = instruct_set(run.dataset, tokenizer, run.num_prompts, run.max_prompt_tokens, run.seed)
        return [Prompt(id=f"{run.dataset}:{run.seed}:{i}:{category}", ids=tuple(ids))
                for i, (category, ids) in enumerate(pairs)]
    ids = load_prompt_ids(run.dataset, tokenizer, run.num_prompts, run.max_prompt_tokens, run.seed)
    name = Path(run.dataset).name if ("/" in run.dataset or "." in run.dataset) else run.dataset
    return [Prompt(id=f"{name}:{run.seed}:{i}", ids=tuple(p[:run.max_prompt_tokens])) for i, p in enumerate(ids)]


def _drop_unsupported_hf(specs: list[StrategySpec], draft: Any, explicit: bool) -> list[StrategySpec]:
    """HF assisted generation needs an HF model as draft: a distilled draft is exported to one (see
    ``bench.runner.hf_assistant``); an early-exit draft, or no draft at all, cannot be."""
    from dynatree.bench.runner import hf_assistant

    hf = [s for s in specs if s.name == HF_ASSISTED]
    if not hf:
        return specs
    try:
        if draft is None:
            raise DynaTreeError("hf-assisted needs a draft model (--draft none gives none)")
        hf_assistant(draft)
        return specs
    except DynaTreeError as e:
        if explicit:
            raise
        typer.secho(f"note: hf-assisted skipped: {e}", fg=typer.colors.YELLOW, err=True)
    return [s for s in specs if s.name != HF_ASSISTED]


def _settings(run: RunArgs, engine: dict[str, Any], draft_name: str | None, device: str, max_new_tokens: int,
              temperature: float = 0.0) -> BenchSettings:
    import torch

    from dynatree.bench.runner import BenchSettings

    return BenchSettings(target=run.target, draft=draft_name, dataset=run.dataset, max_new_tokens=max_new_tokens,
                         max_prompt_tokens=run.max_prompt_tokens, dtype=run.dtype, device=device,
                         threads=torch.get_num_threads(), temperature=temperature,
                         extra={"prompt_seed": run.seed}, **engine)


def print_summary(summaries: list[Summary], title: str) -> None:
    """The final terminal table (rich): one line per strategy of a run group."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_style="bold")
    extra = list(dict.fromkeys(b for s in summaries for b in s.speedups))[1:]  # further AR baselines
    budgeted = any(s.get("budget") for s in summaries)
    cols = ("strategy", "prompts", "tok/s", "speedup", *(f"× {b}" for b in extra), "L̄", "accept.",
            *(("budget",) if budgeted else ()), "TTFT ms", "TPOT ms", "greedy ≠ AR")
    for col in cols:
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for s in summaries:
        tps, acc, L = s.get("throughput"), s.get("acceptance"), s.get("L")
        ttft, tpot = s.get("ttft"), s.get("tpot")
        table.add_row(
            s.label, str(s.prompts), tps.fmt(1) if tps else "—",
            f"{s.speedup:.2f}×" if s.speedup is not None else "—",
            *(f"{s.speedups[b]:.2f}×" if s.speedups.get(b) is not None else "—" for b in extra),
            f"{L.mean:.2f}" if L else "—", f"{acc.mean:.1%}" if acc else "—",
            *((f"{s.get('budget').mean:.1f}" if s.get("budget") else "—",) if budgeted else ()),
            f"{ttft.mean * 1e3:.1f}" if ttft else "—", f"{tpot.mean * 1e3:.2f}" if tpot else "—",
            "—" if s.reference else (f"[red]{s.mismatches}[/red]" if s.mismatches else "0"),
        )
    console = Console(stderr=True)
    if not console.is_terminal:  # piped/logged output: do not squeeze the table into 80 columns
        console = Console(stderr=True, width=160)
    console.print(table)


def _run_saving(writer: Any, fn: Any) -> Any:
    """Run ``fn``; on Ctrl-C say what is safe on disk and how to continue, then let the CLI exit 130."""
    before = len(writer.done)
    try:
        return fn()
    except (KeyboardInterrupt, RuntimeError) as err:
        if isinstance(err, RuntimeError) and not after_interrupt(err):
            raise
        typer.secho(f"interrupted: {len(writer.done) - before} new row(s) are saved in {writer.path}; "
                    "rerun the same command to continue", fg=typer.colors.YELLOW, err=True)
        if isinstance(err, KeyboardInterrupt):
            raise
        raise KeyboardInterrupt from err


def _run_title(settings: dict[str, Any]) -> str:
    return (f"{settings['dataset']} · T = {settings['max_new_tokens']} · {settings['dtype']} {settings['device']}"
            f" · {settings['threads']} threads")


def _finish(outcomes: list[Any], output: Path) -> None:
    from dynatree.bench.metrics import cost_profiles, summarize
    from dynatree.bench.specbench import specbench_section

    new = sum(o.new_rows for o in outcomes)
    resumed = sum(o.resumed_rows for o in outcomes)
    for o in outcomes:
        print_summary(summarize(o.rows), f"{_run_title(o.rows[0]['settings'])} · group {o.group}")
        for label, prof in cost_profiles(o.rows).items():
            points = ", ".join(f"{r}: {m:.1f}" for r, m in zip(prof["rows"], prof["ms"]))
            typer.secho(f"{label}: tree budget from the verify-cost profile (ms by rows) {points}", err=True)
        section = specbench_section(o.rows, _run_title)  # per task, for Spec-Bench and the instruct sets
        if section:
            typer.echo("\n".join(section), err=True)
    mismatches = sum(len(o.mismatches) for o in outcomes)
    typer.secho(f"{new} new row(s), {resumed} already in {output} (resumed)", err=True)
    if mismatches:
        typer.secho(f"WARNING: {mismatches} run(s) differ from the autoregressive greedy output "
                    "(see the 'greedy ≠ AR' column and `dynatree report`)", fg=typer.colors.RED, err=True)
    else:
        typer.secho("greedy check: every run reproduced the autoregressive output", fg=typer.colors.GREEN, err=True)


@friendly_errors
@engine_flags(engine="hf")
@dataclass_flags("run", RunArgs)
def bench(
    run: RunArgs,
    options: EngineOptions,
    strategies: Annotated[str, typer.Option(help=STRATEGY_HELP)] = DEFAULT_STRATEGIES,
    temperature: Annotated[float, typer.Option(help="0 = greedy (checked against AR); > 0 = lossless sampling (hf-assisted skipped).")] = 0.0,
    tp: Annotated[bool, typer.Option("--tp", help=TP_HELP + " Rank 0 writes --output and prints.")] = False,
    batch_size: Annotated[str | None, typer.Option(help="Batched runs instead: B prompts of one task per call, e.g. 4 "
                                                        "or 1,4,8,16; total tokens per second and speedup over our "
                                                        "batched autoregressive decoding per task and B (greedy; "
                                                        "MT-bench first turns; HF's assisted and prompt lookup "
                                                        "refuse batches and are skipped). Without --strategies: "
                                                        "autoregressive, the text, the hybrid (draft model and "
                                                        "text) and hf-generate.")] = None,
    repeats: Annotated[int, typer.Option(help="With --batch-size: run every spec this many times per batch, "
                                              "interleaved (the order rotated each pass), and time it by the "
                                              "median (a virtual machine's timings move by ~15% run to run).")] = 1,
) -> None:
    """Run every strategy on the same prompts in one process; write JSONL; print a summary."""
    from dynatree.bench.runner import BenchSettings, run_bench
    from dynatree.bench.specs import HF_NAMES, parse_strategies
    from dynatree.bench.store import ResultsWriter

    set_threads(run.threads)
    specs = parse_strategies(strategies)  # validate before loading anything
    engine = BenchSettings.engine_fields(options)
    for s in specs:
        if s.name not in HF_NAMES:
            s.engine_options(options)  # refuses compile=true on an hf spec
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise DynaTreeError(f"--temperature must be a finite number >= 0, got {temperature}")
    _check_run(run)
    if repeats < 1:
        raise DynaTreeError(f"--repeats must be >= 1, got {repeats}")
    if batch_size is not None:
        _bench_batches(run, options, specs, batch_size, temperature, tp, strategies != DEFAULT_STRATEGIES, repeats)
        return
    if repeats != 1:
        raise DynaTreeError("--repeats applies to batched runs (--batch-size); a per-prompt run repeats over its prompts")
    if run.draft == "none":  # hf-assisted needs a draft model: refused (or dropped) before loading the target
        specs = _drop_unsupported_hf(specs, None, explicit=strategies != DEFAULT_STRATEGIES)
    needs_draft = any(s.uses_draft for s in specs)
    device, output, progress = run.device, run.output, run.progress
    if tp:
        from dynatree.loading.tp import load_tp_pair
        from dynatree.loading import models

        tmodel, dmodel, tok, draft_name = load_tp_pair(run.target, run.draft, needs_draft,
                                                                   models.parse_dtype(run.dtype))
        specs = [s for s in specs if s.name not in HF_NAMES]  # HF generate: not run sharded here
        device = str(tmodel.device)
    else:
        tmodel, dmodel, tok, draft_name = _loaded(run.target, run.draft, run.dtype, device, needs_draft)
    specs = _drop_unsupported_hf(specs, dmodel, explicit=strategies != DEFAULT_STRATEGIES)
    prompts = _prompts(run, tok, tmodel, specs[0].engine_options(options), run.max_new_tokens)
    if temperature > 0 or options.kv_window is not None:
        specs = [s for s in specs if s.name not in HF_NAMES]  # greedy, full-cache runs only
    settings = _settings(run, engine, draft_name, device, run.max_new_tokens, temperature)
    lead = True
    if tp:
        from dynatree.runtime.distributed import rank_output, world_size

        settings.extra["tp_world_size"] = world_size()  # keeps TP rows apart from 1-process ones
        output, lead = rank_output(output, run.overwrite)
        progress = progress and lead
    with ResultsWriter(output, overwrite=run.overwrite) as writer:
        outcome = _run_saving(writer, lambda: run_bench(
            tmodel, dmodel, prompts, specs, settings, writer=writer, warmup=run.warmup,
            warmup_tokens=run.warmup_tokens, progress=progress))
    if lead:
        _finish([outcome], output)


def _bench_batches(run: RunArgs, options: EngineOptions, specs: list[StrategySpec], batch_size: str,
                   temperature: float, tp: bool, explicit: bool, repeats: int = 1) -> None:
    """``bench --batch-size``: :mod:`dynatree.bench.batches` on the run's prompts (checked first)."""
    from dynatree.bench.batches import check_specs, parse_sizes, run_batches, tables
    from dynatree.bench.specs import parse_strategies
    from dynatree.bench.sysinfo import provenance
    from dynatree.loop.batch import pad_token

    sizes = parse_sizes(batch_size)
    if tp or temperature > 0:
        raise DynaTreeError("--batch-size runs greedy, on one process: drop --tp and --temperature")
    if not explicit:  # what generate runs by default, with and without a draft, and the two baselines
        specs = parse_strategies(BATCH_STRATEGIES_NO_DRAFT if run.draft == "none" else BATCH_STRATEGIES)
    specs, notes = check_specs(specs)
    if run.draft == "none":
        specs = [s.without_model() if s.uses_draft else s for s in specs]
    needs_draft = any(s.uses_draft for s in specs)
    tmodel, dmodel, tok, draft_name = _loaded(run.target, run.draft, run.dtype, run.device, needs_draft)
    prompts = _prompts(run, tok, first_turns=True)  # (Spec-Bench: first turns, no answers needed)
    pad = pad_token(tmodel, tok.pad_token_id, tok.eos_token_id)  # (HF's rule, as generate's own)
    for note in notes:
        typer.secho(note, err=True)
    if run.overwrite and run.output.exists():
        run.output.unlink()
    import torch

    meta = {"target": run.target, "draft": draft_name, "dataset": run.dataset, "max_new_tokens": run.max_new_tokens,
            "dtype": run.dtype, "device": run.device, "threads": torch.get_num_threads(), **provenance()}
    say = (lambda line: typer.echo(line, err=True)) if run.progress else (lambda line: None)
    rows = run_batches(tmodel, dmodel, prompts, specs, sizes, max_new_tokens=run.max_new_tokens, pad_token_id=pad,
                       options=options, output=run.output, meta=meta, repeats=repeats, progress=say)
    typer.echo(tables(rows))
    bad = sum(r["mismatched_rows"] for r in rows)
    typer.secho(f"{len(rows)} row(s) appended to {run.output}; " + (
        f"WARNING: {bad} row(s) differ from our batched autoregressive output" if bad else
        "greedy check: every row reproduced our batched autoregressive output"),
        fg=typer.colors.RED if bad else typer.colors.GREEN, err=True)


@friendly_errors
@engine_flags(engine="hf")
@dataclass_flags("run", RunArgs, num_prompts=5, warmup=1, output=Path("sweep.jsonl"))
def sweep(
    run: RunArgs,
    options: EngineOptions,
    strategy: Annotated[str, typer.Option(help="Strategy to sweep, with fixed options: e.g. \"dynatree:history=false\".")],
    grid: Annotated[list[str], typer.Option("--grid", "-g", help="Swept option name=v1,v2,... (repeatable).")],
    baselines: Annotated[str, typer.Option(help="Extra strategies measured once per length (spec syntax as bench).")] = "autoregressive",
    lengths: Annotated[str | None, typer.Option(help="Generation lengths to repeat the grid at, e.g. 100,200,500 (default: --max-new-tokens).")] = None,
) -> None:
    """Sweep a grid of strategy options (resumable: rerun the same command to continue)."""
    from dynatree.bench.runner import BenchSettings
    from dynatree.bench.specs import parse_spec, parse_strategies
    from dynatree.bench.store import ResultsWriter
    from dynatree.bench.sweep import SweepGrid, parse_axis, run_sweep

    set_threads(run.threads)
    engine = BenchSettings.engine_fields(options)
    base = parse_spec(strategy)
    axes = dict(parse_axis(g) for g in grid)
    sweep_grid = SweepGrid(base.name, axes, base=base.options)
    base_specs = parse_strategies(baselines)
    try:
        T = [int(t) for t in lengths.split(",") if t.strip()] if lengths else [run.max_new_tokens]
    except ValueError:
        raise DynaTreeError(f"--lengths must be comma-separated positive integers, got {lengths!r}") from None
    if lengths and (not T or any(t < 1 for t in T)):
        raise DynaTreeError(f"--lengths must be positive integers, got {lengths}")
    _check_run(run, new_tokens=not lengths)
    tmodel, dmodel, tok, draft_name = _loaded(run.target, run.draft, run.dtype, run.device, True)
    base_specs = _drop_unsupported_hf(base_specs, dmodel, explicit=True)
    prompts = _prompts(run, tok, tmodel, base_specs[0].engine_options(options), T[0])
    settings = _settings(run, engine, draft_name, run.device, T[0])
    typer.secho(f"sweep: {sweep_grid.size} configurations × {len(T)} length(s) × {len(prompts)} prompts",
                err=True)
    with ResultsWriter(run.output, overwrite=run.overwrite) as writer:
        outcomes = _run_saving(writer, lambda: run_sweep(
            tmodel, dmodel, prompts, sweep_grid, settings, writer, baselines=base_specs, lengths=T,
            warmup=run.warmup, warmup_tokens=run.warmup_tokens, progress=run.progress))
    _finish(outcomes, run.output)


@friendly_errors
def report(
    results: Annotated[Path, typer.Argument(help="Results JSONL from bench/sweep (several runs may share a file).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for report.md and the PNG figures.")] = Path("report"),
) -> None:
    """Turn results JSONL into markdown tables (shaped like the papers') and PNG plots."""
    from dynatree.bench.report import build_report

    rep = build_report(results, out)
    if rep.skipped:
        typer.secho(f"{results}: {rep.skipped_message}", fg=typer.colors.YELLOW, err=True)
    if rep.specbench:  # the per-task table is the one a reader compares with the papers': shown here too
        typer.echo(rep.specbench)
    typer.echo(f"wrote {rep.markdown} and {len(rep.figures)} figure(s) from {rep.rows} rows")


__all__ = ["bench", "print_summary", "report", "sweep"]
