"""Fixed cost of a short call: two new tokens per ``dynatree.generate`` call, every strategy, against
HF's own ``generate`` on the same two tokens (issue 36, item 3).

    python benchmarks/cpu/per_call.py [--reps 300] [--threads 2] [--real] [--label L] [--out per_call.jsonl]

Short requests (chat turns, classification-style answers, many small calls in RL rollouts) pay
whatever a call spends before and after its rounds every time: option resolution, cache
construction, the policy and the draft source, the checks. On a tiny model, where a forward costs
under a millisecond, that setup is a visible share of a two-token call; the rest is the forwards
themselves, whose number each strategy's first round decides. The target is the test suite's tiny
random Llama (``tests/tiny.py``'s shape, built here so the script stands alone), the draft a copy
with noise on its weights; ``--real`` adds the embedded pair (``smollm2-135m`` and the shipped
distilled draft), where the model's time dominates. Results: ``per_call.jsonl`` (one line per run,
``--label`` says which code), summarised in this folder's README.

Every variant (each strategy greedy and sampled at temperature 1 with a seed; the text source,
``draft=None``; HF ``generate`` greedy and sampled) runs once per repetition, all interleaved in
one process, so background load hits them alike; reported: the median ms per call and its ratio
to HF's median in the same mode, in wall time and in the process's CPU time (with one torch thread
the CPU time is the work itself, which other processes on a busy machine cannot stretch; with
more, it also counts the intra-op threads' spinning), and the model forwards one call runs
(target and draft; HF's two tokens take two). Greedy outputs are checked equal to HF's.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import dynatree
from dynatree.bench.sysinfo import provenance
from dynatree.core.sampling import SamplingConfig

STRATEGIES = ("autoregressive", "linear", "fixed", "dynatree", "dyspec", "dyspec-threshold")
PROMPT = [5, 17, 42, 9, 77, 31, 12, 60, 8, 23, 51, 64, 3, 90, 44, 19]


def tiny_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """``tests/tiny.py``'s Llama (vocab 96, 2 layers, hidden 32; peaked by a large init) and a draft
    that agrees with it partly (Gaussian noise, 5% of each weight's std). No EOS, so every call
    writes exactly two tokens on both sides."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.5, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    target = LlamaForCausalLM(cfg).eval()
    torch.manual_seed(123)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.05 * (p.std() if p.numel() > 1 else 1.0))
    return target, draft.eval()


def real_pair() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """The CLI's default pair (``dynatree.cli.main.load_pair``): the embedded target and the shipped
    draft, and a short chat-like prompt."""
    from dynatree.catalog import DEFAULT_DRAFT
    from dynatree.loading import models

    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(DEFAULT_DRAFT, target, tokenizer=tok)
    target.generation_config.eos_token_id = None  # two tokens on both sides, whatever they are
    ids = tok("Question: is the sky blue on a clear day? Answer yes or no.\nAnswer:", return_tensors="pt").input_ids
    return target, draft, ids


def variants(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor):
    """(name, mode, call) for every variant; a call returns the new tokens."""
    mask = torch.ones_like(ids)
    out = []
    for mode in ("greedy", "sampled"):
        sampled = mode == "sampled"

        def hf(sampled=sampled):
            if sampled:
                torch.manual_seed(0)
            kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sampled else {"do_sample": False}
            seq = target.generate(ids, attention_mask=mask, max_new_tokens=2, pad_token_id=0, **kw)
            return seq[0, ids.shape[1]:].tolist()

        out.append(("hf generate", mode, hf))
        kw = {"sampling": SamplingConfig(temperature=1.0), "seed": 0} if sampled else {}
        for strategy in STRATEGIES:
            def call(strategy=strategy, kw=kw):
                return dynatree.generate(target, draft, ids, strategy, max_new_tokens=2, **kw).sequences[0, ids.shape[1]:].tolist()

            out.append((strategy, mode, call))

        def text(kw=kw):
            return dynatree.generate(target, None, ids, max_new_tokens=2, **kw).sequences[0, ids.shape[1]:].tolist()

        out.append(("text (draft=None)", mode, text))
    return out


