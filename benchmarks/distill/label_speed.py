"""Labelled positions per second: today's continuation labeller against the batched instruct one.

    python benchmarks/distill/label_speed.py --threads 2 --prompts 128 --out label_speed.json

Both on the same target in one process, interleaved (continuation batch, instruct batch, ...), so
a busy machine slows both alike. Continuation: 96-token prose windows continued for 64 greedy
tokens, 32 per batch (``data.label_batch``, what ``dynatree distill`` ran so far). Instruct:
chat-templated requests of the training side (``instruct.choose``), left-padded batches of
``--gen-batch`` requests of about one length (consecutive in a length-sorted pool of ``--pool``, at
evenly spaced quantiles, as a real run's sorted batches are), answers of up to ``--answer-tokens`` tokens, finished rows
leaving the batch (``instruct.generate_batch``). "positions" are labelled (valid) positions;
"generated" are the positions that predict a target-written token, what a draft is scored on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from collections import Counter
from pathlib import Path

import torch

from dynatree.loading.models import load_model
from dynatree.training import data as D
from dynatree.training import instruct as I
from dynatree.training.config import DistillConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=64, help="prompts of each kind")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--pool", type=int, default=1024, help="requests the instruct batches are drawn from")
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=448)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = load_model(args.target, device=args.device)
    cfg = DistillConfig(data="instruct", gen_batch=args.gen_batch, answer_tokens=args.answer_tokens,
                        max_prompt_tokens=args.max_prompt_tokens)
    cont_cfg = dataclasses.replace(cfg, data="continuation", corpora="pydoc,licences", seq_len=160,
                                   train_sequences=args.prompts, eval_sequences=8)
    windows = D.build_prompts(tok, D.documents_for("pydoc,licences"), cont_cfg).train
    # a real run sorts thousands of requests by length, so its batches hold prompts of about one
    # length: batches of consecutive requests at evenly spaced quantiles of a large pool do too
    requests = I.choose(tok, I.examples(cfg, held_out=False), args.pool, cfg.max_prompt_tokens, "training")
    temps = I.temperatures(len(requests.ids), cfg, "speed")
    by_length = sorted(range(len(requests.ids)), key=lambda i: len(requests.ids[i]))
    n_batches = max(1, args.prompts // args.gen_batch)
    starts = [round(j * (len(by_length) - args.gen_batch) / max(1, n_batches - 1)) for j in range(n_batches)]
    order = [i for s in starts for i in by_length[s:s + args.gen_batch]]
    eos = I.eos_ids(target, tok)
    totals = {k: {"seconds": 0.0, "positions": 0, "generated": 0, "sequences": 0} for k in ("continuation", "instruct")}
    for b in range(0, args.prompts, args.gen_batch):
        t0 = time.perf_counter()
        part = D.label_batch(target, windows[b:b + 32], cont_cfg.new_tokens, cfg.top_k, tok.eos_token_id)
        t = totals["continuation"]
        t["seconds"] += time.perf_counter() - t0
        t["positions"] += int(part["valid"].sum())
        t["generated"] += int(part["valid"][:, cont_cfg.prompt_tokens - 1:].sum())
        t["sequences"] += len(part["valid"])
        rows = order[b:b + args.gen_batch]
        t0 = time.perf_counter()
        part = I.generate_batch(target, [requests.ids[r] for r in rows], new_tokens=cfg.answer_tokens,
                                top_k=cfg.top_k, eos=eos, pad_id=tok.pad_token_id, temperatures=[temps[r] for r in rows])
        t = totals["instruct"]
        t["seconds"] += time.perf_counter() - t0
        width = part["tokens"].shape[1] - cfg.answer_tokens
        t["positions"] += int(part["valid"].sum())
        t["generated"] += int(part["valid"][:, width - 1:].sum())
        t["sequences"] += len(rows)
        print(json.dumps({k: {**v, "per_s": round(v["positions"] / max(v["seconds"], 1e-9), 1),
                              "generated_per_s": round(v["generated"] / max(v["seconds"], 1e-9), 1)}
                          for k, v in totals.items()}), flush=True)
    record = {"machine": platform.processor() or platform.machine(), "threads": args.threads,
              "load_average": os.getloadavg(), "device": args.device, "gen_batch": args.gen_batch,
              "answer_tokens": args.answer_tokens, "kinds": dict(Counter(requests.examples[i].kind for i in order)),
              "prompt_tokens": {"min": min(len(requests.ids[i]) for i in order),
                                "max": max(len(requests.ids[i]) for i in order)},
              **{k: {**v, "per_s": round(v["positions"] / v["seconds"], 1),
                     "generated_per_s": round(v["generated"] / v["seconds"], 1)} for k, v in totals.items()}}
    print(json.dumps(record, indent=1))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
