"""Where one round of the default goes on a GPU: draft calls, tree building, verify, accept,
compaction and the rest (Python), for the compiled static engine (issue 57, item 3).

    python benchmarks/gpu/profile_round.py --target FILE.gguf --device cuda --dtype bfloat16 --out DIR

Two passes over the same Spec-Bench first turns (one per task), after a warm-up that compiles:

1. **Phases.** The round's pieces are wrapped in timers that wait for the GPU before reading the
   clock (so each piece's time is its own, kernels included): the draft model's calls, the target's
   verify forward, acceptance, the target's KV compaction, the proposer's catch-up (``observe``:
   the draft cache brought in line, history adaptation). Tree building is the draft phase minus the
   draft model's calls. Plain autoregressive rounds are timed the same way beside them. The waits
   themselves cost a little, so the phases' sum is a bit above an unwrapped round; the shares are
   what the profile is for. Written to ``phases.json`` and ``phases.md``.
2. **Operators.** One generation under ``torch.profiler`` (CPU and CUDA), no wrappers: the top
   operators by self CPU time and by device time (``ops.txt``), and the device's busy time against
   the wall time (how much of a round the GPU idles while Python and launches run).

On a CPU (``--device cpu``, the test suite's smoke run) everything runs the same, minus CUDA.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch

import dynatree
from dynatree import TextDraft
from dynatree.bench import specbench_questions as sq
from dynatree.bench.sysinfo import provenance
from dynatree.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from dynatree.loading.models import load_model, parse_dtype, resolve_draft
from dynatree.loop import generate as loop
from dynatree.runtime.cache import CachedModel, StaticCachedModel
from dynatree.core.proposer import Proposer


class PhaseTimer:
    """Accumulates seconds per phase name; each timed call waits for the device before and after."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.depth = 0

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def wrap(self, owner: Any, attr: str, name: Callable[[Any], str] | str) -> Callable[[], None]:
        """Replace ``owner.attr`` by a timed version; returns the undo. Nested timed calls (a
        forward inside a phase already timed) count only in the outermost phase."""
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return original(*args, **kwargs)
            label = name(args[0]) if callable(name) else name
            self.depth += 1
            start = self.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += self.now() - start
                self.calls[label] += 1
                self.depth -= 1

        setattr(owner, attr, timed)
        return lambda: setattr(owner, attr, original)


def prompts(tok: Any, per_task: int) -> list[tuple[str, list[int]]]:
    """The first ``per_task`` first turns of each Spec-Bench task, chat-templated."""
    out = []
    for task, questions in sq.by_task(sq.load_questions()).items():
        for q in questions[:per_task]:
            out.append((task, sq._render(tok, [{"role": "user", "content": q.turns[0]}])))
    return out


def run_phases(target: torch.nn.Module, draft: Any, items: list[tuple[str, list[int]]], options: Any,
               max_new: int, device: torch.device) -> dict[str, Any]:
    """Both decoders over ``items`` with every phase wrapped; per-round means in milliseconds."""
    result = {}
    for label, source, strategy in (("ar", None, "autoregressive"), ("default", TextDraft(model=draft), "dynatree")):
        timer = PhaseTimer(device)
        model_of = lambda kv: "verify" if kv.model is target else "draft model"  # noqa: E731
        undo = [
            timer.wrap(StaticCachedModel, "_run", model_of),
            timer.wrap(CachedModel, "forward", model_of),
            timer.wrap(StaticCachedModel, "compact", lambda kv: "compact (target)" if kv.model is target else "compact (draft)"),
            timer.wrap(StaticCachedModel, "prefill", "prefill"),
            timer.wrap(CachedModel, "prefill", "prefill"),
            timer.wrap(loop, "greedy_accept", "accept"),
        ]
        # (each proposer class has its own observe: wrap every one that defines it)
        undo += [timer.wrap(c, "observe", "proposer observe") for c in _subclasses(Proposer) if "observe" in vars(c)]
        rounds, new, wall = [], 0, 0.0
        try:
            for _, ids in items:
                out = dynatree.generate(target, source, ids, strategy, max_new_tokens=max_new, options=options)
                rounds += out.stats.rounds
                new += out.stats.new_tokens
                wall += out.stats.t_total - out.stats.t_prefill
        finally:
            for u in undo:
                u()
        n = max(len(rounds), 1)
        t_draft = sum(r.t_draft for r in rounds) / n
        ms = {k: 1e3 * v / n for k, v in timer.seconds.items() if k != "prefill"}
        ms["round (loop's clock)"] = 1e3 * wall / n
        ms["draft phase (loop's clock)"] = 1e3 * t_draft
        ms["tree building (draft phase minus draft model)"] = max(1e3 * t_draft - ms.get("draft model", 0.0), 0.0)
        ms["verify phase (loop's clock)"] = 1e3 * sum(r.t_verify for r in rounds) / n
        ms["commit phase (loop's clock)"] = 1e3 * sum(r.t_commit for r in rounds) / n
        result[label] = {"rounds": len(rounds), "new_tokens": new, "tokens_per_round": new / n,
                         "ms_per_round": ms, "calls_per_round": {k: v / n for k, v in timer.calls.items()},
                         "ms_per_token": 1e3 * wall / max(new, 1)}
    return result


