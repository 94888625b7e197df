"""Batches on the aot engine against batches on the eager one (issue 55, item 5), same prompts,
interleaved, every row checked against HF greedy on its prompt alone.

    python benchmarks/cpu/aot_batch.py --out benchmarks/cpu/aot_batch.json

Spec-Bench first turns (``--questions`` per task), each to ``--new`` tokens (no EOS stop, so every
row decodes the same count), split into batches of ``--batch`` prompts. Decoders: our batched
autoregressive decoding and the default (draft model + text) on the eager engine (``engine="hf"``)
and on the aot engine (``engine="aot"``: its package of dynamic batches built or loaded first, the
time recorded), and our single-prompt autoregressive decoding on the aot engine (each prompt
alone), for reference. ``--passes`` passes, each running every decoder on each batch in turn (the
order reversed from batch to batch). Pooled rates: all tokens over all time, per pass; median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

#: decoder -> (engine, strategy, with the draft model, with the text, batched)
DECODERS = {"batch-autoregressive-hf": ("hf", "autoregressive", False, False, True),
            "batch-autoregressive-aot": ("aot", "autoregressive", False, False, True),
            "batch-default-hf": ("hf", "dynatree", True, True, True),
            "batch-default-aot": ("aot", "dynatree", True, True, True),
            "single-autoregressive-aot": ("aot", "autoregressive", False, False, False)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--questions", type=int, default=1, help="Spec-Bench questions per task (first turns)")
    ap.add_argument("--batch", type=int, nargs="+", default=[4])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import machine_info, provenance
    from dynatree.loading import models
    from dynatree.runtime import aot_batch, aot_engine
    from tqdm.auto import tqdm

    code = provenance().get("code")
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft("smollm2-135m-distilled", target)
    prompts = [ids for _, ids in specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)]
    no_eos = dynatree.StoppingConfig(eos_token_id=())
    eos, target.generation_config.eos_token_id = target.generation_config.eos_token_id, None  # (past EOS too)
    try:
        refs = [target.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                max_new_tokens=args.new, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
                for p in tqdm(prompts, desc="HF greedy references")]
    finally:
        target.generation_config.eos_token_id = eos
    assert all(len(r) == args.new for r in refs), "HF stopped early"
    t0 = time.perf_counter()
    dynatree.precompile(target, draft, 4096, dynatree.EngineOptions(engine="aot"))  # (single-prompt packages)
    aot_batch.prepare(target)  # (the batch package: built or loaded)
    ready_s = time.perf_counter() - t0

    def decode(name: str, batch: list[list[int]]) -> tuple[list[list[int]], float]:
        engine, strategy, model, text, batched = DECODERS[name]
        kw = dict(max_new_tokens=args.new, stopping=no_eos, text=text, options=dynatree.EngineOptions(engine=engine))
        t = time.perf_counter()
        if batched:
            out = dynatree.generate(target, draft if model else None, batch, strategy, **kw)
            width = max(map(len, batch))
            rows = [out.sequences[b, width : width + out.stats[b].new_tokens].tolist() for b in range(len(batch))]
        else:
            rows = [dynatree.generate(target, None, p, strategy, **kw).sequences[0, len(p):].tolist() for p in batch]
        return rows, time.perf_counter() - t

    records = []
    for size in args.batch:
        batches = [list(range(i, min(i + size, len(prompts)))) for i in range(0, len(prompts), size)]
        for name in DECODERS:  # (warm-up: first-use costs, the batch's share-cost timing)
            decode(name, [prompts[i] for i in batches[0]])
        bar = tqdm(total=args.passes * len(batches), desc=f"batches of {size}")
        for p in range(args.passes):
            for j, idx in enumerate(batches):
                order = list(DECODERS) if (p * len(batches) + j) % 2 == 0 else list(DECODERS)[::-1]
                for name in order:
                    rows, seconds = decode(name, [prompts[i] for i in idx])
                    records.append({"batch": size, "pass": p, "prompts": idx, "decoder": name,
                                    "tokens": sum(map(len, rows)), "seconds": round(seconds, 4),
                                    "equal": [r == refs[i] for r, i in zip(rows, idx)]})
                bar.update(1)
        bar.close()

    def pooled(size: int, name: str) -> list[float]:
        out = []
        for p in range(args.passes):
            rows = [r for r in records if r["batch"] == size and r["decoder"] == name and r["pass"] == p]
            out.append(sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows))
        return out

    rates = {str(size): {name: pooled(size, name) for name in DECODERS} for size in args.batch}
    result = {"machine": machine_info(), "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "code": code,
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "prompts": len(prompts), "new_tokens": args.new, "passes": args.passes, "ready_s": round(ready_s, 1),
              "package_build_s": [r.get("build_s") for r in aot_engine.loaded_records(target) if r.get("batch")],
              "pooled_tokens_per_second": {s: {k: round(statistics.median(v), 1) for k, v in d.items()}
                                           for s, d in rates.items()},
              "pooled_per_pass": {s: {k: [round(x, 1) for x in v] for k, v in d.items()} for s, d in rates.items()},
              "rows_equal_to_hf": {name: f"{sum(sum(r['equal']) for r in records if r['decoder'] == name)} of "
                                         f"{sum(len(r['equal']) for r in records if r['decoder'] == name)}"
                                   for name in DECODERS},
              "records": records}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("pooled_tokens_per_second", "rows_equal_to_hf", "ready_s",
                                             "package_build_s")}, indent=1))


if __name__ == "__main__":
    main()
