"""Run every strategy on the same prompts in one process and record one row per (prompt, strategy).

Protocol (the DynaTree paper's §4, with our decisions where it is silent):

* the autoregressive baseline runs first on every prompt; prompts are the outer loop and the
  strategies the inner one, so slow drifts of a noisy machine (CPU frequency, other processes)
  hit every strategy alike instead of whichever happened to run last;
* further autoregressive specs (e.g. ``autoregressive:engine=static:compile=true``) are extra
  baselines: their output is checked against the first like any strategy's, and the report gives
  every strategy's speedup over each of them;
* a spec's ``engine=``/``compile=`` options override the bench-wide engine for that spec; every
  compiled static graph is built before the warm-up (:func:`dynatree.precompile`);
* ``warmup`` extra passes (every strategy on the first prompts) run before measuring and are not
  recorded -- the papers discard their first W runs;
* each strategy's greedy output is compared token by token with the autoregressive output of the
  same prompt in the same run group, and every mismatch is recorded in the row (``greedy_match``,
  ``first_mismatch``) and reported -- fp16/bf16 tree verification can flip near-ties, and a
  harness that hid that would be lying;
* ``hf-assisted`` is HuggingFace's own assisted generation with the same draft, timed by the same
  clock; a streamer gives its TTFT and tokens per round, the drafting internals are not visible
  so those fields are null;
* a spec with ``text_cache`` (``source=text|hybrid``) shares one
  :class:`~dynatree.drafts.suffix_index.SuffixCache` across its rows, filled in prompt order: after
  a prompt's row exists, the prompt and the output the row records go in, so each prompt drafts
  from the prompts before it and their outputs, never from its own answer. The warm-up passes
  draft against a scratch cache that is then thrown away (they run the first prompts, which
  would otherwise find their own answers when timed). The cache is filled by the bench, outside
  the timed call, and not by the source's ``finish()``: what goes in is then exactly what the
  row stores, so a resumed run rebuilds the same cache from the stored rows of the prompts
  already done (their outputs replayed in order) before it measures the next one. Such a row's
  key also names the prompts before it, so a row is only reused after the same earlier prompts.
  The row records the cache as its prompt found it (``text_cache``: bound, tokens, sequences);
  its output is checked against the autoregressive one like every row's.

Rows are written through :class:`~dynatree.bench.store.ResultsWriter` as soon as they exist, so an
interrupted run resumes where it stopped (rows are keyed, see ``store.row_key``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from dynatree.core.clock import sync_clock
from dynatree.drafts.suffix import TextDraft
from dynatree.drafts.suffix_index import SuffixCache
from dynatree.loop.generate import check_positions, generate
from dynatree.loop.precompile import precompile
from dynatree.runtime.engines import notice, resolve as resolve_options
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.core.sampling import SamplingConfig
from dynatree.policies import DraftPolicy, make_policy
from dynatree.bench.specs import AUTOREGRESSIVE, HF_ASSISTED, HF_NAMES, HF_PROMPT_LOOKUP, StrategySpec
from dynatree.bench.store import SCHEMA_VERSION, ResultsWriter, row_key, settings_group
from dynatree.bench.sysinfo import library_versions, machine_info, peak_memory_mb, provenance, reset_peak_memory

RowCallback = Callable[[dict[str, Any]], None]
# BenchSettings' fields that are engine options (kept flat: they are part of every row's key).
ENGINE_FIELDS = ("engine", "compile", "buckets", "cpu_linear", "kv_window", "kv_sinks")


@dataclass(frozen=True)
class Prompt:
    """A prompt as token ids; ``id`` must be stable across runs (it is part of the row key)."""

    id: str
    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.id:
            raise DynaTreeError("a prompt needs a non-empty id")
        if not self.ids:
            raise DynaTreeError(f"prompt '{self.id}' has no tokens")
        object.__setattr__(self, "ids", tuple(int(t) for t in self.ids))

    @property
    def sha(self) -> str:
        return hashlib.sha256(",".join(map(str, self.ids)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class BenchSettings:
    """Everything that identifies a measurement besides strategy and prompt.

    Rows with equal settings form one *run group*: they share the autoregressive reference used for
    speedups and for the greedy-output check. Warm-up count is protocol, not identity, and is kept
    out of the key so changing it does not re-run finished rows.
    """

    target: str
    draft: str | None
    dataset: str
    max_new_tokens: int
    max_prompt_tokens: int | None = None
    dtype: str = "float32"
    device: str = "cpu"
    threads: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    engine: str = "hf"  # engine.generate's cache engine: "hf" (dynamic) or "static"; hf-assisted ignores it
    compile: bool = False
    temperature: float = 0.0  # > 0: lossless sampling; outputs then differ from AR by design (no greedy check)
    kv_window: int | None = None  # StreamingLLM-style eviction (sinks + window) for every strategy, AR included
    kv_sinks: int = 4
    buckets: tuple[int, ...] | None = None  # static engine query buckets (None: 1, 2, 4, ..., 256)
    cpu_linear: bool | None = None  # kernels/cpu_linear.py layout; None = the engine's default (on for CPU)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise DynaTreeError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise DynaTreeError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        object.__setattr__(self, "buckets", self.engine_fields(self.engine_options())["buckets"])  # checked, sorted
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    def engine_options(self) -> EngineOptions:
        """The bench-wide engine options (a spec's run options override them: ``StrategySpec.engine_options``)."""
        return EngineOptions(**{name: getattr(self, name) for name in ENGINE_FIELDS})

    @staticmethod
    def engine_fields(options: EngineOptions) -> dict[str, Any]:
        """``options`` as BenchSettings keywords (compile as recorded in rows: True or False).

        Refuses ``engine="auto"``: a row says which engine it measured."""
        if options.engine not in ("hf", "static", "aot"):
            raise DynaTreeError(f"engine must be 'hf', 'static' or 'aot', got {options.engine!r}")
        return {name: bool(options.compile) if name == "compile" else getattr(options, name) for name in ENGINE_FIELDS}

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["kv_window"] is None:  # keep the keys of rows written before eviction existed
            del d["kv_window"], d["kv_sinks"]
        if d["buckets"] is None:
            del d["buckets"]
        else:
            d["buckets"] = list(d["buckets"])
        if d["cpu_linear"] is None:
            del d["cpu_linear"]
        if isinstance(d["eos_token_id"], tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        return d


@dataclass(frozen=True)
class Measurement:
    """What one timed run produced (engine or HF)."""

    output_ids: list[int]
    stats: dict[str, Any]
    per_round: list[dict[str, Any]]


def first_mismatch(reference: Sequence[int], output: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts); None if identical."""
    for i, (a, b) in enumerate(zip(reference, output)):
        if a != b:
            return i
    return None if len(reference) == len(output) else min(len(reference), len(output))


# ----------------------------------------------------------------------------------- single runs
def run_engine(
    target: torch.nn.Module, draft: torch.nn.Module | None, prompt: Prompt, spec: StrategySpec,
    settings: BenchSettings, max_new_tokens: int, cache: "SuffixCache | ReadOnlyCache | None" = None,
) -> Measurement:
    """One timed ``generate`` of ``spec`` on ``prompt``; ``cache``: the cross-request text cache
    its text source reads (a ``text_cache`` spec; the bench passes it only for those)."""
    result = generate(
        target,
        draft_for(spec, draft, cache),
        list(prompt.ids),
        make_policy(spec.name, **spec.policy_options),
        text=spec.source != "model",  # source=model: the draft model's tree alone
        max_new_tokens=max_new_tokens,
        stopping=StoppingConfig(eos_token_id=_eos(settings)),
        seed=0,  # DySpec samples its children: fix the draw so reruns build the same trees
        sampling=SamplingConfig(temperature=settings.temperature),
        options=spec.engine_options(settings.engine_options()),
    )
    d = result.stats.to_dict()
    per_round = d.pop("per_round")
    d.update(cost_model_fields(result.stats.cost_profile, per_round))
    out = result.sequences[0, result.stats.prompt_tokens:].tolist()
    return Measurement(output_ids=out, stats=d, per_round=per_round)


def draft_for(spec: StrategySpec, draft: torch.nn.Module | None, cache: Any = None) -> Any:
    """What ``generate`` gets as its draft for ``spec``: the model, None (the text alone), or both
    in one tree (:class:`~dynatree.drafts.suffix.TextDraft` wrapping the model); with ``cache``
    the text source also drafts from that cross-request cache. A spec's ``text_trim`` becomes
    ``TextDraft(trim=...)``."""
    text = {"trim": spec.run["text_trim"]} if "text_trim" in spec.run else {}
    if spec.source == "hybrid":
        return TextDraft(model=draft, cache=cache, **text)
    if spec.source == "model":
        return draft
    return TextDraft(cache=cache, **text) if (cache is not None or text) else None


class ReadOnlyCache:
    """A :class:`SuffixCache` that a run's text source reads but does not fill: its ``finish()``
    would add the prompt and every committed token, the last round's tokens past the end of the
    output included, inside the timed call. The bench adds the prompt and the output the row
    stores itself, after the run, so a resumed run can rebuild the same cache from stored rows."""

    def __init__(self, cache: SuffixCache) -> None:
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def add(self, tokens: Sequence[int]) -> None:
        pass


def _history(prompts: Sequence[Prompt]) -> list[str]:
    """For each prompt, a digest of the prompts before it (ids and tokens): what a ``text_cache``
    row's cache held when it ran, given the same spec and settings ('' for the first prompt)."""
    out, h = [], hashlib.sha256()
    for p in prompts:
        out.append(h.hexdigest()[:12] if out else "")
        h.update(f"{p.id}#{p.sha};".encode())
    return out


def cost_model_fields(profile: Any, per_round: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verify-cost profile a run's policy sized its trees from (``GenerationStats.cost_profile``)
    and the mean budget it chose (nodes per round); empty for a policy with a pinned budget."""
    budgets = [r["policy_state"]["budget"] for r in per_round if "budget" in (r.get("policy_state") or {})]
    if profile is None or not budgets:
        return {}
    return {"budget": sum(budgets) / len(budgets),
            "cost_profile": {"rows": list(profile.rows), "ms": list(profile.ms), "stepwise": profile.stepwise}}


class _TimingStreamer:
    """HF streamer that timestamps every ``put``: the first is the prompt, each later one a round."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.events: list[tuple[float, int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.events.append((self.clock(), int(value.numel())))

    def end(self) -> None:
        pass


@contextmanager
def _assistant_options(draft: torch.nn.Module, options: dict[str, Any]) -> Iterator[None]:
    """HF reads assisted-decoding knobs from the *assistant's* generation config; set, then restore."""
    gen = draft.generation_config
    saved = {k: getattr(gen, k, None) for k in options}
    for k, v in options.items():
        setattr(gen, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(gen, k, v)


def run_hf_assisted(
    target: torch.nn.Module, draft: torch.nn.Module, prompt: Prompt, spec: StrategySpec,
    settings: BenchSettings, max_new_tokens: int,
) -> Measurement:
    device = next(target.parameters()).device
    clock = sync_clock(device)
    streamer = _TimingStreamer(clock)
    ids = torch.tensor([prompt.ids], device=device)
    eos = _eos(settings)
    kwargs: dict[str, Any] = {"eos_token_id": list(eos) if isinstance(eos, tuple) else eos} if eos is not None else {}
    pad = getattr(target.generation_config, "pad_token_id", None)
    if pad is None:
        pad = getattr(target.generation_config, "eos_token_id", None)
        pad = pad[0] if isinstance(pad, list) else pad
    if spec.name == HF_PROMPT_LOOKUP:  # n-gram lookup in the prompt and output: no assistant model
        kwargs.update(spec.config)
    if spec.name != HF_ASSISTED:  # plain greedy generate, or prompt lookup
        draft = None
    options = _assistant_options(draft, spec.options) if draft is not None else contextlib.nullcontext()
    with torch.inference_mode(), options:
        start = clock()
        out = target.generate(
            # an explicit mask: without one HF masks every prompt token equal to the pad id (a chat
            # prompt's earlier <|im_end|> turns, say) and answers another question than ours
            ids, attention_mask=torch.ones_like(ids), assistant_model=draft, do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=0, streamer=streamer, pad_token_id=pad, **kwargs,
        )
        t_total = clock() - start
    new = out[0, len(prompt.ids):].tolist()
    rounds = [n for _, n in streamer.events[1:]]
    ttft = streamer.events[1][0] - start if len(streamer.events) > 1 else t_total
    n = len(new)
    stats = {
        "strategy": spec.name, "prompt_tokens": len(prompt.ids), "new_tokens": n,
        "rounds": len(rounds), "mean_committed": n / len(rounds) if rounds else None,
        # HF does not expose what it drafted or accepted per round: unknown, not zero.
        "mean_accepted": None, "acceptance": None, "mean_drafted": None, "mean_depth": None,
        "draft_calls": None,
        "tokens_per_second": n / t_total if t_total > 0 else 0.0,
        "ttft": ttft, "tpot": (t_total - ttft) / (n - 1) if n > 1 else 0.0, "t_total": t_total,
        "t_prefill": None, "t_draft": None, "t_verify": None, "t_commit": None,
    }
    return Measurement(output_ids=new, stats=stats, per_round=[{"committed": c} for c in rounds])


def _engine_record(options: EngineOptions) -> dict[str, Any]:
    """How a row was run (from its resolved options): engine, compile, whether the few-row linear
    kernels were on, and their plan by row count with where it came from (measured on this CPU,
    or pinned): the CPU choices a row's speed depends on, kept with the row."""
    plan = options.linear_plan if options.cpu_linear else None
    return {"engine": options.engine, "compile": options.compile, "cpu_linear": options.cpu_linear,
            "linear_plan": plan.describe() if plan is not None else None}


def _aot_ready(target: Any, draft: Any, options: EngineOptions) -> bool:
    """Whether every aot package the run needs (target, and a draft model's) is on disk already."""
    from dynatree.drafts.registry import proposer_for
    from dynatree.runtime.aot_engine import BUCKETS, all_cached

    plan = options.linear_plan if options.cpu_linear else None
    proposer = proposer_for(draft) if draft is not None else None
    models = [target] + (proposer.models(draft) if proposer is not None and proposer.draft_engine(options) == "aot" else [])
    return all(all_cached(m, options.buckets or BUCKETS, plan) for m in models)


def choices(options: EngineOptions) -> str:
    """One line: the engine and the few-row linear kernels a run takes, and where the kernel choice
    came from (measured on this CPU, or pinned)."""
    plan = options.linear_plan if options.cpu_linear else None
    return (f"{options.engine} engine, compile={options.compile}; linear kernels: "
            f"{plan.describe() if plan is not None else 'F.linear at every row count (cpu_linear off)'}")


def _eos(settings: BenchSettings) -> int | tuple[int, ...] | None:
    return settings.eos_token_id


# ------------------------------------------------------------------------------------ the bench
Runner = Callable[[torch.nn.Module, "torch.nn.Module | None", Prompt, StrategySpec, BenchSettings, int], Measurement]


def _runner_for(spec: StrategySpec) -> Runner:
    return run_hf_assisted if spec.name in HF_NAMES else run_engine  # type: ignore[return-value]


def hf_assistant(draft: torch.nn.Module) -> torch.nn.Module:
    """``draft`` as a model HF's ``generate(assistant_model=...)`` takes: itself when it is an HF
    model, else its export to a plain ``LlamaForCausalLM`` (a distilled draft; the export equals the
    runtime draft, see :mod:`dynatree.integrations.export_hf`), on the draft's device and dtype."""
    if hasattr(draft, "generation_config") and hasattr(draft, "generate"):
        return draft
    from dynatree.integrations.export_hf import build_hf_model

    try:
        model = build_hf_model(draft)
    except DynaTreeError as e:
        raise DynaTreeError(f"hf-assisted needs a HuggingFace model as draft (got {type(draft).__name__}: {e}); "
                            "drop hf-assisted or pass a standalone draft model") from None
    weight = next(draft.parameters())
    return model.to(device=weight.device, dtype=weight.dtype)


@dataclass
class BenchOutcome:
    """Rows of this run group (earlier sessions' included), what was new, and the greedy check."""

    rows: list[dict[str, Any]]
    new_rows: int
    resumed_rows: int
    mismatches: list[dict[str, Any]]
    group: str


def run_bench(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    prompts: Sequence[Prompt],
    specs: Sequence[StrategySpec],
    settings: BenchSettings,
    *,
    writer: ResultsWriter | None = None,
    warmup: int = 1,
    warmup_tokens: int | None = None,
    on_row: RowCallback | None = None,
    progress: bool = True,
    session: str | None = None,
    origin: str = "bench",
) -> BenchOutcome:
    """Measure every spec on every prompt; see the module docstring for the protocol.

    ``writer`` receives each row as soon as it is measured (and supplies the rows of an earlier,
    interrupted run, which are skipped). ``on_row`` is called after each new row is stored.
    ``origin`` ("bench" or "sweep") tells the report which tables a row belongs in.
    """
    specs = list(specs)
    if not prompts:
        raise DynaTreeError("no prompts to benchmark")
    if not specs or specs[0].name != AUTOREGRESSIVE:
        raise DynaTreeError("the first strategy must be autoregressive (the reference of every speedup)")
    if draft is None:  # no draft model: specs that did not pick a source draft from the text
        specs = [s.without_model() for s in specs]
    assistant = hf_assistant(draft) if draft is not None and any(s.name == HF_ASSISTED for s in specs) else None
    if settings.kv_window is not None and any(s.name in HF_NAMES for s in specs):
        raise DynaTreeError("HF's generate cannot evict KV rows (--kv-window): drop hf-assisted, hf-generate and "
                            "hf-prompt-lookup from the strategies")
    if warmup < 0:
        raise DynaTreeError(f"warmup must be >= 0, got {warmup}")
    if settings.kv_window is None:  # a run too long for the models: the error now, not after compiling for it
        longest = max(len(p.ids) for p in prompts)
        for s in specs:
            if s.name not in HF_NAMES:
                check_positions(longest, settings.max_new_tokens, make_policy(s.name, **s.policy_options), target,
                                draft_for(s, draft))
    resolved = {s.label: resolve_options(s.engine_options(settings.engine_options()), target)
                for s in specs if s.name not in HF_NAMES}
    records = {label: _engine_record(options) for label, options in resolved.items()}
    for line in sorted({choices(options) for options in resolved.values()}):
        notice(f"dynatree bench: {line}")  # which engine and CPU choices this run made, and why
    compiled = [s for s in specs if s.label in resolved and (resolved[s.label].engine == "aot" or
                (resolved[s.label].engine == "static" and resolved[s.label].compile))]
    for s in compiled:  # whether the aot engine's packages were on disk before this run, or built by it
        if resolved[s.label].engine == "aot":
            records[s.label]["aot_packages"] = "loaded" if _aot_ready(target, draft if s.uses_draft else None,
                                                                      resolved[s.label]) else "built"
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise DynaTreeError("prompt ids must be unique")

    identity = settings.identity()
    keyed = {**identity, "provenance": provenance()}  # another machine, version or commit: measured anew
    group = settings_group(keyed)
    session = session or uuid.uuid4().hex[:12]
    done = writer.done if writer is not None else {}
    device = next(target.parameters()).device
    machine, versions = machine_info(), library_versions()
    # The prompt's token hash is part of the key: if a prompt set changes, old rows are not reused.
    # A text_cache row also depends on the prompts before it (its cache held them): they are in its key.
    plan = [(p, s, row_key(s.name, s.config, f"{p.id}#{p.sha}" + (f"<{before}" if before and s.text_cache else ""),
                           keyed))
            for p, before in zip(prompts, _history(prompts)) for s in specs]
    caches = {s.label: SuffixCache(s.text_cache) for s in specs if s.text_cache is not None}
    todo = [item for item in plan if item[2] not in done]

    reference_spec = specs[0]  # the first autoregressive spec; further ones are extra baselines
    rows: list[dict[str, Any]] = []
    mismatches: list[dict[str, Any]] = []
    reference: dict[str, list[int]] = {}
    bar = _progress(progress, warmup * len(specs) if todo else 0, len(todo))
    with bar:
        if todo and compiled:
            bar.describe("compiling every static bucket / aot package")
            for options in dict.fromkeys(resolved[s.label] for s in compiled):
                users = [s for s in compiled if resolved[s.label] == options]
                precompile(target, draft if any(s.uses_draft for s in users) else None,
                           max(len(p.ids) for p in prompts) + settings.max_new_tokens, options)
        if todo:
            wt = min(warmup_tokens or settings.max_new_tokens, settings.max_new_tokens)
            scratch = {label: SuffixCache(c.max_tokens) for label, c in caches.items()}  # thrown away after
            for w in range(warmup):
                for spec in specs:
                    bar.describe(f"warm-up {w + 1}/{warmup} {spec.label}")
                    _runner_for(spec)(target, assistant if spec.name == HF_ASSISTED else draft,
                                      prompts[w % len(prompts)], spec, settings, wt,
                                      **({"cache": scratch[spec.label]} if spec.label in scratch else {}))
                    bar.advance_warmup()
        for prompt, spec, key in plan:
            cache = caches.get(spec.label)
            if key in done:
                row = done[key]
            else:
                bar.describe(f"{prompt.id} {spec.label}")
                reset_peak_memory(device)
                m = _runner_for(spec)(target, assistant if spec.name == HF_ASSISTED else draft, prompt, spec,
                                      settings, settings.max_new_tokens,
                                      **({"cache": ReadOnlyCache(cache)} if cache is not None else {}))
                mem, mem_kind = peak_memory_mb(device)
                row = {
                    "schema": SCHEMA_VERSION, "key": key, "group": group, "session": session, "origin": origin,
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "label": spec.label, "strategy": spec.name, "options": spec.options, "config": spec.config,
                    "engine": records.get(spec.label),
                    "reference": spec is reference_spec,
                    "prompt_id": prompt.id, "prompt_sha": prompt.sha, "prompt_tokens": len(prompt.ids),
                    "settings": identity, "warmup": warmup, "machine": machine, "versions": versions,
                    "code": keyed["provenance"]["code"],
                    "stats": m.stats, "per_round": m.per_round, "output_ids": m.output_ids,
                    "peak_memory_mb": mem, "memory_kind": mem_kind,
                }
                if cache is not None:  # what this prompt could draft from besides its own text
                    row["text_cache"] = {"max_tokens": cache.max_tokens, "tokens": cache.num_tokens,
                                         "sequences": cache.num_sequences}
                ref = reference.get(prompt.id) if spec is not reference_spec else m.output_ids
                if ref is None:  # should not happen: AR runs first for every prompt
                    raise DynaTreeError(f"no autoregressive reference for prompt {prompt.id}")
                if settings.temperature == 0:
                    row["first_mismatch"] = first_mismatch(ref, m.output_ids)
                    row["greedy_match"] = row["first_mismatch"] is None
                else:  # sampled outputs are supposed to differ; exactness is tested statistically
                    row["first_mismatch"] = row["greedy_match"] = None
                if writer is not None:
                    writer.append(row)
                bar.advance()
                if on_row is not None:
                    on_row(row)
            if spec is reference_spec:
                reference[prompt.id] = list(row["output_ids"])
            if cache is not None:  # after the row, measured or resumed: the next prompts see this one
                cache.add([*prompt.ids, *row["output_ids"]])
            if row.get("greedy_match") is False:
                mismatches.append(row)
            rows.append(row)
    return BenchOutcome(rows=rows, new_rows=len(todo), resumed_rows=len(plan) - len(todo),
                        mismatches=mismatches, group=group)


class _Progress:
    """A rich progress bar over prompts x strategies (plus warm-up), or nothing when disabled."""

    def __init__(self, enabled: bool, warmup_total: int, total: int) -> None:
        self.enabled = enabled
        self.warmup_total, self.total = warmup_total, total
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._p = Progress(
                TextColumn("[bold]{task.fields[what]:<40}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), transient=False,
            )

    def __enter__(self) -> "_Progress":
        if self.enabled:
            self._p.start()
            if self.warmup_total:
                self._w = self._p.add_task("warm-up", total=self.warmup_total, what="warm-up")
            self._t = self._p.add_task("runs", total=self.total, what="runs")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._p.stop()

    def describe(self, what: str) -> None:
        if self.enabled:
            task = self._w if what.startswith("warm-up") and self.warmup_total else self._t
            self._p.update(task, what=what[:40])

    def advance_warmup(self) -> None:
        if self.enabled and self.warmup_total:
            self._p.advance(self._w)

    def advance(self) -> None:
        if self.enabled:
            self._p.advance(self._t)


def _progress(enabled: bool, warmup_total: int, total: int) -> _Progress:
    return _Progress(enabled, warmup_total, total)
