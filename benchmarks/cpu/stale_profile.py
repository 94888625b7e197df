"""The default on the aot engine with a stale cost profile (one measured while something else ran)
against the profile measured on the idle machine: what ``costmodel.holds`` buys.

    python benchmarks/cpu/stale_profile.py --out benchmarks/cpu/stale_profile.jsonl

``--stale-target`` / ``--stale-draft``: the stale profiles (JSON files as the cost model saves
them; by default the embedded pair's, measured on the 2-core Intel Xeon on 2026-11-28 during an
OpenVINO export, kept in ``benchmarks/cpu/stale_profile/``). The fresh ones are this machine's
cached profiles, checked first (re-measured if they no longer hold). Spec-Bench first turns
(``--questions`` per task), ``--new`` tokens, both arms on each prompt in turn, the order reversed
from one prompt to the next, ``--passes`` passes; pooled tokens per second per pass; every output
of both arms compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

HERE = Path(__file__).with_name("stale_profile")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--stale-target", type=Path, default=HERE / "target-2026-11-28T1623.json")
    ap.add_argument("--stale-draft", type=Path, default=HERE / "draft-2026-11-28T1623.json")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import record_meta
    from dynatree.core import costmodel
    from dynatree.loading import models

    meta = record_meta(args.threads)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    opts = dynatree.EngineOptions(engine="aot")
    dynatree.generate(target, draft, prompts[0], max_new_tokens=4, options=opts)  # (fresh profiles: checked)
    stale = {role: costmodel.CostProfile.from_json(json.loads(path.read_text()))
             for role, path in (("target", args.stale_target), ("draft", args.stale_draft))}
    arm, real_load = {"now": "fresh"}, costmodel.load
    fresh = {}

    def load(key: dict) -> costmodel.CostProfile | None:
        role = key.get("role", "target")
        if arm["now"] == "stale":
            return stale[role]
        fresh[role] = real_load(key)
        return fresh[role]

    costmodel.load = load
    seconds = {"stale": [0.0] * args.passes, "fresh": [0.0] * args.passes}
    tokens = {"stale": [0] * args.passes, "fresh": [0] * args.passes}
    equal = 0
    for p in range(args.passes):
        for j, ids in enumerate(prompts):
            outs = {}
            for name in (("stale", "fresh") if (p + j) % 2 == 0 else ("fresh", "stale")):
                arm["now"] = name
                t = time.perf_counter()
                out = dynatree.generate(target, draft, ids, max_new_tokens=args.new, options=opts)
                seconds[name][p] += time.perf_counter() - t
                tokens[name][p] += out.sequences.shape[1] - len(ids)
                outs[name] = out.sequences[0].tolist()
            equal += outs["stale"] == outs["fresh"]
    rates = {name: [tokens[name][p] / seconds[name][p] for p in range(args.passes)] for name in seconds}
    record = {"prompts": len(prompts), "new_tokens": args.new, "passes": args.passes,
              "pooled_tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "per_pass": {k: [round(x, 2) for x in v] for k, v in rates.items()},
              "fresh_over_stale": [round(f / s, 3) for f, s in zip(rates["fresh"], rates["stale"])],
              "outputs_equal": f"{equal} of {len(prompts) * args.passes}",
              "profiles_ms": {"stale": {r: [round(x, 1) for x in p.ms] for r, p in stale.items()},
                              "fresh": {r: [round(x, 1) for x in p.ms] for r, p in fresh.items() if p is not None}},
              "rows": {r: list(p.rows) for r, p in stale.items()}, **meta}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
