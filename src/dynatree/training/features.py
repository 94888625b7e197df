"""Training a feature-conditioned draft head (:mod:`dynatree.drafts.feature_head`) for a Llama-style target.

It shares steps 1-3 of :func:`dynatree.training.distill.distill` (prompts from the offline corpora, held
out by document; target labels in ``data.pt``; the vocabulary subset) and adds one labelling pass:
the target's final hidden states at every position of the labelled sequences (``features.pt``,
fp16), one batched teacher-forced forward per chunk, far cheaper per token than generation.

The loss at every position j is the cross-entropy to the target's top-k next-token distribution
over the subset plus ``feature_weight`` x smooth-L1 between the predicted and the target's feature
f_j. **Unrolled levels** (EAGLE-3's "training-time test"): at run time only the root level reads the
target's features; a node at tree depth d reads the head's own prediction for its parent, made at
depth d-1. Training level d reproduces that exactly for every position at once: its rows read the
level-(d-1) predictions of the previous position, and attend to the teacher-forced rows up to the
round's root plus the one row of each earlier level on their own chain (:func:`level_mask`), which
is the attention pattern of a linear chain drafted from each position. Level d's loss is weighted
``0.5 ** (d - 1)``. The same passes give the held-out score: depth-d acceptance of a chain drafted
from every position, so ``linear_k4_tokens`` is an exact simulation of greedy linear speculation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from dynatree.training.distill import (
    CHECKPOINT_FILE,
    LOG_FILE,
    Agreement,
    draft_config_for,
    lr_at,
    subset_targets,
    distill_loss,
    end_step,
    save_checkpoint,
    save_final,
    start_training,
)
from dynatree.training.data import LabelledData, Tokenizer, atomic_save, progress_bar
from dynatree.training.labels import labelled_sets, load_stamped, stamp
from dynatree.text.corpora import Text
from dynatree.catalog import DEFAULT_TARGET
from dynatree.training.config import DistillConfig
from dynatree.errors import DynaTreeError
from dynatree.drafts.feature_head import FeatureDraft

FEATURES_FILE = "features.pt"


# ------------------------------------------------------------------------------ target features
@torch.inference_mode()
def target_features(target: nn.Module, tokens: torch.Tensor, *, batch: int = 16, partial: Path | None = None,
                    progress: bool = True, desc: str = "target features") -> torch.Tensor:
    """The target's final hidden states ``[n, L, H]`` (fp16, CPU) of every position of ``tokens``.

    ``partial`` keeps finished chunks so an interrupted pass resumes where it stopped.
    """
    n, length = tokens.shape
    device = target.get_input_embeddings().weight.device
    done: dict[str, Any] = torch.load(partial, weights_only=True) if partial is not None and partial.is_file() else {}
    feats = done.get("features")
    if feats is None or feats.shape[:2] != tokens.shape:
        feats, start = torch.empty(n, length, target.config.hidden_size, dtype=torch.float16), 0
    else:
        start = int(done["next"])
    bar = progress_bar(total=n, initial=start, desc=desc, enabled=progress)
    for i in range(start, n, batch):
        hidden = target.base_model(input_ids=tokens[i:i + batch].to(device)).last_hidden_state
        feats[i:i + batch] = hidden.to(torch.float16).cpu()
        bar.update(min(batch, n - i))
        if partial is not None and (i // batch) % 16 == 15:
            atomic_save({"features": feats, "next": i + batch}, partial)
    bar.close()
    return feats


def features_for(target: nn.Module, train: LabelledData, evals: LabelledData, out: Path, cfg: DistillConfig,
                 progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) features, from ``features.pt`` when made for the same data and target."""
    path = out / FEATURES_FILE
    wanted = stamp(cfg, target)
    saved = load_stamped(path, wanted)
    if saved is not None:
        return saved["train"], saved["eval"]
    ev = target_features(target, evals.tokens, partial=out / "features-eval.partial.pt", progress=progress,
                         desc="target features (held-out)")
    tr = target_features(target, train.tokens, partial=out / "features-train.partial.pt", progress=progress,
                         desc="target features (train)")
    atomic_save({**wanted, "train": tr, "eval": ev}, path)
    for name in ("features-eval.partial.pt", "features-train.partial.pt"):
        (out / name).unlink(missing_ok=True)
    return tr, ev


