"""Training a feature-conditioned draft head (:mod:`dynatree.drafts.feature_head`) for a Llama-style target.

It shares steps 1-3 of :func:`dynatree.training.distill.distill` (prompts from the offline corpora, held
out by document; target labels in ``data.pt``; the vocabulary subset) and adds one labelling pass:
the target's features at every position of the labelled sequences (``features.pt``, fp16): its final
hidden states, or with ``feature_layers`` the outputs of a low, a middle and a high layer
concatenated (EAGLE-3), one batched teacher-forced forward per chunk, far cheaper per token than
generation. Left-padded instruct rows run with their padding masked and positions counted from
their first token, as the target sees them at run time; padding columns get zero features.

The loss at every position j is the cross-entropy to the target's top-k next-token distribution
over the subset plus ``feature_weight`` x smooth-L1 between the predicted and the target's final
feature f_j (only when the head reads final features: fused layers have no such target). **Unrolled levels** (EAGLE-3's "training-time test"): at run time only the root level reads the
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
    windows,
    agreement,
    linear_tokens_per_round,
    end_step,
    evaluate,
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
from dynatree.drafts.feature_head import FeatureDraft, resolve_feature_layers, uses_target_features

FEATURES_FILE = "features.pt"


# ------------------------------------------------------------------------------ target features
@torch.inference_mode()
def target_features(target: nn.Module, tokens: torch.Tensor, *, start: torch.Tensor | None = None,
                    layers: Sequence[int] = (), batch: int = 16, partial: Path | None = None,
                    save_every_s: float = 300.0, progress: bool = True,
                    desc: str = "target features") -> torch.Tensor:
    """The target's features ``[n, L, H * max(1, len(layers))]`` (fp16, CPU) of every position of
    ``tokens``: its final hidden states, or the outputs of ``layers`` concatenated.

    ``start[s]``: row ``s``'s first real column (left padding before it): rows are run in order of
    their length, each batch cut to its longest row, padding masked and positions counted from each
    row's first token; padding columns get zeros. ``partial`` keeps finished chunks so an
    interrupted pass resumes where it stopped. It is rewritten at most every ``save_every_s``
    seconds: each save writes the whole tensor (13 GB for 7,600 fused rows of 512 tokens), so
    saving on a batch count made a GPU pass spend its time writing checkpoints.
    """
    n, length = tokens.shape
    device = target.get_input_embeddings().weight.device
    width = target.config.hidden_size * max(1, len(layers))
    done: dict[str, Any] = torch.load(partial, weights_only=True) if partial is not None and partial.is_file() else {}
    feats = done.get("features")
    if feats is None or feats.shape != (n, length, width):
        feats, first = torch.zeros(n, length, width, dtype=torch.float16), 0
    else:
        first = int(done["next"])
    starts = start if start is not None else torch.zeros(n, dtype=torch.long)
    order = torch.argsort(starts, descending=True, stable=True)  # shortest rows first
    bar = progress_bar(total=n, initial=first, desc=desc, enabled=progress)
    saved_at = time.monotonic()
    for i in range(first, n, batch):
        rows = order[i:i + batch]
        cut = int(starts[rows].min())
        ids = tokens[rows, cut:].to(device)
        cols = torch.arange(length - cut, device=device)[None, :]
        offset = (starts[rows].to(device) - cut)[:, None]
        mask = (cols >= offset).long()
        out = target.base_model(input_ids=ids, attention_mask=mask, position_ids=(cols - offset).clamp_min(0),
                                output_hidden_states=bool(layers))
        hidden = torch.cat([out.hidden_states[j] for j in layers], dim=-1) if layers else out.last_hidden_state
        # (padding queries see no key: whatever they return, NaN included, is replaced by zeros)
        feats[rows, cut:] = hidden.masked_fill(mask[..., None] == 0, 0.0).to(torch.float16).cpu()
        bar.update(len(rows))
        if partial is not None and i + batch < n and time.monotonic() - saved_at >= save_every_s:
            atomic_save({"features": feats, "next": i + batch}, partial)
            saved_at = time.monotonic()
    bar.close()
    return feats


def features_for(target: nn.Module, train: LabelledData, evals: LabelledData, out: Path, cfg: DistillConfig,
                 layers: Sequence[int] = (), progress: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) features, from ``features.pt`` when made for the same data, target and layers."""
    path = out / FEATURES_FILE
    wanted = stamp(cfg, target, feature_layers=list(layers)) if layers else stamp(cfg, target)
    saved = load_stamped(path, wanted)
    if saved is not None:
        return saved["train"], saved["eval"]
    ev = target_features(target, evals.tokens, start=evals.start, layers=layers,
                         partial=out / "features-eval.partial.pt", progress=progress, desc="target features (held-out)")
    tr = target_features(target, train.tokens, start=train.start, layers=layers,
                         partial=out / "features-train.partial.pt", progress=progress, desc="target features (train)")
    atomic_save({**wanted, "train": tr, "eval": ev}, path)
    for name in ("features-eval.partial.pt", "features-train.partial.pt"):
        (out / name).unlink(missing_ok=True)
    return tr, ev


