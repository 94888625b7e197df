"""Score a draft on the held-out labels of a distillation run, even one still labelling.

    python benchmarks/distill/score_partial.py --run /work/distill-run --corpora pydoc,licences,wiki,books \
        --train-sequences 2048 --eval-sequences 128 [--draft DIR]

Reads ``eval.partial.pt`` (written first by ``dynatree distill``) or the finished ``data.pt`` and
prints the teacher-forced agreement of the draft (default: the shipped one) with the target's
greedy continuations of held-out documents, split by chat/raw prompts.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from dynatree.training.distill import evaluate
from dynatree.training.config import DistillConfig
from dynatree.training.data import LabelledData, build_prompts, documents_for
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.loading.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--draft", type=Path, default=None)
    ap.add_argument("--corpora", default=DistillConfig.corpora)
    ap.add_argument("--train-sequences", type=int, default=DistillConfig.train_sequences)
    ap.add_argument("--eval-sequences", type=int, default=DistillConfig.eval_sequences)
    args = ap.parse_args()
    cfg = DistillConfig(corpora=args.corpora, train_sequences=args.train_sequences,
                        eval_sequences=args.eval_sequences)
    target, tok = load_model("smollm2-135m")
    if (args.run / "data.pt").is_file():
        evals = LabelledData(**torch.load(args.run / "data.pt", weights_only=True)["eval"])
    else:
        saved = torch.load(args.run / "eval.partial.pt", weights_only=True)
        assert saved["key"] == json.dumps({**cfg.data_key(), "gen_batch": cfg.gen_batch}), "settings differ from the run's"
        prompts = build_prompts(tok, documents_for(cfg.corpus_names()), cfg)
        assert torch.equal(saved["prompts"], prompts.eval)
        parts = saved["parts"]
        cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        evals = LabelledData(chat=prompts.eval_chat, prompt_tokens=cfg.prompt_tokens, **cat)
    draft = load_distilled_draft(target, args.draft)
    print(json.dumps({"draft": str(args.draft or "shipped"), **asdict(evaluate(draft, evals))}))


if __name__ == "__main__":
    main()