# ------------------------------------------------------------------------------ unrolled levels
def level_mask(length: int, level: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[L, level * L]`` of level ``level``'s rows against the cached rows of levels
    ``1 .. level-1`` (L each, in level order) and their own.

    Row j of level d belongs to the chain drafted from root position t = j - d + 1: it sees the
    teacher-forced rows 0..t, the level-k row at position t + k - 1 for 1 < k < d, and itself.
    """
    j = torch.arange(length)[:, None]
    i = torch.arange(length)[None, :]
    if level == 1:  # teacher forcing: plain causal attention
        blocks = [i <= j]
    else:
        blocks = [i <= j - level + 1, *(i == j - level + k for k in range(2, level)), i == j]
    allowed = torch.cat(blocks, dim=1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def unrolled_hidden(draft: FeatureDraft, tokens: torch.Tensor, parents: torch.Tensor, levels: int
                    ) -> list[torch.Tensor]:
    """Predicted features ``[b, L, H]`` of levels 1..``levels``; level 1 reads the target's
    ``parents`` (teacher forcing), level d the level-(d-1) prediction of the previous position."""
    b, length = tokens.shape
    cache = DynamicCache()
    positions = torch.arange(length, device=draft.device).expand(b, -1)
    out: list[torch.Tensor] = []
    for level in range(1, levels + 1):
        if level > 1:
            prev = out[-1]
            parents = torch.cat([prev[:, :1] * 0, prev[:, :-1]], dim=1)
        mask = level_mask(length, level, draft.dtype).to(draft.device)
        mask = mask[None, None].expand(b, 1, -1, -1)
        hidden, cache = draft.hidden_states(tokens, parents, attention_mask=mask, position_ids=positions,
                                            past_key_values=cache, use_cache=True)
        out.append(hidden)
    return out


def _parents(feats: torch.Tensor) -> torch.Tensor:
    """Position j reads position j-1's feature; the first position reads zeros."""
    return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)


def _level_losses(draft: FeatureDraft, batch: tuple[torch.Tensor, ...], cfg: DistillConfig
                  ) -> tuple[torch.Tensor, float]:
    tokens, feats, idx, probs, mask = batch
    levels = unrolled_hidden(draft, tokens, _parents(feats.float()), cfg.unroll)
    total = torch.zeros((), device=draft.device)
    agree1 = 0.0
    for d, hidden in enumerate(levels, start=1):
        m = mask.clone()
        m[:, : d - 1] = False  # rows whose chain would start before the sequence
        ce, agree = distill_loss(draft.head(hidden), idx, probs, m)
        reg = nn.functional.smooth_l1_loss(hidden.float(), feats.float(), reduction="none").mean(-1)
        reg = (reg * m).sum() / m.sum().clamp_min(1)
        total = total + 0.5 ** (d - 1) * (ce + cfg.feature_weight * reg)
        agree1 = float(agree) if d == 1 else agree1
    return total, agree1


