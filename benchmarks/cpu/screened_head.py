"""The screened head (greedy acceptance reads the LM head's argmax through an int8 copy, exact by a
bound) against the fp32 head: the head alone, then plain decoding and the default.

    python benchmarks/cpu/screened_head.py --out benchmarks/cpu/screened_head.jsonl

Part 1, the head alone: the final hidden states of Spec-Bench first turns decoded greedily
(``--head-prompts``, ``--head-tokens`` each) through the fp32 head's argmax (the engine's own
call, the plan's kernel for the head) and the screened one, alternating, each call after 400 MB
streamed through memory (in a step the head is read after every layer's weights, so it is not in
the cache); median ms, how many tokens each screen kept as candidates, and whether every argmax
agreed. Then a random head and hidden states of Qwen2.5-1.5B's head shape (151,936 x 1,536):
times only (random logits are flat: their candidate counts say nothing of a trained model's).

Part 2, decoding: Spec-Bench first turns (``--questions`` per task), ``--new`` tokens, on the aot
engine, plain decoding and the default, ``screened_head=False`` and the default (on) on each prompt
in turn, the order reversed from one prompt to the next, ``--passes`` passes; pooled tokens per
second per pass; every pair of outputs compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SHAPE_15B = (151936, 1536)


def _flush(junk: torch.Tensor) -> None:
    junk.add_(1.0)


def head_alone(target, tok, prompts, tokens: int, junk: torch.Tensor) -> dict:
    from dynatree.runtime.engines import cached_target, resolve
    from dynatree.runtime.kernels.screened_head import for_head
    import dynatree

    kv = cached_target(target, target.config.vocab_size, resolve(dynatree.EngineOptions(engine="hf"), target, tokens=8), 64)
    screen = for_head(kv.head, kv.vocab_size)
    times: dict[str, list[float]] = {"fp32": [], "screened": []}
    candidates, agree, total = [], 0, 0
    for ids in prompts:
        out = target.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, output_hidden_states=True,
                              return_dict_in_generate=True)
        for step in out.hidden_states:
            h = step[-1][0, -1:].contiguous()
            got = {}
            for name in (("fp32", "screened") if total % 2 == 0 else ("screened", "fp32")):
                _flush(junk)
                t = time.perf_counter()
                got[name] = int(kv.apply_head(h)[0, : kv.vocab_size].argmax()) if name == "fp32" else int(kv.head_argmax(h)[0])
                times[name].append(1e3 * (time.perf_counter() - t))
            candidates.append(int(screen.candidates(h)[0].numel()))
            agree += got["fp32"] == got["screened"]
            total += 1
    c = sorted(candidates)
    return {"rows": total, "agree": f"{agree} of {total}",
            "ms_median": {k: round(statistics.median(v), 3) for k, v in times.items()},
            "candidates": {"median": c[len(c) // 2], "p90": c[int(0.9 * (len(c) - 1))], "max": c[-1]}}


def head_15b(junk: torch.Tensor, reps: int) -> dict:
    from dynatree.runtime.kernels.screened_head import ScreenedHead, _exact

    g = torch.Generator().manual_seed(0)
    w = torch.randn(*SHAPE_15B, generator=g) * 0.02
    t = time.perf_counter()
    screen = ScreenedHead(w)
    build = time.perf_counter() - t
    t = time.perf_counter()
    exact = _exact(screen)
    check = time.perf_counter() - t
    times: dict[str, list[float]] = {"fp32": [], "screened": []}
    for r in range(reps):
        h = torch.randn(1, SHAPE_15B[1], generator=g)
        for name in (("fp32", "screened") if r % 2 == 0 else ("screened", "fp32")):
            _flush(junk)
            t = time.perf_counter()
            if name == "fp32":
                torch.mm(w, h.t()).argmax()
            else:
                screen.argmax(h, lambda rows: torch.nn.functional.linear(rows, w))
            times[name].append(1e3 * (time.perf_counter() - t))
    return {"shape": list(SHAPE_15B), "build_s": round(build, 2), "self_test_s": round(check, 2), "self_test": exact,
            "ms_median": {k: round(statistics.median(v), 3) for k, v in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--head-prompts", type=int, default=12)
    ap.add_argument("--head-tokens", type=int, default=24)
    ap.add_argument("--head-only", action="store_true", help="part 1 only")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.loading import models

    meta = record_meta(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    junk = torch.zeros(100 * (1 << 20))  # (400 MB)

    # 1. The head alone.
    head = head_alone(target, tok, prompts[: args.head_prompts], args.head_tokens, junk)
    print(json.dumps(head), flush=True)
    big = head_15b(junk, 20)
    print(json.dumps(big), flush=True)
    del junk
    if args.head_only:
        return

    # 2. Decoding.
    arms = {"fp32": dynatree.EngineOptions(engine="aot", screened_head=False), "screened": dynatree.EngineOptions(engine="aot")}
    for d in (None, draft):  # (packages, cost profiles, the screened copy: built or loaded outside the timing)
        for o in arms.values():
            dynatree.generate(target, d, list(range(100, 140)), max_new_tokens=4, options=o)
    modes = ("plain", "default")
    seconds = {(m, a): [0.0] * args.passes for m in modes for a in arms}
    tokens = {(m, a): [0] * args.passes for m in modes for a in arms}
    equal = total = 0
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            for mode in modes:
                outs = {}
                for name in (list(arms) if (p + j) % 2 == 0 else list(arms)[::-1]):
                    d = draft if mode == "default" else None
                    t = time.perf_counter()
                    out = dynatree.generate(target, d, list(ids), "autoregressive" if d is None else "dynatree",
                                            max_new_tokens=args.new, options=arms[name])
                    seconds[(mode, name)][p] += time.perf_counter() - t
                    outs[name] = out.sequences[0, len(ids):].tolist()
                    tokens[(mode, name)][p] += len(outs[name])
                equal += outs["fp32"] == outs["screened"]
                total += 1
        print(p, {f"{m}/{a}": round(tokens[(m, a)][p] / seconds[(m, a)][p], 2) for m, a in seconds}, flush=True)
    rates = {f"{m}/{a}": [tokens[(m, a)][p] / seconds[(m, a)][p] for p in range(args.passes)] for m, a in seconds}
    record = {"prompts": len(prompts), "new_tokens": args.new, "passes": args.passes, "engine": "aot",
              "head_alone": head, "head_qwen2.5-1.5b_shape_random": big,
              "pooled_tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "per_pass": {k: [round(x, 2) for x in v] for k, v in rates.items()},
              "screened_over_fp32": {m: [round(a / b, 3) for a, b in zip(rates[f"{m}/screened"], rates[f"{m}/fp32"])]
                                     for m in modes},
              "outputs_equal": f"{equal} of {total}", **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
