"""Batched runs for ``dynatree bench --batch-size``: total generated tokens per second by batch size.

Why a separate runner: the per-prompt bench (:mod:`dynatree.bench.runner`) times one prompt per
call and checks each against its own autoregressive output; a batch is one call over B prompts of
one task, so its unit is the batch. Each batch holds B consecutive prompts of one task
(Spec-Bench's task or an instruct category; any other set is one task), left-padded with their
attention mask, HF's layout. Per batch, every spec runs on the same ids: our batched
autoregressive decoding first (the reference), then the others; ``hf-generate`` is HF's own
batched greedy ``generate``. HF's prompt lookup and assisted generation refuse batches, so they are
skipped here with a note. MT-bench questions run their first turn only: a second turn would follow
each row's own first answer, which is the per-prompt bench's job.

Repetitions (``repeats``): every spec runs that many times per batch, interleaved (one pass of
all specs per repetition, the order rotated by one each pass, so no spec always runs right after
the same neighbour or first on a cold cache), and a spec's time is the median of its repetitions.
Why: on a shared or virtual machine one run's time moves by up to ~15% (measured on a 2-core
Intel VM: the same batch and plan took 13.3 s and 15.3 s), more than the differences a batch size's
table is read for; runs back to back in one process also drift with the machine's load, which
interleaving spreads over every spec alike. Each repetition's output is checked against the
reference's.

One JSON line per (batch size, task, spec): generated tokens, seconds, tokens per second, speedup
over our batched autoregressive decoding and over HF's batched ``generate`` of the same batch,
tokens per round, the rows whose output differs from the reference, peak memory of the call
(resident set on CPU, reset per call on Linux; allocated on a GPU). :func:`tables` gives Spec-Bench's layout per batch size: each spec's
speedup per task, then the mean over tasks.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dynatree.bench.runner import Prompt, draft_for
from dynatree.bench.specs import HF_NAMES, StrategySpec, format_spec
from dynatree.errors import DynaTreeError
from dynatree.loop.generate import generate
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.policies import make_policy

#: HF decoders that run batched; the others refuse a batch (assisted generation, prompt lookup)
HF_BATCHED = ("hf-generate",)


@dataclass(frozen=True)
class Batch:
    """B prompts of one task, as HF lays a batch out: left-padded ids and their attention mask."""

    task: str
    prompts: tuple[Prompt, ...]
    ids: torch.Tensor
    mask: torch.Tensor


def task_of(prompt: Prompt) -> str:
    """The task a prompt's id names: Spec-Bench's (``spec-bench:Q:category:tN:task``), an instruct
    category (``instruct:seed:i:category``), else the set's name."""
    parts = prompt.id.split(":")
    if parts[0] == "spec-bench" or parts[0].startswith("instruct"):
        return parts[-1]
    return parts[0]


def first_turns(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Spec-Bench's later turns dropped (they follow a row's own earlier answer)."""
    return [p for p in prompts if ":t" not in p.id or ":t1:" in p.id]


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's batch layout: ids left-padded to the longest prompt, and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[b, width - len(p):] = 1
    return ids, mask


def batches(prompts: Sequence[Prompt], size: int, pad_token_id: int) -> list[Batch]:
    """Per task in order of appearance, consecutive groups of ``size`` prompts (a short last group
    is left out: every batch of the table holds B rows)."""
    by_task: dict[str, list[Prompt]] = {}
    for p in first_turns(prompts):
        by_task.setdefault(task_of(p), []).append(p)
    out = []
    for task, group in by_task.items():
        for i in range(0, len(group) - size + 1, size):
            chunk = group[i:i + size]
            out.append(Batch(task, tuple(chunk), *left_pad([p.ids for p in chunk], pad_token_id)))
    if not out:
        raise DynaTreeError(f"no task has {size} prompts for a batch of {size}: raise --num-prompts "
                            f"(for spec-bench, questions per task) or lower --batch-size")
    return out


def parse_sizes(text: str) -> list[int]:
    """``"1,4,8"`` -> [1, 4, 8]; one clear error for anything else."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        raise DynaTreeError(f"--batch-size takes positive integers separated by commas, e.g. 4 or 1,4,8,16; got {text!r}")
    return sizes


