"""Strategy specs: which strategies a benchmark runs, with which options, under which label.

Syntax (one string, as given to ``--strategies``)::

    SPEC[,SPEC...]          SPEC = NAME[:KEY=VALUE[:KEY=VALUE...]][@LABEL]

* ``NAME`` is an engine strategy (``autoregressive``, ``linear``, ``fixed``, ``dynatree``, ...) or
  ``hf-assisted`` (HuggingFace ``generate(assistant_model=draft)``, greedy);
* options are the strategy's config fields, values parsed like ``generate -o`` (ints, floats,
  ``true``/``false``, strings);
* ``@LABEL`` names the row in tables; without it the label is the spec text itself, so
  ``linear:k=5,linear:k=8`` gives two distinct rows. Two specs with the same label are refused.
* presets expand in place: ``seeds`` (the S0 Table 1 line-up) and ``ablation`` (S0 Table 4).

The autoregressive baseline is always run (first): every speedup and every greedy-output check is
against it. Options are validated here, before any model is loaded, so a typo fails in a second.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..cli import parse_value
from ..errors import DynaTreeError
from ..policies import make_policy

HF_ASSISTED = "hf-assisted"
AUTOREGRESSIVE = "autoregressive"
# Generation-config fields HF reads for assisted decoding; anything else would be silently ignored.
HF_ASSISTED_OPTIONS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")

PRESETS: dict[str, str] = {
    # S0 Table 1 line-up (WikiText-2 settings): AR, Linear K=8, Fixed (D=8, B=3, tau=0.1), DynaTree.
    "seeds": "autoregressive,linear:k=8,fixed:depth=8:branch=3:tau=0.1,dynatree,hf-assisted",
    # S0 Table 4: the same DynaTree policy with its phases switched on one after another.
    "ablation": (
        "dynatree:adaptive_breadth=false:adaptive_depth=false:history=false@dynatree-static,"
        "dynatree:history=false@dynatree-no-history,"
        "dynatree@dynatree-full"
    ),
}


@dataclass(frozen=True)
class StrategySpec:
    """One strategy to benchmark. ``options`` are only the user-given ones; ``config`` is the full
    resolved config (defaults included) that goes into every result row."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    config: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise DynaTreeError("empty strategy name in --strategies")
        if self.name == HF_ASSISTED:
            unknown = sorted(set(self.options) - set(HF_ASSISTED_OPTIONS))
            if unknown:
                raise DynaTreeError(
                    f"unknown option(s) {', '.join(unknown)} for strategy '{HF_ASSISTED}'; "
                    f"valid: {', '.join(HF_ASSISTED_OPTIONS)}"
                )
            config = dict(self.options)
        else:
            policy = make_policy(self.name, **self.options)  # validates names and ranges
            config = dataclasses.asdict(policy.config)
        object.__setattr__(self, "config", config)
        if not self.label:
            object.__setattr__(self, "label", format_spec(self.name, self.options))

    @property
    def uses_draft(self) -> bool:
        return self.name != AUTOREGRESSIVE


def format_spec(name: str, options: dict[str, Any]) -> str:
    """Inverse of :func:`parse_spec` (without the label): ``linear:k=8``."""
    parts = [name] + [f"{k}={_fmt(v)}" for k, v in options.items()]
    return ":".join(parts)


def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_spec(text: str) -> StrategySpec:
    """``"fixed:depth=8:branch=3@wide"`` -> StrategySpec("fixed", {"depth": 8, "branch": 3}, "wide")."""
    body, _, label = text.strip().partition("@")
    name, *items = [p.strip() for p in body.split(":")]
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not raw.strip():
            raise DynaTreeError(f"strategy option '{item}' in '{text.strip()}' must look like name=value")
        if key in options:
            raise DynaTreeError(f"option '{key}' given twice in '{text.strip()}'")
        options[key] = parse_value(raw.strip())
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
    ars = [s for s in specs if s.name == AUTOREGRESSIVE]
    if len(ars) > 1:
        raise DynaTreeError("autoregressive is the reference run and may appear only once")
    return specs