@torch.inference_mode()
def evaluate_features(draft: FeatureDraft, data: LabelledData, feats: torch.Tensor, *, spec_k: int = 4,
                      batch: int = 16) -> Agreement:
    """Held-out agreement of a feature draft: level-1 (teacher-forced) top-1 agreement, and greedy
    linear speculation with K = ``spec_k`` simulated exactly through :func:`unrolled_hidden`."""
    draft.eval()
    hits = []  # [levels, n, L]: level d's row j matches the target's next token after j
    for i in range(0, len(data), batch):
        tokens = data.tokens[i:i + batch].to(draft.device)
        levels = unrolled_hidden(draft, tokens, _parents(feats[i:i + batch].to(draft.device, draft.dtype)), spec_k)
        ids = draft.vocab_subset[torch.stack([draft.head(h).argmax(-1) for h in levels])].cpu()
        hits.append(ids == data.topk_ids[i:i + batch, :, 0])
    hit = torch.cat(hits, dim=1)
    gen = data.generated_mask()
    prompt = data.valid & ~gen
    inside = torch.isin(data.topk_ids[..., 0], draft.vocab_subset.cpu())
    rounds = tokens_out = 0
    for s in range(len(data)):
        pos = torch.nonzero(gen[s]).flatten().tolist()
        t = 0
        while t < len(pos):
            run = 0  # the chain from root pos[t]: level d's row sits at position pos[t] + d - 1
            while run < spec_k and t + run < len(pos) and bool(hit[run, s, pos[t] + run]):
                run += 1
            step = min(run + 1, len(pos) - t)
            rounds, tokens_out, t = rounds + 1, tokens_out + step, t + step
    h1 = hit[0]
    chat = data.chat[:, None].expand_as(gen)

    def rate(m: torch.Tensor) -> float:
        return float(h1[m].float().mean()) if m.any() else float("nan")

    return Agreement(generated=rate(gen), prompt=rate(prompt), coverage=float(inside[gen].float().mean()),
                     linear_k4_tokens=tokens_out / max(1, rounds), chat_generated=rate(gen & chat),
                     raw_generated=rate(gen & ~chat), positions=int(gen.sum()))


# ------------------------------------------------------------------------------------ training
def distill_features(target: nn.Module, tokenizer: Tokenizer, *, out_dir: str | os.PathLike[str],
                     config: DistillConfig | None = None, target_name: str = DEFAULT_TARGET,
                     documents: Sequence[Text] | None = None, resume: bool = True, progress: bool = True) -> Path:
    """Train a feature draft for ``target``; returns the folder with its final weights and config.

    Steps as :func:`dynatree.training.distill.distill` (the same ``data.pt``), plus ``features.pt``; every
    step is resumable from ``checkpoint.pt`` (optimizer and batch-sampler state included).
    """
    cfg = config or DistillConfig(kind="feature", layers=1)
    if cfg.kind != "feature":
        raise DynaTreeError(f"distill_features trains kind='feature' drafts, the config says {cfg.kind!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    ckpt_path, log_path = out / CHECKPOINT_FILE, out / LOG_FILE
    train, evals = labelled_sets(target, tokenizer, out, cfg, documents, progress)
    feats, eval_feats = features_for(target, train, evals, out, cfg, progress=progress)
    subset, dcfg = draft_config_for(target, tokenizer, train, cfg, target_name, kind="feature")
    draft = FeatureDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
    optimizer, gen, step = start_training(draft, cfg, subset, ckpt_path, log_path, resume)

    idx, probs = subset_targets(train, draft.vocab_subset.cpu(), dcfg.vocab_size)
    length = train.tokens.shape[1]
    bar = progress_bar(total=cfg.steps, initial=step, desc="distilling (feature head)", enabled=progress)
    t0 = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        while step < cfg.steps:
            rows = torch.randint(len(train), (cfg.batch,), generator=gen)
            start = torch.randint(length - cfg.seq_len + 1, (cfg.batch,), generator=gen)
            r, c = rows[:, None], start[:, None] + torch.arange(cfg.seq_len)
            batch = tuple(t.to(draft.device) for t in (train.tokens[r, c], feats[r, c], idx[r, c], probs[r, c],
                                                       train.valid[r, c]))
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            draft.train()
            loss, agree = _level_losses(draft, batch, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            optimizer.step()
            step += 1
            end_step(log, bar, step, float(loss.detach()), agree, cfg, t0, lambda: evaluate_features(draft, evals, eval_feats),
                     lambda: save_checkpoint(ckpt_path, step, cfg, subset, draft, optimizer, gen))
    bar.close()
    return save_final(draft, out, train, cfg, evaluate_features(draft, evals, eval_feats))
