"""Where one autoregressive step of the embedded target goes on this CPU (issue 37, item 4).

    python benchmarks/cpu/step_cost.py [--threads 1 2] [--steps 48] [--out benchmarks/cpu/step_cost.jsonl]

For each thread count, on SmolLM2-135M-Instruct in fp32 (the CLI's default target), after a
64-token prompt:

* ``bound_ms``: the memory-bandwidth floor of a step, the weights a step must read (every linear
  layer and the LM head; the embedding row is negligible) over the read bandwidth measured here
  (``x.sum()`` over 1 GiB, best of 5);
* ``kernels_ms``: the matrix-vector products alone: each of the step's linear layers timed on its
  own with one row (best of 7, interleaved), summed: what the BLAS kernels need for the step;
* ``hf_ms``: HF's own one-token forward with its ``DynamicCache`` (median of ``--steps``);
* ``ours_ms``: our autoregressive decoding's target forward per round (``dynatree.generate(...,
  "autoregressive")``'s ``t_verify``, median), and ``ours_token_ms`` its whole round (forward,
  acceptance, cache bookkeeping);
* the profiler's split of an HF step: matrix products (``aten::mm``/``addmm``), attention
  (``scaled_dot_product_attention``), and the rest (norms, RoPE, cache concatenation, views: the
  small ops, dispatched one by one from Python).

The gap between ``hf_ms`` and ``kernels_ms`` is what the modeling code and the framework spend
around the kernels; the gap between ``kernels_ms`` and ``bound_ms`` is the kernels' own distance to
the memory bandwidth. Results: ``step_cost.jsonl`` (one line per run), summarised in this folder's
README.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def bandwidth_gbs(reps: int = 5) -> float:
    x = torch.ones(256 * 1024 * 1024)  # 1 GiB of float32
    x.sum()
    best = min(_timed(x.sum) for _ in range(reps))
    return x.numel() * x.element_size() / best / 1e9


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def step_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weight matrices one decoding step multiplies by: every Linear's (the tied LM head
    included once)."""
    seen, out = set(), []
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            out.append(m.weight.detach())
    return out


def kernels_ms(weights: list[torch.Tensor], reps: int = 7) -> float:
    """Sum over the step's matrices of the best one-row F.linear time (rounds interleaved)."""
    rows = {id(w): torch.randn(1, w.shape[1]) for w in weights}
    best = {id(w): float("inf") for w in weights}
    with torch.inference_mode():
        for _ in range(reps):
            for w in weights:
                best[id(w)] = min(best[id(w)], _timed(F.linear, rows[id(w)], w))
    return 1e3 * sum(best.values())


def hf_step_ms(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> tuple[float, dict[str, float]]:
    """Median ms of HF's one-token forward with a DynamicCache, and a profiler split of 10 steps."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                out = model(nxt, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
    total = mm = attn = 0.0
    for e in prof.key_averages():
        total += e.self_cpu_time_total
        if e.key in ("aten::mm", "aten::addmm", "aten::bmm"):
            mm += e.self_cpu_time_total
        elif "scaled_dot_product" in e.key:
            attn += e.self_cpu_time_total
    split = {"matmul": mm / total, "attention": attn / total, "other": (total - mm - attn) / total}
    return 1e3 * statistics.median(times), split


def ours_ms(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> tuple[float, float]:
    import dynatree
    from dynatree.options import StoppingConfig

    kw = dict(max_new_tokens=steps, stopping=StoppingConfig(eos_token_id=()))
    dynatree.generate(model, None, ids, "autoregressive", **kw)  # warm-up (and the measured plan)
    r = dynatree.generate(model, None, ids, "autoregressive", **kw)
    rounds = r.stats.rounds[1:]
    return (1e3 * statistics.median(x.t_verify for x in rounds),
            1e3 * statistics.median(x.t_draft + x.t_verify + x.t_commit for x in rounds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from dynatree.bench.sysinfo import provenance
    from dynatree.loading import models

    model, tok = models.load_model("smollm2-135m")
    text = "Explain the difference between a list and a tuple in Python, with two short examples of each. " * 3
    ids = tok(text, return_tensors="pt").input_ids[:, :64]
    weights = step_weights(model)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "note": args.note, **provenance(),
              "model": "smollm2-135m fp32", "prompt_tokens": int(ids.shape[1]), "weight_mb": round(weight_bytes / 1e6, 1),
              "runs": []}
    for threads in args.threads:
        torch.set_num_threads(threads)
        bw = bandwidth_gbs()
        hf, split = hf_step_ms(model, ids, args.steps)
        ours, ours_token = ours_ms(model, ids, args.steps)
        row = {"threads": threads, "bandwidth_gbs": round(bw, 2), "bound_ms": round(weight_bytes / bw / 1e6, 2),
               "kernels_ms": round(kernels_ms(weights), 2), "hf_ms": round(hf, 2), "ours_ms": round(ours, 2),
               "ours_token_ms": round(ours_token, 2), "hf_profile_split": {k: round(v, 3) for k, v in split.items()}}
        record["runs"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with args.out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
