"""An ahead-of-time compiled decoding step (AOTInductor), built once and loaded by a later process.

    python benchmarks/cpu/aoti_step.py --out benchmarks/cpu/aoti_step.jsonl [--rows 1] [--threads 2]

The question (issue 55): can a second process start a compiled step in seconds? A warm
``torch.compile`` still re-traces HF's modeling code with dynamo in every process (about 7 s a
graph on the 2-core EPYC, ``compile_cost.jsonl``). An AOTInductor package is traced once.

The step takes the engine's arguments: the tokens, a 4-D additive mask over the cache's columns
(any tree), positions, and the cache rows to write. The KV tensors are inputs it mutates. HF's
``StaticCache`` held as buffers fails to package with torch 2.13 and transformers 5.23 (a
functionalization assert at its ``cumulative_length``; transformers' own exportable module
fails the same way). The cache object handed to the model is therefore a minimal one,
``InputKV``: its ``update`` writes this call's keys and values at the given rows of
caller-owned tensors.

There are three variants: inductor's freezing off; freezing on; and our few-row kernel plan
traced into the graph (the export runs inside the engine's ``few_row_layout`` for the step's
rows, as our eager engine's calls do). For each, one child process exports and packages the
step, and one fresh child process loads the package. The loading process measures:
- the time to load;
- the largest logit and KV difference against the same step run eagerly over 40 tokens;
- the median step time of the package, HF's eager model, and our engine's eager verify of the
  same rows (``CachedModel`` with this machine's few-row kernel plan, ``costmodel.measure``: the
  fastest of 5).

The embedded target is used, fp32, with a 512-column cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CAP = 512


def _model():
    import torch

    from dynatree.loading import models

    model, _ = models.load_model("smollm2-135m")
    return model.eval(), torch


class InputKV:
    """The least of HF's cache interface a decoder layer calls: ``update`` writes this call's keys
    and values at ``rows`` of caller-owned tensors and returns the whole tensors."""

    is_compileable = True

    def __init__(self, ks, vs, rows):
        self.ks, self.vs, self.rows = ks, vs, rows

    def update(self, k, v, layer_idx, *args, **kwargs):
        self.ks[layer_idx].index_copy_(2, self.rows, k)
        self.vs[layer_idx].index_copy_(2, self.rows, v)
        return self.ks[layer_idx], self.vs[layer_idx]


def step_module(model, torch):
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, mask, pos, rows, ks, vs):
            h = self.model.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                 past_key_values=InputKV(ks, vs, rows), use_cache=True).last_hidden_state
            return self.model.lm_head(h)

    return Step()


def kv_tensors(model, torch):
    c = model.config
    shape = (1, c.num_key_value_heads, CAP, c.hidden_size // c.num_attention_heads)
    return [torch.zeros(shape) for _ in range(c.num_hidden_layers)], [torch.zeros(shape) for _ in range(c.num_hidden_layers)]


def step_inputs(torch, q, start, ks, vs):
    ids = torch.randint(0, 1000, (1, q), generator=torch.Generator().manual_seed(start))
    mask = torch.full((1, 1, q, CAP), float("-inf"))
    for r in range(q):
        mask[..., r, : start + r + 1] = 0.0
    return ids, mask, torch.arange(start, start + q).view(1, q), torch.arange(start, start + q), ks, vs


def build(path: str, rows: int, freeze: bool, plan: bool) -> dict:
    import contextlib

    from dynatree.runtime.cache import few_row_layout
    from dynatree.runtime.kernels.linear_plan import plan_for

    model, torch = _model()
    step = step_module(model, torch)
    ks, vs = kv_tensors(model, torch)
    layout = few_row_layout(plan_for(model), rows) if plan else contextlib.nullcontext()
    with torch.no_grad(), layout:
        t0 = time.perf_counter()
        ep = torch.export.export(step, step_inputs(torch, rows, 5, ks, vs), strict=False)
        t1 = time.perf_counter()
        torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs={"freezing": freeze})
        t2 = time.perf_counter()
    return {"export_s": round(t1 - t0, 1), "package_s": round(t2 - t1, 1), "package_mb": round(os.path.getsize(path) / 1e6)}


def load(path: str, rows: int, start: float) -> dict:
    model, torch = _model()
    from dynatree.core import costmodel
    from dynatree.runtime.cache import CachedModel, vocab_size
    from dynatree.runtime.kernels.linear_plan import plan_for

    t0 = time.perf_counter()
    runner = torch._inductor.aoti_load_package(path)
    t1 = time.perf_counter()
    step = step_module(model, torch)
    ka, va = kv_tensors(model, torch)
    kb, vb = kv_tensors(model, torch)
    with torch.no_grad():
        logit = 0.0
        for s in range(0, 40, rows):
            a = runner(*step_inputs(torch, rows, s, ka, va))
            b = step(*step_inputs(torch, rows, s, kb, vb))
            logit = max(logit, (a - b).abs().max().item())
        kv = max((x - y).abs().max().item() for x, y in zip(ka + va, kb + vb))
        aoti, eager = [], []
        for s in range(40, 40 + 20 * rows, rows):
            t = time.perf_counter()
            runner(*step_inputs(torch, rows, s, ka, va))
            aoti.append(time.perf_counter() - t)
            t = time.perf_counter()
            step(*step_inputs(torch, rows, s, kb, vb))
            eager.append(time.perf_counter() - t)
    engine = CachedModel(model, vocab_size(model), cpu_linear=plan_for(model))
    with torch.inference_mode():
        ours = costmodel.measure(engine, (rows,), lazy_head=False, reps=5).ms[0]
    aoti.sort()
    eager.sort()
    return {"start_to_model_s": round(t0 - start, 1), "load_s": round(t1 - t0, 2), "max_logit_diff": logit,
            "max_kv_diff": kv, "step_ms": round(1e3 * aoti[len(aoti) // 2], 1),
            "hf_eager_step_ms": round(1e3 * eager[len(eager) // 2], 1), "our_engine_step_ms": round(ours, 1)}


def main() -> None:
    start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--child", choices=("build", "load"), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--freeze", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plan", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        out = build(args.path, args.rows, args.freeze, args.plan) if args.child == "build" else load(args.path, args.rows, start)
        print("RESULT " + json.dumps(out), flush=True)
        return
    from dynatree.bench.sysinfo import provenance

    work = tempfile.mkdtemp(prefix="aoti-step-")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, "inductor")}  # (one, kept warm between processes)

    def child(*extra: str) -> dict:
        cmd = [sys.executable, __file__, "--rows", str(args.rows), "--threads", str(args.threads), *extra]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"child {' '.join(extra)} failed:\n{run.stderr[-3000:]}")
        return json.loads(line[len("RESULT "):])

    for freeze, plan in ((False, False), (True, False), (False, True)):
        path = os.path.join(work, f"step-{args.rows}-{int(freeze)}{int(plan)}.pt2")
        flag = ["--freeze"] * freeze + ["--plan"] * plan
        row = {"rows": args.rows, "freezing": freeze, "our_kernel_plan": plan, "threads": args.threads, "cache_columns": CAP,
               **child("--child", "build", "--path", path, *flag), **child("--child", "load", "--path", path),
               "date": time.strftime("%Y-%m-%d"), **provenance()}
        print(json.dumps({k: v for k, v in row.items() if k not in ("machine", "versions")}), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    main()
