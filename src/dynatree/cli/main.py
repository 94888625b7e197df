"""The ``dynatree`` command line: ``generate`` (and the bench/report/distill commands).

Every user-fixable problem is a :class:`DynaTreeError`, printed as one line on stderr with exit
code 2 -- no traceback from deep inside torch.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from dynatree.cli.common import TP_HELP, check_utf8, engine_flags, friendly_errors, set_threads
from dynatree.catalog import (CHAT_CACHE_TOKENS, DEFAULT_DRAFT, DEFAULT_TARGET, DRAFT_TEMPERATURE, PRESETS, PROMPT_SETS,
                              TEXT_DEFAULT)
from dynatree.training.config import DistillConfig
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig, parse_options

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])

DEFAULT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg"
)


@app.callback()
def _root() -> None:
    """dynatree: exact tree-based speculative decoding for HuggingFace causal LMs."""


def load_pair(target: str, draft: str, uses_draft: bool, dtype: Any, device: str,
              allow_vocab_mismatch: bool = False, text: bool = False, cache: Any = None,
              max_spec: int | None = None) -> tuple[Any, Any, Any]:
    """Target, draft and tokenizer. The draft is what ``generate`` takes: None when the strategy
    drafts nothing or ``draft`` is "none" (the text itself drafts), the model ("default" = the
    shipped draft), or with ``text`` both in one tree (a ``TextDraft`` wrapping the model, its
    proposals no deeper than ``max_spec`` when given: what the run can use, as the library's
    default hybrid); ``cache``: a cross-request ``SuffixCache`` for the text source."""
    from dynatree.loading import models

    if uses_draft and draft != "none":  # a draft name that names nothing: refused before the target loads
        models.check_draft_spec(DEFAULT_DRAFT if draft == "default" else draft)
    tmodel, tok = models.load_model(target, dtype=dtype, device=device)
    if not uses_draft:
        return tmodel, None, tok
    if draft == "none":
        from dynatree.drafts.suffix import TextDraft

        return tmodel, (TextDraft(cache=cache) if cache is not None else None), tok
    dmodel = models.resolve_draft(DEFAULT_DRAFT if draft == "default" else draft, tmodel, dtype=dtype,
                                  device=device, tokenizer=tok, allow_vocab_mismatch=allow_vocab_mismatch)
    if text:
        from dynatree.drafts.suffix import TextDraft

        dmodel = TextDraft(model=dmodel, cache=cache, **({} if max_spec is None else {"max_spec": max_spec}))
    return tmodel, dmodel, tok


def _check_output_file(path: str, what: str) -> None:
    """Refuse a file a command writes only at its end (``--trace``) before anything is loaded or
    run: its folder must exist and the path must not be a folder. Found at the end, such a typo
    costs the whole run and ends in a raw FileNotFoundError or IsADirectoryError."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise DynaTreeError(f"{what} {path} is a folder: give the path of a file to write")
    if not out.parent.is_dir():
        raise DynaTreeError(f"{what} {path}: the folder {out.parent} does not exist")


DRAFT_HELP = (f"Draft model: 'default' ({DEFAULT_DRAFT}), a preset, an HF id, a local path, early-exit:K, or "
              "'none' (no model: draft from the prompt and the text written so far).")
TEXT_HELP = "Also draft from the text itself (prompt and answer so far): one tree from both the model and the text."


