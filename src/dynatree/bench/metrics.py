"""Pure functions from result rows to the numbers in every table (no I/O, no torch).

Definitions:

* throughput = generated tokens / wall time of the whole generate call (prefill included, warm-up
  runs excluded); aggregated as mean ± sample std (ddof = 1) over prompts;
* speedup = mean throughput / mean autoregressive throughput *of the same run group* (the papers'
  TPS / TPS_AR); the per-prompt ratio is reported too (``speedup_per_prompt``). A group with
  several autoregressive baselines (say HF eager and compiled static) takes the first as *the*
  reference and also gives the ratio over each of them (``speedups``, keyed by baseline label);
* L = committed tokens per round (accepted drafted tokens + bonus, after EOS / length truncation);
  ℓ = accepted drafted tokens per round; acceptance = accepted / drafted nodes (≤ 1);
* ``paper_acceptance``: the papers' "acceptance" that can exceed 100 % -- back-calculated in
  the DynaTree paper as ℓ̄_paper / K for linear and ℓ̄_paper / (D + 2) for trees (D = fixed depth, or
  DynaTree's D_0), where the papers' ℓ̄ evidently counts the bonus token, i.e.
  ℓ̄_paper = mean over rounds of (ℓ + 1). Labelled as the papers' definition wherever shown;
* TTFT = start of generate -> first committed token (prefill of both models + first round);
  TPOT = (total − TTFT) / (new tokens − 1);
* time split = prefill / draft / verify / commit / other (other = total − the four).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = Mapping[str, Any]
AR = "autoregressive"
TIME_PARTS = ("prefill", "draft", "verify", "commit", "other")


@dataclass(frozen=True)
class Agg:
    """Mean ± sample std over n values (std 0 for a single value)."""

    mean: float
    std: float
    n: int

    def fmt(self, digits: int = 1, scale: float = 1.0, pct: bool = False) -> str:
        if pct:
            return f"{self.mean * 100:.{digits}f}% ± {self.std * 100:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.std * scale:.{digits}f}"


def mean_std(values: Iterable[float | None]) -> Agg | None:
    """Mean and sample standard deviation of the non-null values; None if there are none."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return Agg(m, sd, len(xs))


def paper_acceptance_denominator(strategy: str, config: Mapping[str, Any]) -> int | None:
    """K for linear, D + 2 for the fixed tree (D = depth) and DynaTree (D = D_0); None otherwise."""
    if strategy == "linear":
        return int(config["k"])
    if strategy == "fixed":
        return int(config["depth"]) + 2
    if strategy == "dynatree":
        return int(config["d0"]) + 2
    return None


def paper_path_length(per_round: Sequence[Mapping[str, Any]]) -> float | None:
    """The papers' ℓ̄: accepted drafted tokens + the bonus token, averaged over rounds."""
    acc = [r["accepted"] for r in per_round if r.get("accepted") is not None]
    return sum(a + 1 for a in acc) / len(acc) if acc else None


def row_metrics(row: Row) -> dict[str, float | None]:
    """Per-prompt numbers of one row (None where the strategy cannot report them)."""
    s = row["stats"]
    per_round = row.get("per_round") or []
    ell_paper = paper_path_length(per_round)
    denom = paper_acceptance_denominator(row["strategy"], row.get("config") or {})
    total = s.get("t_total")
    parts = {p: s.get(f"t_{p}") for p in TIME_PARTS[:-1]}
    known = total is not None and all(v is not None for v in parts.values())
    drafting = row["strategy"] != AR
    return {
        "throughput": s.get("tokens_per_second"),
        "new_tokens": s.get("new_tokens"),
        "rounds": s.get("rounds"),
        "L": s.get("mean_committed"),
        "ell": s.get("mean_accepted") if drafting else None,
        "acceptance": s.get("acceptance") if drafting else None,
        "paper_path_length": ell_paper if denom else None,
        "paper_acceptance": ell_paper / denom if (ell_paper is not None and denom) else None,
        "drafted": s.get("mean_drafted") if drafting else None,
        "depth": s.get("mean_depth") if drafting else None,
        "draft_calls": s.get("draft_calls") if drafting else None,
        "budget": s.get("budget") if drafting else None,  # cost-model nodes per round (auto budget only)
        "ttft": s.get("ttft"),
        "tpot": s.get("tpot"),
        "t_total": total,
        **{f"t_{p}": v for p, v in parts.items()},
        "t_other": total - sum(parts.values()) if known else None,  # type: ignore[arg-type,operator]
        "peak_memory_mb": row.get("peak_memory_mb"),
    }