# ------------------------------------------------------------------------------ unrolled levels
def level_mask(length: int, level: int, dtype: torch.dtype, real: torch.Tensor | None = None) -> torch.Tensor:
    """Additive mask ``[L, level * L]`` of level ``level``'s rows against the cached rows of levels
    ``1 .. level-1`` (L each, in level order) and their own; ``[b, L, level * L]`` with ``real``.

    Row j of level d belongs to the chain drafted from root position t = j - d + 1: it sees the
    teacher-forced rows 0..t, the level-k row at position t + k - 1 for 1 < k < d, and itself.
    ``real`` ``[b, L]`` marks non-padding columns: teacher-forced padding rows are hidden from every
    row (a row still sees itself, so no softmax row is empty).
    """
    j = torch.arange(length)[:, None]
    i = torch.arange(length)[None, :]
    first = i <= j - level + 1  # the teacher-forced rows up to the chain's root
    if real is not None:
        first = first[None] & real.cpu()[:, None, :]
    own = torch.eye(length, dtype=torch.bool).expand_as(first)
    if level == 1:  # teacher forcing: plain causal attention
        allowed = first | own
    else:
        between = [(i == j - level + k).expand_as(first) for k in range(2, level)]
        allowed = torch.cat([first, *between, own], dim=-1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def unrolled_hidden(draft: FeatureDraft, tokens: torch.Tensor, parents: torch.Tensor, levels: int,
                    real: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Predicted features ``[b, L, H]`` of levels 1..``levels``; level 1 reads ``parents`` (the
    target's, as the head reads them: :meth:`FeatureDraft.parent_features`), level d the level-(d-1)
    prediction of the previous position. ``real``: non-padding columns ``[b, L]`` (None: no padding)."""
    b, length = tokens.shape
    cache = DynamicCache()
    positions = torch.arange(length, device=draft.device).expand(b, -1)
    out: list[torch.Tensor] = []
    for level in range(1, levels + 1):
        if level > 1:
            prev = out[-1]
            parents = torch.cat([prev[:, :1] * 0, prev[:, :-1]], dim=1)
        mask = level_mask(length, level, draft.dtype, real).to(draft.device)
        mask = mask[:, None] if mask.dim() == 3 else mask[None, None].expand(b, 1, -1, -1)
        hidden, cache = draft.hidden_states(tokens, parents, attention_mask=mask, position_ids=positions,
                                            past_key_values=cache, use_cache=True)
        out.append(hidden)
    return out


def _parents(feats: torch.Tensor) -> torch.Tensor:
    """Position j reads position j-1's feature; the first position (and left padding) reads zeros."""
    return torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)


def _level_losses(draft: FeatureDraft, batch: tuple[torch.Tensor, ...], cfg: DistillConfig
                  ) -> tuple[torch.Tensor, float]:
    tokens, feats, idx, probs, mask, real = batch
    parents = draft.parent_features(_parents(feats.float()))
    levels = unrolled_hidden(draft, tokens, parents, cfg.unroll, real)
    weight = cfg.regression_weight()
    total = torch.zeros((), device=draft.device)
    agree1 = 0.0
    for d, hidden in enumerate(levels, start=1):
        m = mask.clone()
        m[:, : d - 1] = False  # rows whose chain would start before the window
        if real is not None:  # ... or in the row's left padding
            m[:, d - 1:] &= real[:, : m.shape[1] - d + 1].to(m.device)
        ce, agree = distill_loss(draft.head(hidden), idx, probs, m)
        loss = ce
        if weight:  # (final features only: fused layers are not what the head predicts)
            reg = nn.functional.smooth_l1_loss(hidden.float(), feats.float(), reduction="none").mean(-1)
            loss = loss + weight * (reg * m).sum() / m.sum().clamp_min(1)
        total = total + 0.5 ** (d - 1) * loss
        agree1 = float(agree) if d == 1 else agree1
    return total, agree1


def _batch(data: LabelledData, feats: torch.Tensor, idx: torch.Tensor, probs: torch.Tensor,
           window: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], device: torch.device
           ) -> tuple[torch.Tensor | None, ...]:
    """One :func:`~dynatree.training.distill.windows` window as :func:`_level_losses` takes it."""
    r, c, real = window
    return (*(t.to(device) for t in (data.tokens[r, c], feats[r, c], idx[r, c], probs[r, c], data.valid[r, c])), real)


def _train_step(draft: FeatureDraft, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor | None, ...],
                cfg: DistillConfig) -> tuple[float, float]:
    draft.train()
    loss, agree = _level_losses(draft, batch, cfg)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach()), agree