@app.command()
@friendly_errors
@engine_flags()
def generate(
    options: EngineOptions,
    prompt: Annotated[str, typer.Option(help="Prompt text.")] = DEFAULT_PROMPT,
    target: Annotated[str, typer.Option(help="Target model: a preset (`dynatree list` shows them), an HF id or a local path.")] = DEFAULT_TARGET,
    draft: Annotated[str, typer.Option(help=DRAFT_HELP)] = "default",
    text: Annotated[bool, typer.Option("--text/--no-text", help=TEXT_HELP)] = TEXT_DEFAULT,
    strategy: Annotated[str, typer.Option(help="autoregressive | linear | fixed | dynatree | dyspec | dyspec-threshold")] = "dynatree",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 128,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help="Strategy option name=value (repeatable), e.g. -o k=5.")] = None,
    dtype: Annotated[str, typer.Option(help="float32 | float16 | bfloat16")] = "float32",
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (fix it for stable timings).")] = None,
    truncate_prompt: Annotated[bool, typer.Option(help="Left-truncate a prompt that does not fit the models' positions.")] = False,
    allow_vocab_mismatch: Annotated[bool, typer.Option(help="Skip the draft/target vocabulary check.")] = False,
    temperature: Annotated[float, typer.Option(help="0 = greedy (exact); > 0 samples losslessly from the target.")] = 0.0,
    top_k: Annotated[int | None, typer.Option(help="Top-k on the target distribution (sampling only).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Top-p on the target distribution (sampling only).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for reproducible sampling.")] = None,
    draft_temperature: Annotated[float, typer.Option(help="Temperature DySpec samples draft children at.")] = DRAFT_TEMPERATURE,
    compare: Annotated[bool, typer.Option("--compare", help="Also run autoregressive decoding on the same prompt and print both speeds and the speedup.")] = False,
    tp: Annotated[bool, typer.Option("--tp", help=TP_HELP)] = False,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the tokenizer's chat template (instruct models); print only the reply.")] = False,
    trace: Annotated[str | None, typer.Option(help="Write an HTML page of every round's drafted tree to this path.")] = None,
) -> None:
    """Generate text with speculative decoding, streamed as rounds commit it, and print a one-line summary."""
    import torch

    from dynatree.loading import models
    from dynatree.runtime.devices import check_device
    from dynatree.core.sampling import SamplingConfig, make_generator
    from dynatree.loop.generate import check_positions, generate as run, text_depth
    from dynatree.loop.precompile import precompile
    from dynatree.runtime.engines import resolve as resolve_options
    from dynatree.policies import make_policy

    set_threads(threads)
    if not prompt.strip():
        raise DynaTreeError("empty prompt: --prompt is empty or whitespace only")
    check_utf8(prompt, "--prompt")
    if max_new_tokens < 1:
        raise DynaTreeError(f"--max-new-tokens must be a positive integer, got {max_new_tokens}")
    policy = make_policy(strategy, **parse_options(option))  # fail fast, before loading models
    sampling = SamplingConfig(temperature, top_k, top_p, draft_temperature)  # refused now, not after loading
    make_generator(seed, None)  # (refuses a bad --seed)
    if trace is not None:
        _check_output_file(trace, "--trace")
    torch_dtype = models.parse_dtype(dtype)
    if tp:  # target sharded over the torchrun processes, draft replicated (dynatree.runtime.distributed)
        from dynatree.loading.tp import load_tp_pair

        tmodel, dmodel, tok, _ = load_tp_pair(target, draft, policy.uses_draft, torch_dtype, allow_vocab_mismatch)
        device = str(tmodel.device)
    else:
        check_device(device, torch_dtype, compile=bool(options.compile))  # before loading anything
        tmodel, dmodel, tok = load_pair(target, draft, policy.uses_draft, torch_dtype, device, allow_vocab_mismatch,
                                        text=text, max_spec=text_depth(max_new_tokens, options.kv_window))
    from dynatree.integrations.chat import EchoStreamer, chat_eos, chat_prompt
    from dynatree.runtime.distributed import rank

    eos = None
    if chat:
        ids, eos = chat_prompt(tok, [{"role": "user", "content": prompt}]), chat_eos(tmodel, tok)
    else:
        ids = tok(prompt, return_tensors="pt").input_ids
    options = resolve_options(options, tmodel, tokens=max_new_tokens)
    prompt_tokens = len(ids) if isinstance(ids, list) else ids.shape[-1]  # (--chat gives a list)
    if options.kv_window is None:  # a run too long for the model: the error now, not after compiling for it
        check_positions(prompt_tokens, max_new_tokens, policy, tmodel, dmodel, truncate_prompt)
    common = dict(max_new_tokens=max_new_tokens, stopping=StoppingConfig(eos_token_id=eos),
                  truncate_prompt=truncate_prompt, allow_vocab_mismatch=allow_vocab_mismatch, seed=seed,
                  sampling=sampling, options=options)
    if options.compile and options.engine == "static":  # every graph first: neither run's speed includes compiling
        precompile(tmodel, dmodel, prompt_tokens + max_new_tokens, options)
    main = rank() == 0  # under torchrun every rank runs the same (collective) decoding; one prints
    streamer = EchoStreamer(tok) if main else None  # prints each round's tokens as soon as it commits
    if main and not chat:
        typer.echo(prompt, nl=False)
    try:
        # text=False: load_pair already built the draft --text/--no-text ask for (generate must not join the text again)
        result = run(tmodel, dmodel, ids, policy, **common, text=False, on_round=streamer.on_round if streamer else None,
                     trace=trace if main else None, tokenizer=tok)
    finally:
        if streamer is not None:
            streamer.end()
    # --compare: the same prompt autoregressively, on every rank (under torchrun the runs are collective)
    reference = run(tmodel, None, ids, "autoregressive", **common) if compare else None
    if not main:
        return
    if trace is not None:
        typer.secho(f"trace: {trace}", err=True)
    s = result.stats
    setup = (f"{options.engine}{' compiled' if options.compile else ''} engine | threads {torch.get_num_threads()} | "
             f"{device} {dtype}")
    budget = [r.policy_state["budget"] for r in s.rounds if "budget" in r.policy_state]
    chosen = f" | cost-model budget {sum(budget) / len(budget):.1f} nodes/round" if budget else ""
    typer.secho(
        f"[{s.strategy}] {s.new_tokens} tokens in {s.t_total:.2f}s = {s.tokens_per_second:.1f} tok/s | "
        f"mean L {s.mean_committed:.2f} tokens/round over {s.num_rounds} rounds | "
        f"acceptance {s.acceptance:.1%}{chosen} | {setup}",
        fg=typer.colors.CYAN, err=True,
    )
    if reference is not None:
        base = reference.stats
        same = "" if temperature > 0 else (" | same output" if torch.equal(reference.sequences, result.sequences)
                                           else " | OUTPUTS DIFFER")
        typer.secho(
            f"[compare] {s.strategy} {s.tokens_per_second:.1f} tok/s vs autoregressive "
            f"{base.tokens_per_second:.1f} tok/s ({base.new_tokens} tokens) = "
            f"{s.tokens_per_second / max(base.tokens_per_second, 1e-9):.2f}x speedup{same} | {setup}",
            fg=typer.colors.CYAN, err=True,
        )


