"""Strategy specs: which strategies a benchmark runs, with which options, under which label.

Syntax (one string, as given to ``--strategies``)::

    SPEC[,SPEC...]          SPEC = NAME[:KEY=VALUE[:KEY=VALUE...]][@LABEL]

* ``NAME`` is an engine strategy (``autoregressive``, ``linear``, ``fixed``, ``dynatree``, ...) or
  one of HuggingFace's own greedy decoders: ``hf-generate`` (plain ``generate``), ``hf-assisted``
  (``generate(assistant_model=draft)``; a distilled draft is exported to a plain HF model for it)
  and ``hf-prompt-lookup`` (``generate(prompt_lookup_num_tokens=10)``: no draft model);
* options are the strategy's config fields, values parsed like ``generate -o`` (ints, floats,
  ``true``/``false``, strings), plus *run* options that override the bench's settings for
  this spec only: ``engine=hf|static|aot``, ``compile=true|false``, ``cpu_linear=true|false`` and
  ``source=model|text|hybrid`` (what drafts: the draft model, the text itself with no model, or
  both in one tree), and with ``source=text|hybrid`` ``text_trim=true|false`` (whether the text's
  proposal is cut to what pays for its verify rows, ``TextDraft.trim``; default true). They let
  one run measure a strategy on both engines, or from every source, side by side, e.g.
  ``dynatree:engine=static:compile=true@dynatree-compiled``,
  ``dynatree:source=hybrid@dynatree-hybrid`` or ``dynatree:source=text:text_trim=false@text-full``.
  Without ``source`` a spec drafts with the model, or from the text when the bench has no draft
  model (``--draft none``). ``text_cache=true|N`` (``source=text`` or ``hybrid``; without
  ``source``, the hybrid) gives the spec's text source one cross-request
  :class:`~dynatree.drafts.suffix_index.SuffixCache` of at most N tokens (``true``:
  :data:`~dynatree.catalog.BENCH_CACHE_TOKENS`) shared by its rows, in prompt order: each prompt
  drafts also from the earlier prompts and their outputs (see :mod:`dynatree.bench.runner`);
* ``@LABEL`` names the row in tables; without it the label is the spec text itself, so
  ``linear:k=5,linear:k=8`` gives two distinct rows. Two specs with the same label are refused.
* presets expand in place: ``paper`` (the DynaTree paper's Table 1 line-up) and ``ablation`` (its Table 4).

The autoregressive baseline is always run (first): every speedup and every greedy-output check is
against it. Several autoregressive specs may be given when their run options differ (say HF-eager
and compiled static); the first is the reference of the greedy check and of ``speedup``, and every
row also gets a speedup over each of them. Options are validated here, before any model is loaded,
so a typo fails in a second.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dynatree.catalog import BENCH_CACHE_TOKENS
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions
from dynatree.policies import make_policy, parse_inline

HF_ASSISTED = "hf-assisted"
#: HuggingFace's own greedy ``generate`` (eager, no draft): the baseline a user compares with first.
HF_GENERATE = "hf-generate"
#: HuggingFace's prompt lookup decoding: n-gram matches in the prompt and output, no draft model.
HF_PROMPT_LOOKUP = "hf-prompt-lookup"
HF_NAMES = (HF_ASSISTED, HF_GENERATE, HF_PROMPT_LOOKUP)
AUTOREGRESSIVE = "autoregressive"
# Generation-config fields HF reads for assisted decoding; anything else would be silently ignored.
HF_ASSISTED_OPTIONS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
#: ``generate`` arguments of prompt lookup, with HF's defaults written out (HF's docs use 10 tokens).
HF_PROMPT_LOOKUP_DEFAULTS = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2}
# Options that choose how a strategy runs (engine.generate arguments), not how its policy drafts.
RUN_OPTIONS = ("engine", "compile", "cpu_linear", "source", "text_trim", "text_cache")
ENGINES = ("hf", "static", "aot")
#: What drafts a tree: the draft model, the text itself (a suffix index, no model), or both merged.
SOURCES = ("model", "text", "hybrid")

PRESETS: dict[str, str] = {
    # The DynaTree paper's Table 1 line-up (WikiText-2 settings): AR, Linear K=8, Fixed (D=8, B=3, tau=0.1), DynaTree.
    "paper": "autoregressive,linear:k=8,fixed:depth=8:branch=3:tau=0.1,dynatree,hf-assisted",
    # The DynaTree paper's Table 4: the same DynaTree policy with its phases switched on one after another.
    "ablation": (
        "dynatree:adaptive_breadth=false:adaptive_depth=false:history=false@dynatree-static,"
        "dynatree:history=false@dynatree-no-history,"
        "dynatree@dynatree-full"
    ),
}


@dataclass(frozen=True)
class StrategySpec:
    """One strategy to benchmark. ``options`` are only the user-given ones; ``config`` is the full
    resolved config (defaults included) that goes into every result row, plus the run options
    (``engine``/``compile``) when given, so the same strategy on two engines has two row keys."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    config: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise DynaTreeError("empty strategy name in --strategies")
        run = self.run
        if run:
            where = format_spec(self.name, self.options)
            if self.name in HF_NAMES:
                raise DynaTreeError(f"'{where}': {self.name} runs HuggingFace generate; it takes no "
                                    f"{'/'.join(RUN_OPTIONS)} option")
            if "source" in run and run["source"] not in SOURCES:
                raise DynaTreeError(f"'{where}': source must be one of {', '.join(SOURCES)}, got {run['source']!r}")
            if "source" in run and self.name == AUTOREGRESSIVE:
                raise DynaTreeError(f"'{where}': autoregressive drafts nothing; it takes no source option")
            if "engine" in run and run["engine"] not in ENGINES:
                raise DynaTreeError(f"'{where}': engine must be one of {', '.join(ENGINES)}, got {run['engine']!r}")
            for flag in ("compile", "cpu_linear", "text_trim"):
                if flag in run and not isinstance(run[flag], bool):
                    raise DynaTreeError(f"'{where}': {flag} must be true or false, got {run[flag]!r}")
            if "text_trim" in run and run.get("source") not in ("text", "hybrid"):
                raise DynaTreeError(f"'{where}': text_trim needs source=text or source=hybrid (it cuts the text's trees)")
            if "text_cache" in run:
                cache = run["text_cache"]
                if not isinstance(cache, bool) and not (isinstance(cache, int) and cache >= 1):
                    raise DynaTreeError(f"'{where}': text_cache must be true, false or a token count >= 1, "
                                        f"got {cache!r}")
                if self.name == AUTOREGRESSIVE:
                    raise DynaTreeError(f"'{where}': autoregressive drafts nothing; it takes no text_cache option")
                if cache is not False and run.get("source") == "model":
                    raise DynaTreeError(f"'{where}': text_cache is the text source's and source=model drafts "
                                        "from the model alone; drop source= (text_cache implies the hybrid) "
                                        "or pass source=text")
        if self.name == HF_ASSISTED:
            unknown = sorted(set(self.options) - set(HF_ASSISTED_OPTIONS))
            if unknown:
                raise DynaTreeError(
                    f"unknown option(s) {', '.join(unknown)} for strategy '{HF_ASSISTED}'; "
                    f"valid: {', '.join(HF_ASSISTED_OPTIONS)}"
                )
            config = dict(self.options)
        elif self.name == HF_GENERATE:
            if self.options:
                raise DynaTreeError(f"strategy '{HF_GENERATE}' takes no options, got {', '.join(self.options)}")
            config = {}
        elif self.name == HF_PROMPT_LOOKUP:
            unknown = sorted(set(self.options) - set(HF_PROMPT_LOOKUP_DEFAULTS))
            if unknown:
                raise DynaTreeError(f"unknown option(s) {', '.join(unknown)} for strategy '{HF_PROMPT_LOOKUP}'; "
                                    f"valid: {', '.join(HF_PROMPT_LOOKUP_DEFAULTS)}")
            config = {**HF_PROMPT_LOOKUP_DEFAULTS, **self.options}
        else:
            policy = make_policy(self.name, **self.policy_options)  # validates names and ranges
            config = {**dataclasses.asdict(policy.config), **run}
            config.pop("text_cache", None)
            if self.text_cache is not None:  # the bound itself: true and its number share one row key
                config["text_cache"] = self.text_cache
                config["source"] = self.source  # (implied or given: both spellings share a key)
        object.__setattr__(self, "config", config)
        if not self.label:
            object.__setattr__(self, "label", format_spec(self.name, self.options))

    @property
    def uses_draft(self) -> bool:
        """Whether this spec needs the draft model (a text-only source and HF's own
        no-draft decoders do not)."""
        return self.name not in (AUTOREGRESSIVE, HF_GENERATE, HF_PROMPT_LOOKUP) and self.source != "text"

    @property
    def source(self) -> str | None:
        """What drafts for this spec (``model``, ``text`` or ``hybrid``); None for a strategy that
        drafts nothing or runs HF's decoders; when the spec does not say, ``hybrid`` with a
        ``text_cache`` (the cache is the text's) and ``model`` otherwise."""
        if self.name in (AUTOREGRESSIVE, *HF_NAMES):
            return None
        return self.run.get("source", "hybrid" if self.text_cache is not None else "model")

    @property
    def text_cache(self) -> int | None:
        """The token bound of the cross-request text cache this spec's rows share, or None (no
        ``text_cache`` option, or ``text_cache=false``)."""
        cache = self.run.get("text_cache", False)
        if cache is False:
            return None
        return BENCH_CACHE_TOKENS if cache is True else int(cache)

    def without_model(self) -> "StrategySpec":
        """This spec for a bench with no draft model: a spec that did not choose its source drafts
        from the text (same label); one that asked for the model is refused."""
        if not self.uses_draft:
            return self
        if "source" in self.run or self.name == HF_ASSISTED:
            raise DynaTreeError(f"'{self.label}' needs a draft model (source={self.source or 'model'}); "
                                "pass --draft, or drop it")
        return StrategySpec(self.name, {**self.options, "source": "text"}, self.label)

    @property
    def run(self) -> dict[str, Any]:
        """The user-given run options (engine/compile/cpu_linear overrides, source, text_trim, text_cache)."""
        return {k: v for k, v in self.options.items() if k in RUN_OPTIONS}

    @property
    def policy_options(self) -> dict[str, Any]:
        """The options that go to the strategy's config."""
        return {k: v for k, v in self.options.items() if k not in RUN_OPTIONS}

    def engine_for(self, engine: str, compile: bool) -> tuple[str, bool]:
        """This spec's (engine, compile), given the bench-wide defaults; refuses compile on 'hf'.

        A spec that picks ``engine=hf`` drops a bench-wide ``--compile`` (it only asked for eager)."""
        picked_hf = self.run.get("engine") == "hf"
        engine = self.run.get("engine", engine)
        compile = self.run.get("compile", False if picked_hf else compile)
        if compile and engine != "static":
            raise DynaTreeError(f"'{self.label}': compile=true needs engine=static (compiled steps need fixed shapes)")
        return engine, compile

    def engine_options(self, base: EngineOptions) -> EngineOptions:
        """The bench-wide engine options ``base`` with this spec's run options applied."""
        engine, compile = self.engine_for(base.engine, bool(base.compile))
        return base.replace(engine=engine, compile=compile, cpu_linear=self.run.get("cpu_linear", base.cpu_linear))