@torch.inference_mode()
def evaluate_features(draft: FeatureDraft, data: LabelledData, feats: torch.Tensor, *, spec_k: int = 4,
                      batch: int = 16) -> Agreement:
    """Held-out agreement of a feature draft: level-1 (teacher-forced) top-1 agreement, and greedy
    linear speculation with K = ``spec_k`` simulated exactly through :func:`unrolled_hidden`."""
    draft.eval()
    real_cols = data.real_mask()
    hits = []  # [levels, n, L]: level d's row j matches the target's next token after j
    for i in range(0, len(data), batch):
        tokens = data.tokens[i:i + batch].to(draft.device)
        parents = draft.parent_features(_parents(feats[i:i + batch].to(draft.device, draft.dtype)))
        real = real_cols[i:i + batch] if real_cols is not None else None
        levels = unrolled_hidden(draft, tokens, parents, spec_k, real)
        ids = draft.vocab_subset[torch.stack([draft.head(h).argmax(-1) for h in levels])].cpu()
        hits.append(ids == data.topk_ids[i:i + batch, :, 0])
    hit = torch.cat(hits, dim=1)
    inside = torch.isin(data.topk_ids[..., 0], draft.vocab_subset.cpu())
    # the chain from root pos[t]: its level d + 1 (hit[d]) is read at position pos[t] + d
    k4 = linear_tokens_per_round(data.generated_mask(), lambda s, pos, t, d: bool(hit[d, s, pos[t] + d]), spec_k)
    return agreement(hit[0], data, inside, k4)


def evaluate_draft(draft: nn.Module, data: LabelledData, target: nn.Module) -> Agreement:
    """Held-out agreement of either kind of draft on ``data``: a feature head is scored on the
    target's features of ``data`` (computed here), an independent draft by tokens alone."""
    if not uses_target_features(draft):
        return evaluate(draft, data)
    feats = target_features(target, data.tokens, start=data.start, layers=draft.feature_layers, progress=False)
    return evaluate_features(draft, data, feats)


# ------------------------------------------------------------------------------------ training
def distill_features(target: nn.Module, tokenizer: Tokenizer, *, out_dir: str | os.PathLike[str],
                     config: DistillConfig | None = None, target_name: str = DEFAULT_TARGET,
                     documents: Sequence[Text] | None = None, resume: bool = True, progress: bool = True) -> Path:
    """Train a feature draft for ``target``; returns the folder with its final weights and config.

    Steps as :func:`dynatree.training.distill.distill` (the same ``data.pt``, any kind of data),
    plus ``features.pt``; every step is resumable from ``checkpoint.pt`` (optimizer and
    batch-sampler state included).
    """
    cfg = config or DistillConfig(kind="feature", layers=1)
    if cfg.kind != "feature":
        raise DynaTreeError(f"distill_features trains kind='feature' drafts, the config says {cfg.kind!r}")
    layers = resolve_feature_layers(cfg.feature_layers, int(target.config.num_hidden_layers))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    ckpt_path, log_path = out / CHECKPOINT_FILE, out / LOG_FILE
    train, evals = labelled_sets(target, tokenizer, out, cfg, documents, progress)
    feats, eval_feats = features_for(target, train, evals, out, cfg, layers, progress=progress)
    subset, dcfg = draft_config_for(target, tokenizer, train, cfg, target_name, kind="feature", feature_layers=layers)
    draft = FeatureDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
    optimizer, gen, step = start_training(draft, cfg, subset, ckpt_path, log_path, resume)

    idx, probs = subset_targets(train, draft.vocab_subset.cpu(), dcfg.vocab_size)
    picks = windows(train, cfg, gen)
    bar = progress_bar(total=cfg.steps, initial=step, desc="distilling (feature head)", enabled=progress)
    t0 = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        while step < cfg.steps:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss, agree = _train_step(draft, optimizer, _batch(train, feats, idx, probs, next(picks), draft.device), cfg)
            step += 1
            end_step(log, bar, step, loss, agree, cfg, t0, lambda: evaluate_features(draft, evals, eval_feats),
                     lambda: save_checkpoint(ckpt_path, step, cfg, subset, draft, optimizer, gen))
    bar.close()
    return save_final(draft, out, train, cfg, evaluate_features(draft, evals, eval_feats))
