"""Out-of-domain check: agreement on general prose prompts unlike the training corpus.

    python benchmarks/distill/general_prompts.py
"""

from __future__ import annotations

import torch

from dynatree.training.distill import evaluate
from dynatree.training.data import LabelledData, label_batch
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.loading.models import load_model

PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg",
    "Photosynthesis is the process by which green plants",
    "The city council met on Tuesday to discuss the new budget, which",
    "To bake a simple loaf of bread, you first need to",
    "The Roman Empire was one of the largest empires in history. At its height,",
    "Climate change affects ocean currents because",
]


def main() -> None:
    torch.set_num_threads(2)
    target, tok = load_model("smollm2-135m")
    draft = load_distilled_draft(target)
    parts = []
    for text in PROMPTS:
        ids = torch.tensor([tok.encode(text)])
        parts.append((ids.shape[1], label_batch(target, ids, 64, 1, tok.eos_token_id)))
    rows = [evaluate(draft, LabelledData(chat=torch.zeros(1, dtype=torch.bool), prompt_tokens=p,
                                         **part)) for p, part in parts]
    gen = sum(r.generated * r.positions for r in rows) / sum(r.positions for r in rows)
    k4 = sum(r.linear_k4_tokens for r in rows) / len(rows)
    print(f"distilled: generated-token agreement {gen:.3f}, linear K=4 tokens/round {k4:.2f}")
    for text, r in zip(PROMPTS, rows):
        print(f"  {r.generated:.3f}  {r.linear_k4_tokens:.2f}  {text[:50]}")


if __name__ == "__main__":
    main()
