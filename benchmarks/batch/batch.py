"""Batched generation on Spec-Bench's questions (or the instruct sets): total generated tokens per second by batch size,
our batched decoding against HF's batched ``generate`` in ONE run (issue 39, item 6).

    python benchmarks/batch/batch.py [--batch-sizes 1,4,8,16] [--max-new-tokens 96] [--threads 2]
                                     [--variants hf,ar,text,hybrid] [--out batch.jsonl] [--label L]
    python benchmarks/batch/batch.py --table batch.jsonl [--label L]     # the markdown tables

Prompts: the first turns of Spec-Bench's questions (the question file ships in the package) in
SmolLM2's chat template; each batch holds B questions of ONE task (Spec-Bench reports per task),
questions 1..B of that task. ``--dataset instruct``: the project's six instruct sets instead (their
held-out prompts, B of one category per batch), which copy far more of the prompt. Per task and batch size every variant runs on the same batch, the
variants interleaved, ``--reps`` times (the best time is kept: a 2-core VM's background load only
ever slows a run). Variants:

* ``hf``: HF ``generate``, greedy, left-padded batch with its attention mask (the reference);
* ``ar``: ours, ``strategy="autoregressive"`` (plain batched decoding, our cache and mask);
* ``text``: ours, ``draft=None`` (each row drafts from its own text);
* ``hybrid``: ours, the shipped distilled draft and the text in one tree (the CLI's default);
* ``model``: ours, the shipped distilled draft alone, DynaTree's tree (``generate(target, draft, ids, text=False)``).

Every variant's sequences are compared with HF's: the count of rows that differ is recorded
(``mismatched_rows``). One JSON line per (task, batch size, variant): generated tokens, seconds,
tokens per second, speedup over ``ar`` and over ``hf`` of the same batch, tokens per round, peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

import dynatree
from dynatree import TextDraft
from dynatree.bench import specbench_questions as sq
from dynatree.bench.batches import differs, generated, left_pad
from dynatree.bench.instruct import CATEGORIES, instruct_prompts
from dynatree.bench.sysinfo import provenance
from dynatree.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from dynatree.loading.models import load_model, parse_dtype, resolve_draft


def table(path: str, label: str = "") -> str:
    """Spec-Bench's way, per batch size: each variant's speedup per task (over our batched
    autoregressive decoding, and over HF's batched generate), then the mean over tasks; plus total
    tokens per second averaged over tasks and the rows that differ from HF's."""
    rows = [json.loads(line) for line in open(path)]
    if label:
        rows = [r for r in rows if r.get("label") == label]
    lines = []
    for size in sorted({r["batch_size"] for r in rows}):
        at = [r for r in rows if r["batch_size"] == size]
        tasks = list(dict.fromkeys(r["task"] for r in at))
        variants = list(dict.fromkeys(r["variant"] for r in at))
        lines += [f"**B = {size}** (speedup over our batched autoregressive / over HF batched `generate`)", "",
                  "| variant | " + " | ".join(tasks) + " | mean | tok/s | mismatched rows |",
                  "|---" * (len(tasks) + 4) + "|"]
        for v in variants:
            cells, ar, hf = [], [], []
            for t in tasks:
                r = next(x for x in at if x["task"] == t and x["variant"] == v)
                ar.append(r["speedup_vs_ar"])
                hf.append(r["speedup_vs_hf"])
                cells.append(f"{r['speedup_vs_ar']:.2f} / {r['speedup_vs_hf']:.2f}")
            tps = sum(x["tokens_per_second"] for x in at if x["variant"] == v) / len(tasks)
            bad = sum(x["mismatched_rows"] or 0 for x in at if x["variant"] == v)
            lines.append(f"| {v} | " + " | ".join(cells) + f" | **{sum(ar) / len(ar):.2f} / {sum(hf) / len(hf):.2f}**"
                         f" | {tps:.1f} | {bad} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", help="print the markdown tables of this results file and exit")
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-prompt-tokens", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--variants", default="hf,ar,text,hybrid")
    ap.add_argument("--dataset", default="spec-bench", choices=["spec-bench", "instruct"],
                    help="Spec-Bench's first turns, or the project's six instruct sets (held-out prompts)")
    ap.add_argument("--tasks", default="", help="comma-separated tasks or instruct categories (default: all six)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("batch.jsonl")))
    ap.add_argument("--label", default="")
    ap.add_argument("--target", default=DEFAULT_TARGET, help="preset, local path or .gguf file")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="float32", help="float32 | float16 | bfloat16")
    args = ap.parse_args()
    if args.table:
        print(table(args.table, args.label))
        return
    torch.set_num_threads(args.threads)
    target, tok = load_model(args.target, device=args.device, dtype=parse_dtype(args.dtype))
    draft = resolve_draft(DEFAULT_DRAFT, target) if {"hybrid", "model"} & set(args.variants.split(",")) else None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tasks = sq.by_task(sq.load_questions()) if args.dataset == "spec-bench" else {c: None for c in CATEGORIES}
    wanted = [t for t in args.tasks.split(",") if t] or list(tasks)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    n = args.max_new_tokens

    def prompts_of(task: str, size: int) -> list[list[int]]:
        if tasks[task] is None:  # an instruct category
            out = instruct_prompts(task, tok, n=size, max_prompt_tokens=args.max_prompt_tokens)
            if len(out) < size:
                raise SystemExit(f"{task} has fewer than {size} prompts within {args.max_prompt_tokens} tokens")
            return out
        out = []
        for q in tasks[task]:
            ids = sq._render(tok, [{"role": "user", "content": q.turns[0]}])
            if len(ids) <= args.max_prompt_tokens:
                out.append(ids)
            if len(out) == size:
                return out
        raise SystemExit(f"task {task} has fewer than {size} questions within {args.max_prompt_tokens} tokens")

    cuda = torch.device(args.device).type == "cuda"

    def sync() -> None:  # GPU work is asynchronous: a time is only read once it has finished
        if cuda:
            torch.cuda.synchronize()

    def run(variant: str, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float, dict]:
        ids, mask = ids.to(args.device), mask.to(args.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        if variant == "hf":
            seq = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=0,
                                  pad_token_id=pad)
            sync()
            return seq.cpu(), time.perf_counter() - start, _gpu_peak(cuda)
        stopping = dynatree.StoppingConfig(pad_token_id=pad)
        if variant == "ar":
            out = dynatree.generate(target, None, ids, "autoregressive", attention_mask=mask, max_new_tokens=n,
                                    stopping=stopping)
        elif variant == "text":
            out = dynatree.generate(target, None, ids, attention_mask=mask, max_new_tokens=n, stopping=stopping)
        elif variant == "model":
            out = dynatree.generate(target, draft, ids, text=False, attention_mask=mask, max_new_tokens=n, stopping=stopping)
        else:
            out = dynatree.generate(target, TextDraft(model=draft), ids, attention_mask=mask, max_new_tokens=n,
                                    stopping=stopping)
        sync()
        elapsed = time.perf_counter() - start
        stats = out.stats if ids.shape[0] > 1 else None
        extra = {"tokens_per_round": out.stats.mean_committed, **_gpu_peak(cuda)}
        if stats is not None:
            extra.update(t_realign=stats.t_realign, t_verify=stats.summary()["t_verify"],
                         t_draft=stats.summary()["t_draft"], rounds=stats.num_rounds)
        return out.sequences.cpu(), elapsed, extra

    variants = args.variants.split(",")
    meta = {"label": args.label, "dataset": args.dataset, "threads": args.threads, "max_new_tokens": n,
            "device": torch.cuda.get_device_name(args.device) if cuda else "cpu", "dtype": args.dtype, **provenance()}
    with open(args.out, "a") as f:
        for size in sizes:
            for task in wanted:
                ids, mask = left_pad(prompts_of(task, size), 0)
                run("hf", ids[:, -8:], mask[:, -8:])  # (warm-up: first calls allocate)
                best: dict[str, tuple] = {}
                for _ in range(args.reps):
                    for v in variants:
                        seq, sec, extra = run(v, ids, mask)
                        if v not in best or sec < best[v][1]:
                            best[v] = (seq, sec, extra)
                ref = best["hf"][0] if "hf" in best else None
                for v in variants:
                    seq, sec, extra = best[v]
                    new = generated(seq[:, ids.shape[1]:], pad)
                    row = {"task": task, "batch_size": size, "variant": v, "new_tokens": new, "seconds": sec,
                           "tokens_per_second": new / sec,
                           "speedup_vs_ar": best["ar"][1] / sec if "ar" in best else None,
                           "speedup_vs_hf": best["hf"][1] / sec if "hf" in best else None,
                           "mismatched_rows": (None if ref is None else
                                               differs(seq[:, ids.shape[1]:], ref[:, ids.shape[1]:])),
                           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                           **extra, **meta}
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(f"B={size:2d} {task:22s} {v:7s} {row['tokens_per_second']:6.1f} tok/s "
                          f"x{row['speedup_vs_hf'] or 0:.2f} HF  x{row['speedup_vs_ar'] or 0:.2f} AR  "
                          f"L={extra.get('tokens_per_round', 1):.2f} mismatched={row['mismatched_rows']}", flush=True)


def _gpu_peak(cuda: bool) -> dict:
    """The GPU memory the call peaked at (MB), on a GPU."""
    return {"peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20} if cuda else {}


if __name__ == "__main__":
    main()