def check_specs(specs: Sequence[StrategySpec]) -> tuple[list[StrategySpec], list[str]]:
    """(the specs that run batched, notes on those that cannot). Engine options a batch refuses
    (the static engine, compile, KV eviction) are refused by ``generate`` itself, in one line."""
    keep, notes = [], []
    for s in specs:
        if s.name in HF_NAMES and s.name not in HF_BATCHED:
            notes.append(f"{s.label}: skipped, HF's {s.name.removeprefix('hf-')} refuses batched inputs")
        elif s.text_cache is not None:
            notes.append(f"{s.label}: skipped, a cross-request text cache follows prompt order, not batches")
        else:
            keep.append(s)
    return keep, notes


def _reset_peak(device: torch.device) -> None:
    """Start a new peak: the GPU allocator's, or on Linux the process's resident peak (VmHWM;
    writing 5 to /proc/self/clear_refs resets it). Elsewhere the CPU peak stays the process's."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak(device: torch.device) -> float:
    """MB: allocated on the GPU, else resident (VmHWM since :func:`_reset_peak`, or ru_maxrss)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(target: torch.nn.Module, draft: torch.nn.Module | None, spec: StrategySpec, batch: Batch,
            max_new_tokens: int, pad_token_id: int, options: EngineOptions) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """(new tokens [B, <= max_new_tokens], seconds, extra fields) of one spec on one batch."""
    device = target.device
    ids, mask = batch.ids.to(device), batch.mask.to(device)
    _reset_peak(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    extra: dict[str, Any] = {}
    if spec.name == "hf-generate":
        with torch.inference_mode():
            seq = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                  min_new_tokens=0, pad_token_id=pad_token_id)
    else:
        out = generate(target, draft_for(spec, draft), ids, make_policy(spec.name, **spec.policy_options),
                                text=spec.source != "model", attention_mask=mask, max_new_tokens=max_new_tokens,
                                stopping=StoppingConfig(pad_token_id=pad_token_id),
                                options=spec.engine_options(options))
        seq = out.sequences
        stats = out.stats
        extra["tokens_per_round"] = stats.mean_committed
        if len(batch.prompts) > 1:
            extra.update(rounds=stats.num_rounds, t_realign=stats.t_realign, share_costs=stats.share_costs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    extra["peak_memory_mb"] = round(_peak(device), 1)
    return seq[:, ids.shape[1]:].cpu(), seconds, extra


def generated(new: torch.Tensor, pad_token_id: int) -> int:
    """Tokens generated in ``new`` (right-padded rows): up to and including each row's first pad
    token when the pad token is also what the row generated last (EOS used as pad)."""
    total = 0
    for row in new.tolist():
        total += row.index(pad_token_id) + 1 if pad_token_id in row else len(row)
    return total


def differs(a: torch.Tensor, b: torch.Tensor) -> int:
    """Rows of ``a`` that differ from ``b`` over the tokens both hold."""
    n = min(a.shape[1], b.shape[1])
    return int((a[:, :n] != b[:, :n]).any(dim=1).sum())


def run_batches(target: torch.nn.Module, draft: torch.nn.Module | None, prompts: Sequence[Prompt],
                specs: Sequence[StrategySpec], sizes: Sequence[int], *, max_new_tokens: int, pad_token_id: int,
                options: EngineOptions, output: Path, meta: dict[str, Any], repeats: int = 1,
                progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every spec on every batch of every size, ``repeats`` times interleaved (see the module
    docstring), one JSON line each (appended to ``output``); the first spec is the reference (our
    batched autoregressive decoding)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise DynaTreeError(f"repeats must be an integer >= 1, got {repeats!r}")
    rows: list[dict[str, Any]] = []
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "a") as fh:
        for size in sizes:
            for batch in batches(prompts, size, pad_token_id):
                # warm-up: the first call of a shape allocates (not recorded)
                warm = Batch(batch.task, batch.prompts, batch.ids[:, -8:], torch.ones_like(batch.mask[:, -8:]))
                for s in specs:
                    run_one(target, draft, s, warm, 2, pad_token_id, options)
                runs = interleaved(lambda s: run_one(target, draft, s, batch, max_new_tokens, pad_token_id, options),
                                   specs, repeats)
                ref_new = runs[specs[0].label][0][0]
                ref_s = median_seconds(runs[specs[0].label])
                hf = next((median_seconds(runs[s.label]) for s in specs if s.name == "hf-generate"), None)
                for s in specs:
                    mine = runs[s.label]
                    new, _, extra = mine[0]
                    sec = median_seconds(mine)
                    tokens = generated(new, pad_token_id)
                    row = {"kind": "batch", "label": s.label, "spec": format_spec(s.name, s.options), "task": batch.task, "batch_size": size,
                           "prompt_ids": [p.id for p in batch.prompts], "new_tokens": tokens, "seconds": round(sec, 4),
                           "tokens_per_second": tokens / sec, "speedup_vs_ar": ref_s / sec,
                           "speedup_vs_hf": None if hf is None else hf / sec,
                           "mismatched_rows": max(differs(out, ref_new) for out, _, _ in mine), **extra,
                           "repeats": repeats, "seconds_each": [round(x, 4) for _, x, _ in mine], **meta}
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    rows.append(row)
                    progress(f"B={size:<3d} {batch.task:16s} {s.label:18s} {row['tokens_per_second']:8.1f} tok/s "
                             f"x{row['speedup_vs_ar']:.2f} AR  mismatched rows {row['mismatched_rows']}")
    return rows


Run = tuple[torch.Tensor, float, dict[str, Any]]


def interleaved(run: Callable[[StrategySpec], Run], specs: Sequence[StrategySpec], repeats: int) -> dict[str, list[Run]]:
    """``run(spec)`` for every spec, ``repeats`` passes; pass ``k`` starts at spec ``k mod n`` (the
    order rotated by one each pass). Returns each spec's runs in pass order, by label."""
    runs: dict[str, list[Run]] = {s.label: [] for s in specs}
    n = len(specs)
    for k in range(repeats):
        for j in range(n):
            s = specs[(k + j) % n]
            runs[s.label].append(run(s))
    return runs


def median_seconds(runs: Sequence[Run]) -> float:
    """The median of the runs' seconds (the mean of the middle two for an even count)."""
    return float(statistics.median(x for _, x, _ in runs))


def tables(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown, one table per batch size: each spec's speedup per task (the mean over the task's
    batches) over our batched autoregressive decoding (and over HF's batched generate where it ran),
    the mean over tasks, total tokens per second (the mean over tasks), tokens per round, rows that
    differ from the reference, and the peak memory."""
    rows = [r for r in rows if r.get("kind") == "batch"]
    lines: list[str] = []
    for size in sorted({r["batch_size"] for r in rows}):
        at = [r for r in rows if r["batch_size"] == size]
        tasks = list(dict.fromkeys(r["task"] for r in at))
        labels = list(dict.fromkeys(r["label"] for r in at))
        has_hf = any(r["speedup_vs_hf"] is not None for r in at)
        unit = "over our batched autoregressive decoding" + (" / over HF's batched `generate`" if has_hf else "")
        lines += [f"**B = {size}**: speedup {unit}", "",
                  "| method | " + " | ".join(tasks) + " | mean | tok/s | τ | mismatched rows | peak MB |",
                  "|---" * (len(tasks) + 6) + "|"]
        for label in labels:
            mine = [r for r in at if r["label"] == label]
            cells, ar_means, hf_means, tps = [], [], [], []
            for t in tasks:
                rs = [r for r in mine if r["task"] == t]
                ar = sum(r["speedup_vs_ar"] for r in rs) / len(rs)
                ar_means.append(ar)
                tps.append(sum(r["tokens_per_second"] for r in rs) / len(rs))
                cell = f"{ar:.2f}"
                if has_hf:
                    hf = sum(r["speedup_vs_hf"] for r in rs) / len(rs)
                    hf_means.append(hf)
                    cell += f" / {hf:.2f}"
                cells.append(cell)
            mean = f"{sum(ar_means) / len(ar_means):.2f}" + (f" / {sum(hf_means) / len(hf_means):.2f}" if has_hf else "")
            rounds = [r["tokens_per_round"] for r in mine if r.get("tokens_per_round") is not None]
            tau = f"{sum(rounds) / len(rounds):.2f}" if rounds else "—"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | **{mean}** | {sum(tps) / len(tps):.1f} | {tau} | "
                         f"{sum(r['mismatched_rows'] for r in mine)} | {max(r['peak_memory_mb'] for r in mine):.0f} |")
        lines.append("")
    return "\n".join(lines)