@app.command("chat")
@friendly_errors
@engine_flags()
def chat_command(
    options: EngineOptions,
    target: Annotated[str, typer.Option(help="Target model (an instruct model with a chat template).")] = "smollm2-135m",
    draft: Annotated[str, typer.Option(help=DRAFT_HELP)] = "default",
    text: Annotated[bool, typer.Option("--text/--no-text", help=TEXT_HELP + " Earlier turns are indexed too.")] = TEXT_DEFAULT,
    strategy: Annotated[str, typer.Option(help="autoregressive | linear | fixed | dynatree | dyspec | dyspec-threshold")] = "dynatree",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per reply at most.")] = 256,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help="Strategy option name=value (repeatable).")] = None,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    temperature: Annotated[float, typer.Option(help="0 = greedy (exact); > 0 samples losslessly from the target.")] = 0.0,
    top_k: Annotated[int | None, typer.Option(help="Top-k on the target distribution (sampling only).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Top-p on the target distribution (sampling only).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for reproducible sampling.")] = None,
    dtype: Annotated[str, typer.Option(help="float32 | float16 | bfloat16")] = "float32",
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
) -> None:
    """Chat in the terminal: replies stream as rounds commit; a status line gives each turn's speed
    and tokens per round. /reset forgets the conversation, /exit (or Ctrl-D) quits."""
    from dynatree.loading import models
    from dynatree.core.sampling import SamplingConfig, make_generator
    from dynatree.integrations.chat import ChatSession, status_line
    from dynatree.policies import make_policy

    set_threads(threads)
    if max_new_tokens < 1:
        raise DynaTreeError(f"--max-new-tokens must be a positive integer, got {max_new_tokens}")
    policy = make_policy(strategy, **parse_options(option))
    sampling = SamplingConfig(temperature, top_k, top_p)  # refused now, not after loading the models
    make_generator(seed, None)  # (refuses a bad --seed)
    torch_dtype = models.parse_dtype(dtype)
    from dynatree.drafts.suffix_index import SuffixCache

    cache = SuffixCache(CHAT_CACHE_TOKENS)  # the conversation's replies (and /reset ones) for the text source
    tmodel, dmodel, tok = load_pair(target, draft, policy.uses_draft, torch_dtype, device, text=text, cache=cache)
    if not getattr(tok, "chat_template", None):
        raise DynaTreeError(f"'{target}' has no chat template; chat needs an instruct/chat model")
    session = ChatSession(tmodel, dmodel, tok, policy, system=system, max_new_tokens=max_new_tokens,
                          sampling=sampling, seed=seed, options=options,
                          text=False)  # (load_pair built the draft --text/--no-text ask for)
    typer.secho(f"dynatree chat [{policy.name}] -- /reset forgets, /exit or Ctrl-D quits", dim=True)
    if isinstance(sys.stdin, io.TextIOWrapper):  # undecodable bytes reach check_utf8, not a traceback
        sys.stdin.reconfigure(errors="surrogateescape")
    while True:
        try:
            typer.echo("you> ", nl=False)  # on stdout: input()'s own prompt goes to stderr on a tty
            text = input()
        except EOFError:
            typer.echo()
            break
        except KeyboardInterrupt:
            typer.echo()  # "interrupted" on a line of its own, not after "you> "
            raise
        command = text.strip()
        if command in ("/exit", "/quit"):
            break
        if command == "/reset":
            session.reset()
            typer.secho("(conversation cleared)", dim=True)
            continue
        if not command:
            continue
        try:
            check_utf8(text, "the message")
        except DynaTreeError as err:  # one bad line need not end the conversation
            typer.secho(f"error: {err}; not sent", fg=typer.colors.RED, err=True)
            continue
        typer.echo("bot> ", nl=False)
        result = session.turn(text)
        typer.secho(status_line(result.stats), fg=typer.colors.CYAN, dim=True)
        if session.dropped:
            typer.secho(f"({session.dropped} oldest turn(s) dropped: the conversation no longer fits the "
                        f"model's {session.max_positions} positions)", dim=True)


