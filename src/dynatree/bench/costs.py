"""What a model costs on this machine, and the budgets the defaults would choose from it
(``dynatree costs``).

For a target (and optionally a draft): the few-row linear kernels the plan picks per row count,
the verify-cost curve the tree budgets read (:mod:`dynatree.core.costmodel`, measured or read from
its cache exactly as a run would), the floor a step cannot beat on this machine (the target's
linear weights read once, at the memory's measured read rate), the node budget DynaTree and DySpec
would take, and a draft call's cost in target steps (what the hybrid's model gate charges a call).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dynatree import tuning
from dynatree.errors import DynaTreeError


def read_floor_ms(weights: list[torch.Tensor], reps: int = 5) -> tuple[float, float]:
    """(ms to read every tensor of ``weights`` once, GB/s): the fastest of ``reps`` full reads
    (``Tensor.sum``, which streams each tensor once)."""
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            for w in weights:
                w.sum()
            best = min(best, time.perf_counter() - t0)
    return 1e3 * best, sum(w.nbytes for w in weights) / best / 1e9


@dataclass
class CostReport:
    """One model's costs on this machine (times in ms)."""

    params: int
    weight_bytes: int
    floor_ms: float
    read_gb_per_s: float
    plan: str
    rows: tuple[int, ...]
    verify_ms: tuple[float, ...]
    budget: int
    draft_rows: tuple[int, ...] = ()
    draft_ms: tuple[float, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [m / self.verify_ms[0] for m in self.verify_ms]

    @property
    def draft_call_steps(self) -> float | None:
        """A two-row draft call in one-row target steps (what the model gate charges a call)."""
        if not self.draft_ms:
            return None
        from dynatree.core.costmodel import CostProfile

        return CostProfile(self.draft_rows, self.draft_ms).cost(2) / self.verify_ms[0]


def measure_costs(target: torch.nn.Module, draft: torch.nn.Module | None = None,
                  log: Any = None, refresh: bool = False) -> CostReport:
    """Measure (or read from the caches) what :func:`dynatree.generate` would: the linear plan,
    the target's verify-cost profile and, with ``draft``, the draft's per-call profile, on the hf
    engine as a CPU run uses it; ``refresh`` measures them all again and replaces the caches."""
    from dynatree.core import costmodel
    from dynatree.core.costmodel import CostProfile
    from dynatree.options import EngineOptions
    from dynatree.runtime.cache import CachedModel, vocab_size
    from dynatree.runtime.engines import resolve
    from dynatree.runtime.kernels import linear_plan
    from dynatree.runtime.kernels.linear_plan import linear_weights

    if not costmodel.enabled():
        raise DynaTreeError("DYNATREE_COST_MODEL=off: nothing is measured (unset it to see the costs)")
    if refresh:
        for model in (target, draft):
            if model is not None and next(model.parameters()).device.type == "cpu":
                linear_plan.plan_for(model, log=log, refresh=True)
    options = resolve(EngineOptions(engine="hf"), target)
    bands = options.linear_plan.bands if options.linear_plan else False
    kv = CachedModel(target, vocab_size(target), cpu_linear=options.linear_plan or False)
    with torch.inference_mode():
        profile = costmodel.profile_for(kv, target, "hf", False, kv.supports_lazy_head(), None, bands, log=log,
                                        refresh=refresh)
    assert profile is not None
    weights = linear_weights(target)
    floor, rate = read_floor_ms(weights)
    report = CostReport(
        params=sum(p.numel() for p in target.parameters()),
        weight_bytes=sum(p.numel() * p.element_size() for p in target.parameters()),
        floor_ms=floor, read_gb_per_s=rate,
        plan=options.linear_plan.describe() if options.linear_plan else "F.linear at every row count",
        rows=profile.rows, verify_ms=profile.ms, budget=costmodel.node_budget(profile))
    if draft is not None:
        dopts = resolve(EngineOptions(engine="hf"), draft)
        dkv = CachedModel(draft, vocab_size(target), cpu_linear=dopts.linear_plan or False)
        with torch.inference_mode():
            dprof: CostProfile | None = costmodel.profile_for(
                dkv, draft, "hf", False, False, None, dopts.linear_plan.bands if dopts.linear_plan else False,
                log=log, role="draft", refresh=refresh)
        if dprof is not None:
            report.draft_rows, report.draft_ms = dprof.rows, dprof.ms
    return report


def describe(report: CostReport) -> str:
    """The report as the markdown ``dynatree costs`` prints."""
    lines = [f"target: {report.params / 1e9:.2f}B parameters, {report.weight_bytes / 1e9:.2f} GB of weights",
             f"linear kernels: {report.plan}",
             f"floor: one read of the linear weights = {report.floor_ms:.1f} ms ({report.read_gb_per_s:.1f} GB/s measured)",
             "", "| rows verified | ms | x one row | x floor |", "|---|---|---|---|"]
    for r, m, x in zip(report.rows, report.verify_ms, report.ratios):
        lines.append(f"| {r} | {m:.1f} | {x:.2f} | {m / report.floor_ms:.2f} |")
    lines += ["", f"tree budget (DynaTree, DySpec): {report.budget} drafted nodes "
              f"(the most whose verify costs at most {tuning.BUDGET_STEP_COST} one-row steps)"]
    if report.draft_call_steps is not None:
        lines.append(f"draft model: a call costs {report.draft_call_steps:.2f} target steps "
                     f"({report.draft_ms[0]:.1f} ms for one row)")
    return "\n".join(lines)