def measure(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, reps: int, warmup: int) -> list[dict]:
    vs = variants(target, draft, ids)
    times: dict[tuple[str, str], list[float]] = {(n, m): [] for n, m, _ in vs}
    cpu: dict[tuple[str, str], list[float]] = {(n, m): [] for n, m, _ in vs}
    greedy: dict[str, list[int]] = {}
    with torch.no_grad():  # (HF's generate runs under no_grad itself; the same for all)
        for r in range(warmup + reps):
            order = vs if r % 2 == 0 else vs[::-1]  # alternate the order: no variant always first
            for name, mode, call in order:
                c0, t0 = time.process_time(), time.perf_counter()
                toks = call()
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                if r >= warmup:
                    times[(name, mode)].append(dt)
                    cpu[(name, mode)].append(dc)
                if mode == "greedy":
                    greedy[name] = toks
    forwards = count_forwards([target, draft], vs)
    ref = greedy["hf generate"]
    bad = {n: t for n, t in greedy.items() if t != ref}
    if bad:
        raise AssertionError(f"greedy outputs differ from HF's {ref}: {bad}")
    rows = [{"variant": name, "mode": mode, "ms": round(1e3 * statistics.median(v), 3),
             "cpu_ms": round(1e3 * statistics.median(cpu[(name, mode)]), 3), "forwards": forwards[(name, mode)]}
            for (name, mode), v in times.items()]
    base = {r["mode"]: r for r in rows if r["variant"] == "hf generate"}
    for r in rows:
        r["over_hf"] = round(r["ms"] / base[r["mode"]]["ms"], 2)
        r["cpu_over_hf"] = round(r["cpu_ms"] / base[r["mode"]]["cpu_ms"], 2)
    return rows


def count_forwards(models: list[torch.nn.Module], vs) -> dict[tuple[str, str], int]:
    """Model forwards (target and draft together) of one call of each variant, counted in a pass of
    its own (hooks slow every call a little): the floor a variant's time cannot go under."""
    n = [0]
    bodies = [getattr(m, "base_model", m) for m in models]  # (what both the LM and its body run through)
    hooks = [b.register_forward_pre_hook(lambda *_: n.__setitem__(0, n[0] + 1)) for b in bodies]
    out = {}
    try:
        with torch.no_grad():
            for name, mode, call in vs:
                n[0] = 0
                call()
                out[(name, mode)] = n[0]
    finally:
        for h in hooks:
            h.remove()
    return out


def table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    get = {(r["variant"], r["mode"]): r for r in rows}
    lines = ["| variant | greedy ms | / HF | CPU ms | / HF | forwards | sampled ms | / HF | CPU ms | / HF | forwards |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        cells = [f"{r['ms']:.2f} | {r['over_hf']:.2f}x | {r['cpu_ms']:.2f} | {r['cpu_over_hf']:.2f}x | {r['forwards']}"
                 for r in (get[(n, "greedy")], get[(n, "sampled")])]
        lines.append(f"| {n} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300, help="calls per variant (tiny pair)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--real", action="store_true", help="also the embedded pair (smollm2-135m + shipped draft)")
    ap.add_argument("--real-reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--label", default="", help="what code this is (e.g. before / after a change)")
    ap.add_argument("--note", default="", help="what else ran on the machine")
    ap.add_argument("--out", type=Path, default=None, help="JSONL file to append this run's record to")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record = {"label": args.label, "threads": torch.get_num_threads(), "when": started, "note": args.note,
              **provenance(), "reps": args.reps}
    rows = measure(*tiny_pair(), torch.tensor([PROMPT]), args.reps, args.warmup)
    print("tiny Llama pair (ms per two-token call, median):\n" + table(rows), flush=True)
    record["tiny"] = rows
    if args.real:
        rows = measure(*real_pair(), args.real_reps, 2)
        print("embedded pair:\n" + table(rows), flush=True)
        record["real"] = rows
        record["real_reps"] = args.real_reps
    if args.out:
        with args.out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
