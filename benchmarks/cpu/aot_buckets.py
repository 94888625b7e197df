"""The aot engine's fixed buckets, A against B: the default (draft model + text) and the text
alone, each on two bucket sets, same prompts, interleaved.

    python benchmarks/cpu/aot_buckets.py --a 1 2 4 8 16 --b 1 2 3 4 8 16 --out benchmarks/cpu/aot_buckets.jsonl

Why buckets matter: a tree of q rows runs on the smallest fixed bucket that holds it (padded),
or unpadded on the package of dynamic rows from the rows the kernel plan packs weights for; and
one product's cost jumps with its row count where BLAS changes kernels (on the 2-core Intel Xeon,
``F.linear`` over the embedded target's weights took 21.5 ms for 1-3 rows and 34 for 4). Both
sets' packages are built or loaded first, and each set's cost profile measured or read (its key
holds the buckets). Spec-Bench first turns (``--questions`` per task), ``--new`` tokens; each
decoder on each prompt in turn, the order reversed from one prompt to the next, ``--passes``
passes; pooled tokens per second per pass; every output of both sets compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=int, nargs="+", required=True)
    ap.add_argument("--b", type=int, nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

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
    sets = {"a": tuple(args.a), "b": tuple(args.b)}
    arms = [(d, s) for d in ("default", "text") for s in sets]

    def decode(arm: tuple[str, str], ids: list[int]) -> tuple[float, int, list[int]]:
        decoder, s = arm
        t = time.perf_counter()
        out = dynatree.generate(target, draft if decoder == "default" else None, ids, max_new_tokens=args.new,
                                options=dynatree.EngineOptions(engine="aot", buckets=sets[s]))
        return time.perf_counter() - t, out.sequences.shape[1] - len(ids), out.sequences[0].tolist()

    for arm in arms:  # (packages built or loaded, profiles measured or read)
        decode(arm, prompts[0])
    seconds = {arm: [0.0] * args.passes for arm in arms}
    tokens = {arm: [0] * args.passes for arm in arms}
    equal = 0
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            outs = {}
            for arm in (arms if (p + j) % 2 == 0 else arms[::-1]):
                s, n, outs[arm] = decode(arm, ids)
                seconds[arm][p] += s
                tokens[arm][p] += n
            equal += len({tuple(v) for v in outs.values()}) == 1
    rates = {f"{d}/{s}": [tokens[(d, s)][p] / seconds[(d, s)][p] for p in range(args.passes)] for d, s in arms}
    record = {"buckets": {k: list(v) for k, v in sets.items()}, "prompts": len(prompts), "new_tokens": args.new,
              "passes": args.passes,
              "pooled_tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "per_pass": {k: [round(x, 2) for x in v] for k, v in rates.items()},
              "b_over_a": {d: [round(b / a, 3) for a, b in zip(rates[f"{d}/a"], rates[f"{d}/b"])]
                           for d in ("default", "text")},
              "prompts_all_outputs_equal": f"{equal} of {len(prompts) * args.passes}", **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