@dataclass
class Summary:
    """One strategy (label) in one run group, aggregated over its prompts."""

    group: str
    label: str
    strategy: str
    settings: dict[str, Any]
    config: dict[str, Any]
    options: dict[str, Any]
    prompts: int
    metrics: dict[str, Agg | None]
    speedup: float | None  # mean TPS / mean TPS_AR of the same group
    speedup_per_prompt: Agg | None  # mean ± std of per-prompt ratios
    memory_change: float | None  # relative peak-memory change vs AR (CUDA figure meaningful)
    mismatches: int  # prompts whose greedy output differs from AR's
    sessions: int  # processes the group's rows came from (1 = one run, fully comparable)
    memory_kind: str | None = None
    time_split: dict[str, float] = field(default_factory=dict)  # share of total time per part
    speedups: dict[str, float | None] = field(default_factory=dict)  # over every AR baseline, by its label
    reference: bool = False  # this is the group's reference autoregressive run

    def get(self, name: str) -> Agg | None:
        return self.metrics.get(name)


def group_rows(rows: Iterable[Row]) -> dict[str, dict[str, list[Row]]]:
    """group -> label -> rows, preserving first-seen order."""
    out: dict[str, dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[r["group"]][r["label"]].append(r)
    return out


def summarize(rows: Iterable[Row]) -> list[Summary]:
    """Aggregate rows per (run group, label); speedups against that group's autoregressive rows."""
    out: list[Summary] = []
    for group, by_label in group_rows(rows).items():
        baselines = {lab: mean_std(row_metrics(r)["throughput"] for r in rs)
                     for lab, rs in by_label.items() if rs[0]["strategy"] == AR}
        ref_label = next(iter(baselines), None)
        ar_rows = by_label[ref_label] if ref_label is not None else []
        ar_tps = {r["prompt_id"]: row_metrics(r)["throughput"] for r in ar_rows}
        ar_mean = mean_std(ar_tps.values())
        ar_mem = mean_std(r.get("peak_memory_mb") for r in ar_rows)
        sessions = len({r.get("session") for rs in by_label.values() for r in rs})
        for label, rs in by_label.items():
            per = [row_metrics(r) for r in rs]
            metrics = {k: mean_std(p[k] for p in per) for k in per[0]}
            tps = metrics["throughput"]
            speedup = tps.mean / ar_mean.mean if (tps and ar_mean and ar_mean.mean > 0) else None
            ratios = [
                p["throughput"] / ar_tps[r["prompt_id"]]
                for p, r in zip(per, rs)
                if ar_tps.get(r["prompt_id"]) and p["throughput"] is not None
            ]
            mem = metrics["peak_memory_mb"]
            total = metrics["t_total"]
            split = {}
            if total and total.mean > 0:
                for part in TIME_PARTS:
                    agg = metrics[f"t_{part}"]
                    if agg is not None:
                        split[part] = agg.mean / total.mean
            out.append(
                Summary(
                    group=group, label=label, strategy=rs[0]["strategy"], settings=dict(rs[0]["settings"]),
                    config=dict(rs[0].get("config") or {}), options=dict(rs[0].get("options") or {}),
                    prompts=len(rs), metrics=metrics, speedup=speedup,
                    speedup_per_prompt=mean_std(ratios),
                    memory_change=(mem.mean / ar_mem.mean - 1) if (mem and ar_mem and ar_mem.mean > 0) else None,
                    mismatches=sum(1 for r in rs if r.get("greedy_match") is False),
                    sessions=sessions, memory_kind=rs[0].get("memory_kind"), time_split=split,
                    speedups={b: (tps.mean / agg.mean if (tps and agg and agg.mean > 0) else None)
                              for b, agg in baselines.items()},
                    reference=label == ref_label,
                )
            )
    return out


def cost_profiles(rows: Iterable[Row]) -> dict[str, dict[str, Any]]:
    """The verify-cost profile recorded per label (the first row that has one)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        prof = (r.get("stats") or {}).get("cost_profile")
        if prof and r["label"] not in out:
            out[r["label"]] = prof
    return out


def committed_per_round(rows: Iterable[Row]) -> list[int]:
    """All rounds' committed-token counts (the tokens-per-round histogram)."""
    return [int(pr["committed"]) for r in rows for pr in (r.get("per_round") or []) if "committed" in pr]


def varying_options(summaries: Sequence[Summary]) -> list[str]:
    """Config fields whose values differ among ``summaries`` (the swept parameters), in config order."""
    if not summaries:
        return []
    keys = list(summaries[0].config)
    return [k for k in keys if len({repr(s.config.get(k)) for s in summaries}) > 1]