def format_spec(name: str, options: dict[str, Any]) -> str:
    """Inverse of :func:`parse_spec` (without the label): ``linear:k=8``."""
    parts = [name] + [f"{k}={_fmt(v)}" for k, v in options.items()]
    return ":".join(parts)


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_spec(text: str) -> StrategySpec:
    """``"fixed:depth=8:branch=3@wide"`` -> StrategySpec("fixed", {"depth": 8, "branch": 3}, "wide")."""
    body, _, label = text.strip().partition("@")
    name, options = parse_inline(body)  # the syntax generate(strategy="linear:k=5") takes too
    return StrategySpec(name=name, options=options, label=label.strip())


def parse_strategies(text: str, *, ensure_autoregressive: bool = True) -> list[StrategySpec]:
    """Parse a comma-separated spec list (presets expanded); AR is put first if requested."""
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    expanded: list[str] = []
    for item in items:
        expanded += [s for s in PRESETS[item].split(",")] if item in PRESETS else [item]
    if not expanded:
        raise DynaTreeError("--strategies is empty")
    specs = [parse_spec(s) for s in expanded]
    if ensure_autoregressive and not any(s.name == AUTOREGRESSIVE for s in specs):
        specs.insert(0, StrategySpec(AUTOREGRESSIVE))
    specs.sort(key=lambda s: s.name != AUTOREGRESSIVE)  # stable: AR first, the rest in given order
    return dedupe_labels(specs)


def dedupe_labels(specs: list[StrategySpec]) -> list[StrategySpec]:
    """Refuse two specs with one label: their rows would be indistinguishable in every table."""
    seen: dict[str, StrategySpec] = {}
    for spec in specs:
        if spec.label in seen:
            raise DynaTreeError(
                f"strategy label '{spec.label}' appears twice; give one of them a label with @NAME"
            )
        seen[spec.label] = spec
    runs = [tuple(sorted(s.run.items())) for s in specs if s.name == AUTOREGRESSIVE]
    if len(set(runs)) < len(runs):
        raise DynaTreeError("autoregressive is given twice with the same engine options; "
                            "several autoregressive baselines must differ in engine= or compile=")
    return specs
