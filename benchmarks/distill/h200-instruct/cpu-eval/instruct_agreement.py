"""Instruct held-out agreement of several distilled drafts on ONE set of target labels (CPU).

    python benchmarks/distill/h200-instruct/cpu-eval/instruct_agreement.py --sequences 96 \
        --draft shipped --draft instruct=/tmp/instruct-draft \
        --labels /tmp/cpu-eval/labels --out benchmarks/distill/h200-instruct/cpu-eval/instruct.json

The held-out side exactly as the H200 run (``gpu_instruct.py``) labelled it, through the same call
(``dynatree.training.instruct.label_instruct_side``) and the run's data settings (corpora
pydoc,licences; 448 prompt tokens at most; 160 answer tokens at most; 25% of the answers sampled at
0.8; 10% follow-ups), only ``--sequences`` of them instead of 256 (``choose`` fills each kind's
quota from the front of that kind's shuffled pool, so the requests are a subset of the 256 drawn with
the same settings on this machine) and ``--gen-batch`` rows per labelling batch. Every draft is
scored teacher-forced by ``dynatree.training.features.evaluate_draft`` (``distill.evaluate``;
``evaluate_features`` on the target's features for a feature head) (overall and by kind).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch

from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.loading.models import load_model
from dynatree.training import instruct as I
from dynatree.training.config import DistillConfig
from dynatree.training.data import LabelledData, atomic_save
from dynatree.training.features import evaluate_draft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", action="append", default=[], help="NAME=FOLDER, or 'shipped'")
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--labels", type=Path, required=True, help="folder for the labelled data (cached)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    target, tok = load_model("smollm2-135m")
    # the H200 run's data settings (benchmarks/distill/h200-instruct/metrics.json "config")
    cfg = DistillConfig(data="instruct", eval_sequences=args.sequences, gen_batch=args.gen_batch,
                        max_prompt_tokens=448, answer_tokens=160, sample_fraction=0.25, sample_temperature=0.8,
                        followup_fraction=0.1, holdout_every=8, seed=0, top_k=8)
    work = args.labels / f"instruct-{args.sequences}"
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "eval.pt"
    t = time.time()
    meta = work / "label.json"
    if cache.is_file():
        evals = LabelledData(**torch.load(cache, weights_only=True))
        label_s = json.loads(meta.read_text())["label_seconds"] if meta.is_file() else None
    else:
        evals = I.label_instruct_side(target, tok, cfg, cfg.eval_sequences, True, work, progress=True)
        atomic_save(evals.as_dict(), cache)
        label_s = round(time.time() - t, 1)
        meta.write_text(json.dumps({"label_seconds": label_s}))
    kinds = Counter(I.KINDS[k] for k in evals.kind.tolist())
    gen = evals.generated_mask()
    gen_by_kind = {I.KINDS[k]: int(gen[evals.kind == k].sum()) for k in sorted(set(evals.kind.tolist()))}
    result = {"machine": f"{platform.processor() or platform.machine()}, {args.threads} torch thread(s), "
                         f"{platform.platform()}",
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": __import__("transformers").__version__},
              "config": asdict(cfg), "sequences": len(evals), "sequences_by_kind": dict(kinds),
              "generated_positions_by_kind": gen_by_kind,
              "labelled_positions": int(evals.valid.sum()), "label_seconds": label_s, "agreement": {}}
    for spec in args.draft or ["shipped"]:
        name, _, folder = spec.partition("=")
        draft = load_distilled_draft(target, folder or None)
        result["agreement"][name] = asdict(evaluate_draft(draft, evals, target))
        print(name, json.dumps(result["agreement"][name]), flush=True)
    result["wall_seconds"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
