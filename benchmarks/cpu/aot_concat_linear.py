"""The aot engine's frozen package with the products of one input concatenated and serving from 3
rows, against the layout before (no concatenation, serving from where the plan packs): steps by
row count, prefills, then plain decoding and the default.

    python benchmarks/cpu/aot_concat_linear.py --out benchmarks/cpu/aot_concat_linear.jsonl

Each arm runs in its own worker process with the engine's settings (``aot_engine.FROZEN_INDUCTOR``,
``aot_engine.DYNAMIC_BY``) set, its own packages and cost profile (built or measured at its start,
outside the timing). Part 1: the target alone at 150 cached tokens, each row count of ``ROWS``
timed ``--reps`` times a round, and prefills of ``PREFILLS`` tokens, the arms alternating round by
round (``--rounds``), median ms. Part 2: Spec-Bench first turns (``--questions`` per task),
``--new`` tokens, plain decoding and the default; on each prompt in turn both arms, the order
reversed from one prompt to the next, ``--passes`` passes; pooled tokens per second per pass;
every output of both arms is compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
PREFILLS = (85, 256, 768)
ARMS = {"before": ({"freezing": True}, 1 << 30), "after": None}  # (None: the engine's own settings)


def worker(name: str, threads: int) -> None:
    """Serve one arm: JSON requests on stdin, one JSON answer a line on stdout."""
    import torch

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.loading import models
    from dynatree.runtime import aot_engine
    from dynatree.runtime.engines import cached_target, resolve

    if ARMS[name] is not None:
        aot_engine.FROZEN_INDUCTOR, aot_engine.DYNAMIC_BY = ARMS[name]
    target, _ = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    options = dynatree.EngineOptions(engine="aot")
    for d in (None, draft):  # (packages built or loaded, cost profiles measured)
        dynatree.generate(target, d, list(range(100, 140)), max_new_tokens=4, options=options)
    engine = resolve(options, target, tokens=8)
    kv = cached_target(target, target.config.vocab_size, engine, 1024)
    print(json.dumps({"inductor": aot_engine.FROZEN_INDUCTOR, "buckets": list(kv.buckets),
                      "dynamic_from": kv.build["dynamic_from"]}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["do"] == "steps":
            ms: dict[str, list[float]] = {}
            with torch.inference_mode():
                kv = cached_target(target, target.config.vocab_size, engine, 1024)
                kv.prefill(list(range(100, 250)))
                for n in ROWS:
                    visible = torch.ones(n, n, dtype=torch.bool).tril()
                    for _ in range(req["reps"]):
                        t = time.perf_counter()
                        kv.forward(list(range(300, 300 + n)), torch.arange(150, 150 + n), visible, 150)
                        ms.setdefault(f"rows {n}", []).append(1e3 * (time.perf_counter() - t))
                        kv.compact(150, [])
                for n in PREFILLS:
                    kv = cached_target(target, target.config.vocab_size, engine, n + 64)
                    t = time.perf_counter()
                    kv.prefill(list(range(100, 100 + n)), logits=True)
                    ms[f"prefill {n}"] = [1e3 * (time.perf_counter() - t)]
            print(json.dumps(ms), flush=True)
        else:
            d = draft if req["mode"] == "default" else None
            t = time.perf_counter()
            out = dynatree.generate(target, d, req["ids"], "autoregressive" if d is None else "dynatree",
                                    max_new_tokens=req["new"], options=options)
            seconds = time.perf_counter() - t
            print(json.dumps({"seconds": seconds, "tokens": out.sequences[0, len(req["ids"]):].tolist()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--worker", choices=list(ARMS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.loading import models

    meta = record_meta(args.threads)
    workers, layout = {}, {}
    for name in ARMS:  # (one at a time: a first build takes both cores)
        workers[name] = subprocess.Popen([sys.executable, __file__, "--worker", name, "--threads", str(args.threads)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        layout[name] = json.loads(workers[name].stdout.readline())

    def ask(name: str, request: dict) -> dict:
        workers[name].stdin.write(json.dumps(request) + "\n")
        workers[name].stdin.flush()
        return json.loads(workers[name].stdout.readline())

    # 1. Steps and prefills.
    times: dict[str, dict[str, list[float]]] = {name: {} for name in ARMS}
    for r in range(args.rounds):
        for name in (list(ARMS) if r % 2 == 0 else list(ARMS)[::-1]):
            for k, v in ask(name, {"do": "steps", "reps": args.reps}).items():
                times[name].setdefault(k, []).extend(v)
    step_ms = {name: {k: round(statistics.median(v), 2) for k, v in times[name].items()} for name in ARMS}
    print(json.dumps(step_ms), flush=True)

    # 2. Decoding with each.
    _, tok = models.load_model("smollm2-135m")
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    modes = ("plain", "default")
    seconds = {(m, a): [0.0] * args.passes for m in modes for a in ARMS}
    tokens = {(m, a): [0] * args.passes for m in modes for a in ARMS}
    equal = total = 0
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            for mode in modes:
                outs = {}
                for name in (list(ARMS) if (p + j) % 2 == 0 else list(ARMS)[::-1]):
                    answer = ask(name, {"do": "generate", "mode": mode, "ids": list(ids), "new": args.new})
                    seconds[(mode, name)][p] += answer["seconds"]
                    tokens[(mode, name)][p] += len(answer["tokens"])
                    outs[name] = answer["tokens"]
                equal += len({tuple(v) for v in outs.values()}) == 1
                total += 1
        print(p, {f"{m}/{a}": round(tokens[(m, a)][p] / seconds[(m, a)][p], 2) for m, a in seconds}, flush=True)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    rates = {f"{m}/{a}": [tokens[(m, a)][p] / seconds[(m, a)][p] for p in range(args.passes)] for m, a in seconds}
    record = {"prompts": len(prompts), "new_tokens": args.new, "passes": args.passes, "arms": layout,
              "step_ms_150_cached": step_ms,
              "pooled_tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "per_pass": {k: [round(x, 2) for x in v] for k, v in rates.items()},
              "after_over_before": {m: [round(a / b, 3) for a, b in zip(rates[f"{m}/after"], rates[f"{m}/before"])]
                                    for m in modes},
              "outputs_equal": f"{equal} of {total}", **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
