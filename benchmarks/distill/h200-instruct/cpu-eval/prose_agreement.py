"""Prose held-out agreement of several distilled drafts on ONE set of target labels (CPU).

    python benchmarks/distill/h200-instruct/cpu-eval/prose_agreement.py \
        --draft shipped --draft instruct=/tmp/instruct-draft --split s5 --split current \
        --labels /tmp/cpu-eval/labels --out benchmarks/distill/h200-instruct/cpu-eval/prose.json
    # the same on the two corpora both drafts trained on (held out: GFDL and 7 pydoc topics)
    ... --corpora pydoc,licences --train-sequences 1024 --out .../prose-pydoc-licences.json

The method of ``benchmarks/distill/evaluate.py`` / ``score_partial.py`` (the shipped draft's 40.6%):
the held-out prompts of ``DistillConfig(corpora="pydoc,licences,wiki,books")`` (128 windows of 96
tokens from held-out documents, half chat-wrapped), greedily continued by the target for 64 tokens
(``label_prompts``), every draft scored teacher-forced by ``dynatree.training.features.evaluate_draft`` (``distill.evaluate``;
``evaluate_features`` on the target's features for a feature head).

``--split s5`` rebuilds the held-out prompts exactly as session 5 drew them (documents split by name
only; the shuffle that picks the held-out windows depends on the size of the training pools, which
the 60-character cut of DATA_VERSION 2 changed). ``--split current`` is what the code draws now.
Besides evaluate()'s numbers, the result splits agreement by corpus of the held-out document and by
whether a sequence shares a 60-character run with the documents session 5 trained on.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.loading.models import load_model
from dynatree.text.corpora import is_held_out
from dynatree.training import data as D
from dynatree.training.config import DistillConfig
from dynatree.training.features import evaluate_draft
from dynatree.training.split import HeldOutText

CORPORA = "pydoc,licences,wiki,books"


def old_training_documents(documents, holdout_every):
    """Session 5's split: by document name only, no content cut."""
    return [(d, is_held_out(d.name, holdout_every)) for d in documents]


def build(tok, docs, cfg, split: str) -> D.PromptWindows:
    if split == "current":
        return D.build_prompts(tok, docs, cfg)
    saved = D.training_documents
    D.training_documents = old_training_documents
    try:
        return D.build_prompts(tok, docs, cfg)
    finally:
        D.training_documents = saved


def window_sources(tok, docs, cfg) -> dict[tuple[int, ...], str]:
    """Held-out prompt window -> name of its document (the loops of build_prompts)."""
    p = cfg.prompt_tokens
    wrappers = [w for w in (D._chat_wrapper(tok, i) for i in D.CHAT_INSTRUCTIONS) if w]
    wrappers = [w for w in wrappers if p - len(w[0]) - len(w[1]) >= 16]
    out = {}
    for doc in docs:
        if not is_held_out(doc.name, cfg.holdout_every):
            continue
        ids = tok.encode(doc.text, add_special_tokens=False)
        for i in range(0, len(ids) - p + 1, p):
            out[tuple(ids[i:i + p])] = doc.name
        for j, (pre, post) in enumerate(wrappers):
            w = p - len(pre) - len(post)
            start = (j * w) // max(1, len(wrappers))
            for i in range(start, len(ids) - w + 1, w * len(wrappers)):
                out[tuple(pre + ids[i:i + w] + post)] = doc.name
    return out


def rows(data: D.LabelledData, keep: torch.Tensor) -> D.LabelledData:
    idx = keep.nonzero().flatten()
    return D.LabelledData(tokens=data.tokens[idx], topk_ids=data.topk_ids[idx], topk_logits=data.topk_logits[idx],
                          valid=data.valid[idx], chat=data.chat[idx], prompt_tokens=data.prompt_tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", action="append", default=[], help="NAME=FOLDER, or 'shipped'")
    ap.add_argument("--split", action="append", choices=("s5", "current"), default=[])
    ap.add_argument("--labels", type=Path, required=True, help="folder for the labelled data (cached)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--corpora", default=CORPORA, help="the 40.6%% set: the default")
    ap.add_argument("--train-sequences", type=int, default=2048,
                    help="only moves the held-out draw (pydoc,licences alone yield < 2048 training windows)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    args.labels.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    target, tok = load_model("smollm2-135m")
    cfg = DistillConfig(corpora=args.corpora, train_sequences=args.train_sequences)
    docs = D.documents_for(cfg.corpus_names())
    drafts = {}
    for spec in args.draft or ["shipped"]:
        name, _, folder = spec.partition("=")
        drafts[name] = load_distilled_draft(target, folder or None)
    sources = window_sources(tok, docs, cfg)
    seen = HeldOutText(d.text for d in docs if not is_held_out(d.name, cfg.holdout_every))
    result = {"machine": f"{platform.processor() or platform.machine()}, {args.threads} torch thread(s), "
                         f"{platform.platform()}",
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": __import__("transformers").__version__},
              "config": asdict(cfg), "drafts": {k: (v.split("=", 1)[1] if "=" in v else "shipped")
                                               for k, v in zip(drafts, args.draft or ["shipped"])},
              "splits": {}}
    for split in args.split or ["s5"]:
        prompts = build(tok, docs, cfg, split)
        tag = "" if (args.corpora, args.train_sequences) == (CORPORA, 2048) else \
            f"-{args.corpora.replace(',', '+')}-{args.train_sequences}"
        cache = args.labels / f"prose-{split}{tag}.pt"
        t = time.time()
        if cache.is_file() and torch.equal(torch.load(cache, weights_only=True)["tokens"][:, :cfg.prompt_tokens],
                                           prompts.eval):
            evals = D.LabelledData(**torch.load(cache, weights_only=True))
            label_s = None
        else:
            evals = D.label_prompts(target, prompts.eval, prompts.eval_chat, cfg, tok.eos_token_id,
                                    partial=args.labels / f"prose-{split}{tag}.partial.pt", desc=f"labels ({split})")
            D.atomic_save(evals.as_dict(), cache)
            label_s = round(time.time() - t, 1)
        names = [sources.get(tuple(r), "?") for r in prompts.eval.tolist()]
        corpus = [n.split("/")[0] if "/" in n else n for n in names]
        text = [tok.decode(r) for r in evals.tokens.tolist()]
        shares = torch.tensor([seen.shares(s) for s in text])
        groups = {f"corpus={c}": torch.tensor([x == c for x in corpus]) for c in sorted(set(corpus))}
        groups["shares_60_chars_with_s5_training_docs"] = shares
        groups["shares_nothing_with_s5_training_docs"] = ~shares
        entry = {"sequences": len(evals), "label_seconds": label_s,
                 "documents": sorted(set(names)), "sequences_by_group": {k: int(v.sum()) for k, v in groups.items()},
                 "agreement": {}}
        for name, draft in drafts.items():
            ag = {"all": asdict(evaluate_draft(draft, evals, target))}
            for g, keep in groups.items():
                if keep.any():
                    ag[g] = asdict(evaluate_draft(draft, rows(evals, keep), target))
            entry["agreement"][name] = ag
            print(split, name, json.dumps(ag["all"]), flush=True)
        result["splits"][split] = entry
    result["wall_seconds"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