def _subclasses(cls: type) -> list[type]:
    """Every loaded subclass of ``cls``, however deep."""
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def run_ops(target: torch.nn.Module, draft: Any, ids: list[int], options: Any, max_new: int,
            device: torch.device, out: Path) -> dict[str, Any]:
    """One default generation under torch.profiler; the operator tables and the device's busy share."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        res = dynatree.generate(target, TextDraft(model=draft), ids, max_new_tokens=max_new, options=options)
    events = prof.key_averages()
    tables = [events.table(sort_by="self_cpu_time_total", row_limit=25)]
    busy_us = 0.0
    if device.type == "cuda":
        tables.append(events.table(sort_by="self_device_time_total", row_limit=25))
        busy_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
    (out / "ops.txt").write_text("\n\n".join(tables))
    wall = res.stats.t_total
    return {"rounds": res.stats.num_rounds, "new_tokens": res.stats.new_tokens, "wall_ms": 1e3 * wall,
            "device_busy_ms": busy_us / 1e3, "device_busy_share": (busy_us / 1e6) / wall if wall else None}


def markdown(meta: dict[str, Any], phases: dict[str, Any], ops: dict[str, Any]) -> str:
    lines = [f"# One round on {meta['device']} ({meta['dtype']}, static engine, compile={meta['compile']})", "",
             f"{meta['prompts']} Spec-Bench first turns, {meta['max_new_tokens']} new tokens each; ms per round, "
             "each piece timed with the device synchronised around it.", "",
             "| piece | default | ar |", "|---|---|---|"]
    keys = list(dict.fromkeys([*phases["default"]["ms_per_round"], *phases["ar"]["ms_per_round"]]))
    for k in keys:
        d, a = phases["default"]["ms_per_round"].get(k), phases["ar"]["ms_per_round"].get(k)
        lines.append(f"| {k} | {'' if d is None else f'{d:.3f}'} | {'' if a is None else f'{a:.3f}'} |")
    for k in ("tokens_per_round", "ms_per_token"):
        lines.append(f"| {k.replace('_', ' ')} | {phases['default'][k]:.3f} | {phases['ar'][k]:.3f} |")
    lines += ["", f"Under torch.profiler, one default generation: {ops['rounds']} rounds, wall {ops['wall_ms']:.1f} ms, "
              f"device busy {ops['device_busy_ms']:.1f} ms"
              + (f" ({100 * ops['device_busy_share']:.0f}% of the wall time)" if ops["device_busy_share"] else "")
              + "; operator tables in `ops.txt`.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--per-task", type=int, default=1, help="first turns per Spec-Bench task")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--buckets", default="1,16,64")
    ap.add_argument("--no-compile", action="store_true", help="the static engine uncompiled (the CPU smoke run)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    target, tok = load_model(args.target, device=args.device, dtype=parse_dtype(args.dtype))
    draft = resolve_draft(DEFAULT_DRAFT, target)
    options = dynatree.EngineOptions(engine="static", compile=not args.no_compile,
                                     buckets=tuple(int(b) for b in args.buckets.split(",")))
    items = prompts(tok, args.per_task)
    for strategy, source in (("autoregressive", None), ("dynatree", TextDraft(model=draft))):  # warm-up: compiles
        dynatree.generate(target, source, items[0][1], strategy, max_new_tokens=args.max_new_tokens, options=options)
    phases = run_phases(target, draft, items, options, args.max_new_tokens, device)
    ops = run_ops(target, draft, items[0][1], options, args.max_new_tokens, device, out)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": args.dtype,
            "compile": not args.no_compile, "prompts": len(items), "max_new_tokens": args.max_new_tokens,
            "buckets": args.buckets, **provenance()}
    (out / "phases.json").write_text(json.dumps({"meta": meta, "phases": phases, "ops": ops}, indent=1, default=str))
    (out / "phases.md").write_text(markdown(meta, phases, ops))
    print(markdown(meta, phases, ops))


if __name__ == "__main__":
    main()