@app.command("list")
def list_command() -> None:
    """The model presets (--target, --draft) and prompt sets (dynatree bench --dataset), one line each."""
    from rich.console import Console
    from rich.table import Table

    defaults = {DEFAULT_TARGET: "default target", DEFAULT_DRAFT: "default draft"}
    presets = Table("preset", "kind", "description", title="Model presets (--target, --draft)")
    for name, preset in PRESETS.items():
        mark = f" ({defaults[name]})" if name in defaults else ""
        presets.add_row(name + mark, preset.kind, preset.description)
    sets = Table("prompt set", "paper's prompt cap", "description", title="Prompt sets (dynatree bench --dataset)")
    for name, info in PROMPT_SETS.items():
        sets.add_row(name, str(info.paper_max_prompt_tokens or "-"), info.description)
    console = Console()
    console.print(presets)
    console.print(sets)
    console.print("Anything else: an HF hub id (org/name) or a local path; a prompt set may also be a .txt/.jsonl file.")


@app.command("distill")
@friendly_errors
def distill_command(
    target: str = DEFAULT_TARGET,
    layers: int = DistillConfig.layers,
    vocab_subset: int = DistillConfig.vocab_subset,
    steps: int = DistillConfig.steps,
    batch: int = DistillConfig.batch,
    seq_len: int = DistillConfig.seq_len,
    lr: float = DistillConfig.lr,
    top_k: int = DistillConfig.top_k,
    train_sequences: int = DistillConfig.train_sequences,
    eval_sequences: int = DistillConfig.eval_sequences,
    seed: int = DistillConfig.seed,
    corpora: Annotated[str, typer.Option(help="comma-separated: pydoc, licences, wiki, books; empty = the data "
                                              "kind's default (continuation: all four; instruct, mix: pydoc,licences, "
                                              "plus the standard library)")] = DistillConfig.corpora,
    data: Annotated[str, typer.Option(help="continuation (the target continuing prose windows), instruct (the "
                                           "target answering chat-templated requests) or mix")] = DistillConfig.data,
    max_prompt_tokens: Annotated[int, typer.Option(help="instruct: longer prompts are skipped")] = DistillConfig.max_prompt_tokens,
    answer_tokens: Annotated[int, typer.Option(help="instruct: tokens per answer at most")] = DistillConfig.answer_tokens,
    sample_fraction: Annotated[float, typer.Option(help="instruct: share of answers sampled (at --sample-temperature) "
                                                        "instead of greedy")] = DistillConfig.sample_fraction,
    sample_temperature: float = DistillConfig.sample_temperature,
    followup_fraction: Annotated[float, typer.Option(help="instruct: share of second-turn requests after the "
                                                          "target's own answer")] = DistillConfig.followup_fraction,
    instruct_fraction: Annotated[float, typer.Option(help="mix: share of instruct sequences")] = DistillConfig.instruct_fraction,
    gen_batch: Annotated[int, typer.Option(help="prompts the target answers per batch (larger on a GPU)")] = DistillConfig.gen_batch,
    kind: Annotated[str, typer.Option(help="independent (tokens only) or feature (reads the target's hidden "
                                           "states, the EAGLE idea)")] = DistillConfig.kind,
    unroll: Annotated[int, typer.Option(help="feature drafts: tree levels trained per step")] = DistillConfig.unroll,
    feature_layers: Annotated[str, typer.Option(help="feature drafts: what the head reads of the target: auto "
                                                     "(empty = auto) = a low, a middle and a high layer fused "
                                                     "(EAGLE-3); final = its final hidden state (EAGLE); or layer "
                                                     "numbers, e.g. 2,15,27")
                              ] = DistillConfig.feature_layers,
    init: Annotated[str, typer.Option(help="a draft folder (from dynatree distill) to start from instead of the "
                                           "target's first layers: fine-tune it on this data")] = DistillConfig.init,
    out: Path = Path("distilled-draft"),
    resume: bool = True,
    threads: int | None = None,
    device: str = "cpu",
    progress: bool = True,
) -> None:
    """Distil a small draft model for TARGET from offline prose and the target's own outputs.

    ``--data instruct`` trains on the target's own answers to requests built offline (summarize,
    explain, question answering, rewrite, code tasks over the standard library, math, multi-turn),
    rendered through its chat template: the text an instruct target writes; ``--data mix`` mixes
    them with prose continuations. Use ``--seq-len`` of a few hundred tokens there, so training
    windows hold the passage an answer copies from.

    Resumable: rerun the same command after an interruption. The result is written to
    OUT/final (model.safetensors, config.json, metrics.json); load it with
    ``dynatree.drafts.checkpoint.load_distilled_draft(target, OUT/final)``. ``--device cuda`` labels and
    trains on a GPU (the target in fp32, like on CPU, so labels do not depend on the device's
    fp16 rounding): labelling is the cost that limits the draft on a CPU.
    """
    from dynatree.training.run import distill_with_target  # torch and transformers only when the command runs

    set_threads(threads)
    cfg = DistillConfig(layers=layers, vocab_subset=vocab_subset, steps=steps, batch=batch,
                        seq_len=seq_len, lr=lr, top_k=top_k, train_sequences=train_sequences,
                        eval_sequences=eval_sequences, seed=seed, corpora=corpora, kind=kind, unroll=unroll,
                        feature_layers=feature_layers,
                        data=data, max_prompt_tokens=max_prompt_tokens, answer_tokens=answer_tokens,
                        sample_fraction=sample_fraction, sample_temperature=sample_temperature,
                        followup_fraction=followup_fraction, instruct_fraction=instruct_fraction,
                        gen_batch=gen_batch, init=init)
    final, metrics = distill_with_target(target, cfg, out=out, resume=resume, device=device, progress=progress)
    typer.echo(f"draft written to {final}: held-out greedy agreement {metrics['generated']:.1%}, "
               f"linear K=4 tokens/round {metrics['linear_k4_tokens']:.2f}")


