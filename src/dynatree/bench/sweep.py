"""Parameter sweeps: the Cartesian product of option values for one strategy, run like a bench.

A sweep is just a benchmark whose strategy list is generated from a grid (plus baselines, the
autoregressive one always), optionally repeated over several generation lengths (the papers'
length-scaling study). It reuses the runner and the keyed results file, so a crashed or
interrupted sweep rerun with the same arguments continues where it stopped and never writes a row
twice. Every combination is validated before the first model call: a grid with one invalid
point (say ``tau_l >= tau_h``) fails immediately instead of after an hour.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dynatree.options import parse_value
from dynatree.errors import DynaTreeError
from dynatree.bench.runner import BenchOutcome, BenchSettings, Prompt, RowCallback, run_bench
from dynatree.bench.specs import AUTOREGRESSIVE, StrategySpec, dedupe_labels, format_spec
from dynatree.bench.store import ResultsWriter


def parse_axis(item: str) -> tuple[str, list[Any]]:
    """``"depth=4,6,8"`` -> ``("depth", [4, 6, 8])``."""
    key, sep, raw = item.partition("=")
    key = key.strip().replace("-", "_")
    values = [parse_value(v.strip()) for v in raw.split(",") if v.strip()]
    if not sep or not key or not values:
        raise DynaTreeError(f"--grid '{item}' must look like name=v1,v2,...")
    if len({repr(v) for v in values}) != len(values):
        raise DynaTreeError(f"--grid '{item}' repeats a value")
    return key, values


@dataclass(frozen=True)
class SweepGrid:
    """``strategy`` with fixed ``base`` options and swept ``axes`` (name -> values, in order)."""

    strategy: str
    axes: dict[str, list[Any]]
    base: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.axes:
            raise DynaTreeError("a sweep needs at least one --grid name=v1,v2,...")
        both = sorted(set(self.axes) & set(self.base))
        if both:
            raise DynaTreeError(f"option(s) {', '.join(both)} are both fixed and swept")
        self.specs()  # validate every point now

    @property
    def size(self) -> int:
        n = 1
        for v in self.axes.values():
            n *= len(v)
        return n

    def specs(self) -> list[StrategySpec]:
        names = list(self.axes)
        out = []
        for combo in itertools.product(*(self.axes[n] for n in names)):
            options = {**self.base, **dict(zip(names, combo))}
            try:
                out.append(StrategySpec(self.strategy, options, label=format_spec(self.strategy, options)))
            except DynaTreeError as err:
                raise DynaTreeError(f"grid point {format_spec(self.strategy, options)} is invalid: {err}") from None
        return out


def sweep_specs(grid: SweepGrid, baselines: Sequence[StrategySpec]) -> list[StrategySpec]:
    """AR first (the given autoregressive baselines, or a plain one), then the baselines, then the grid."""
    ars = [s for s in baselines if s.name == AUTOREGRESSIVE] or [StrategySpec(AUTOREGRESSIVE)]
    specs = [s for s in baselines if s.name != AUTOREGRESSIVE]
    return dedupe_labels([*ars, *specs, *grid.specs()])


def run_sweep(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    prompts: Sequence[Prompt],
    grid: SweepGrid,
    settings: BenchSettings,
    writer: ResultsWriter,
    *,
    baselines: Sequence[StrategySpec] = (),
    lengths: Sequence[int] | None = None,
    warmup: int = 1,
    warmup_tokens: int | None = None,
    on_row: RowCallback | None = None,
    progress: bool = True,
) -> list[BenchOutcome]:
    """Run the grid once per generation length (default: ``settings.max_new_tokens``)."""
    specs = sweep_specs(grid, baselines)
    outcomes = []
    for length in lengths or [settings.max_new_tokens]:
        s = dataclasses.replace(settings, max_new_tokens=int(length))
        outcomes.append(
            run_bench(target, draft, prompts, specs, s, writer=writer, warmup=warmup,
                      warmup_tokens=warmup_tokens, on_row=on_row, progress=progress, origin="sweep")
        )
    return outcomes