@app.command("export-draft")
@friendly_errors
def export_draft_command(
    out: Annotated[Path, typer.Option(help="Folder to write the HF model (config.json, model.safetensors, tokenizer) to.")],
    draft: Annotated[str, typer.Option(help=f"A shipped distilled draft ({DEFAULT_DRAFT}) or a folder written by `dynatree distill`.")] = DEFAULT_DRAFT,
    target: Annotated[str, typer.Option(help="The target the draft was distilled for (its embedding and tokenizer are copied).")] = DEFAULT_TARGET,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16")] = "float32",
) -> None:
    """Export a distilled draft as a plain HF LlamaForCausalLM, usable as HF's assistant_model."""
    from dynatree.integrations.export_hf import export_draft  # torch and transformers only when the command runs

    folder, check = export_draft(draft, out, target=target, dtype=dtype)
    typer.echo(f"draft exported to {folder}: {check}")


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())


# bench, sweep and report live in cli/bench.py, costs and random-model in cli/costs.py; this module
# registers them.
from dynatree.cli import bench as _bench  # noqa: E402
from dynatree.cli import costs as _costs  # noqa: E402

for _command in (_bench.bench, _bench.sweep, _bench.report):
    app.command()(_command)
app.command("costs")(_costs.costs)
app.command("random-model")(_costs.random_model)
app.command("build-engine")(_costs.build_engine)
app.command("engine-cache")(_costs.engine_cache)
