"""Training a distilled draft (:mod:`dynatree.drafts.distilled`) for a Llama-style target, offline.

Why this exists: on a CPU the draft's per-token cost decides whether speculation wins at all. The
obvious free drafts fail for the offline pair (SmolLM2-135M-Instruct): its first *k* layers plus the
LM head agree with the full model's greedy token only 6-51% of the time, and any draft that keeps
the full 49152-token head already costs about a quarter of a target step. So the draft has a few
layers of the target's width, initialised from its first layers, the shared frozen embedding, and
a reduced-vocabulary head initialised from the target's tied embedding rows.

It is trained to imitate the target where the target is actually used: teacher-forced top-k
next-token distributions of the target over offline prose prompts (the ``corpora`` setting:
Python's ``pydoc_data`` topics cleaned to prose paragraphs, the Debian licence texts, and the
Wikipedia / books corpora of :mod:`dynatree.text.corpora`) *and* over the target's own greedy
continuations of those prompts (both raw continuation and chat-formatted requests), because in
greedy speculative decoding every context the draft sees is target-generated text. Held-out
documents (:func:`dynatree.text.corpora.is_held_out`) never reach training.

Labelling (one target forward per position) is the cost that limits the draft on a CPU; every
step is resumable, and ``--device cuda`` runs labelling and training on a GPU.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynatree.text.corpora import Text
from dynatree.catalog import DEFAULT_TARGET
from dynatree.training.config import DistillConfig
from dynatree.training.data import (
    LabelledData,
    Tokenizer,
    atomic_save,
    progress_bar,
    choose_vocab_subset,
)
from dynatree.training.instruct import KINDS
from dynatree.training.labels import labelled_sets
from dynatree.drafts.checkpoint import load_distilled_draft
from dynatree.drafts.distilled import DistilledDraft, DraftConfig, _atomic, save_draft
from dynatree.errors import DynaTreeError

CHECKPOINT_FILE = "checkpoint.pt"
LOG_FILE = "train_log.jsonl"
FINAL_DIR = "final"


# ------------------------------------------------------------------------------------- training
def subset_targets(data: LabelledData, subset: torch.Tensor, vocab_size: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids -> subset indices (-1 if absent) and soft targets renormalised over the subset."""
    lookup = torch.full((vocab_size,), -1, dtype=torch.long)
    lookup[subset] = torch.arange(len(subset))
    idx = lookup[data.topk_ids]
    probs = torch.softmax(data.topk_logits.float(), dim=-1) * (idx >= 0)
    mass = probs.sum(-1, keepdim=True)
    return idx, torch.where(mass > 0, probs / mass.clamp_min(1e-12), probs)


def distill_loss(sub_logits: torch.Tensor, idx: torch.Tensor, probs: torch.Tensor,
                 mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy to the target's top-k distribution over the subset; and top-1 agreement.

    ``top_k = 1`` is plain hard-label distillation. Positions whose target top-k lies entirely
    outside the subset carry no loss but count as disagreements.
    """
    logq = torch.log_softmax(sub_logits.float(), dim=-1)
    picked = logq.gather(-1, idx.clamp_min(0)) * probs
    has_mass = probs.sum(-1) > 0
    m = mask & has_mass
    loss = -(picked.sum(-1) * m).sum() / m.sum().clamp_min(1)
    agree = ((sub_logits.argmax(-1) == idx[..., 0]) & (idx[..., 0] >= 0) & mask).sum()
    return loss, agree.float() / mask.sum().clamp_min(1)


def pad_attention(real: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A 4D additive causal mask ``[b, 1, s, s]`` that hides padding columns (``real`` False) from
    every query; a padding query sees only itself (no empty softmax row). None without padding."""
    if real is None or bool(real.all()):
        return None
    s = real.shape[1]
    allowed = torch.ones(s, s, dtype=torch.bool, device=real.device).tril()[None] & real[:, None, :]
    allowed |= torch.eye(s, dtype=torch.bool, device=real.device)[None]
    mask = torch.zeros(real.shape[0], 1, s, s, dtype=dtype, device=real.device)
    return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)


def _train_step(draft: DistilledDraft, optimizer: torch.optim.Optimizer,
                batch: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    tokens, idx, probs, mask = (t.to(draft.device, non_blocking=True) for t in batch[:4])
    real = batch[4].to(draft.device) if len(batch) > 4 else None
    draft.train()
    logits = draft.subset_logits(tokens, attention_mask=pad_attention(real, draft.dtype))
    loss, agree = distill_loss(logits, idx, probs, mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach()), float(agree)


def lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of ``lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))


def windows(data: LabelledData, cfg: DistillConfig, gen: torch.Generator
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Random windows of ``seq_len`` from random sequences, as (rows ``[b, 1]``, columns ``[b, w]``,
    real-column mask or None); the generator state is checkpointed.

    Left-padded rows (instruct data) start their window at their first real column when they
    can; a window that still holds padding comes with its real-column mask (else None)."""
    length = data.tokens.shape[1]
    win = min(cfg.seq_len, length)
    real_cols = data.real_mask()
    while True:
        rows = torch.randint(len(data), (cfg.batch,), generator=gen)
        if data.start is None:
            start = torch.randint(length - win + 1, (cfg.batch,), generator=gen)
        else:
            low = data.start[rows].clamp_max(length - win)
            start = low + (torch.rand(cfg.batch, generator=gen) * (length - win + 1 - low)).long()
        cols = start[:, None] + torch.arange(win)
        r = rows[:, None]
        real = real_cols[r, cols] if real_cols is not None else None
        yield r, cols, (None if real is None or bool(real.all()) else real)


def _batches(data: LabelledData, idx: torch.Tensor, probs: torch.Tensor, cfg: DistillConfig,
             gen: torch.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    """:func:`windows` as (tokens, target ids, target probabilities, valid[, real-column mask])."""
    for r, cols, real in windows(data, cfg, gen):
        batch = (data.tokens[r, cols], idx[r, cols], probs[r, cols], data.valid[r, cols])
        yield batch if real is None else (*batch, real)


@dataclass
class Agreement:
    """Teacher-forced draft-vs-target agreement on held-out target-generated text."""

    generated: float  # top-1 agreement on positions that predict target-generated tokens
    prompt: float  # top-1 agreement on prompt (prose / chat template) positions
    coverage: float  # share of generated-position target tokens inside the draft's subset
    linear_k4_tokens: float  # mean tokens per round, greedy linear speculation with K=4
    chat_generated: float
    raw_generated: float
    positions: int
    by_kind: dict[str, float] | None = None  # generated-token agreement per kind of request

@torch.inference_mode()
def evaluate(draft: nn.Module, data: LabelledData, *, spec_k: int = 4) -> Agreement:
    """Greedy agreement of ``draft`` (any HF-style causal LM) with the target's labels.

    Under greedy speculation the draft always sees the target's own text, so teacher forcing on
    the target's greedy continuation is exact, and so is the linear-speculation simulation: a
    round starting at position t accepts the run of matches from t (at most K) plus one token.
    """
    draft.eval()
    match = []
    param = next(draft.parameters())
    real_cols = data.real_mask()
    subset = getattr(draft, "vocab_subset", None)
    for i in range(0, len(data), 8):
        mask = pad_attention(real_cols[i:i + 8].to(param.device) if real_cols is not None else None, param.dtype)
        ids = data.tokens[i:i + 8].to(param.device)
        if subset is not None and hasattr(draft, "subset_logits"):  # no [8, L, vocab] tensor
            top = subset[draft.subset_logits(ids, attention_mask=mask).argmax(-1)]
        else:
            top = draft(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        match.append(top.cpu() == data.topk_ids[i:i + 8, :, 0])
    hit = torch.cat(match)
    inside = torch.isin(data.topk_ids[..., 0], subset.cpu()) if subset is not None else torch.ones_like(hit)
    k4 = linear_tokens_per_round(data.generated_mask(), lambda s, pos, t, d: bool(hit[s, pos[t + d]]), spec_k)
    return agreement(hit, data, inside, k4)


def linear_tokens_per_round(gen: torch.Tensor, matched: Callable[[int, list[int], int, int], bool],
                            spec_k: int) -> float:
    """Tokens committed per round of greedy linear speculation with K = ``spec_k``, simulated over
    the generated positions ``gen`` ``[n, L]``: a round rooted at the t-th generated position of
    row s accepts drafted token d (0-based) while ``matched(s, positions, t, d)`` holds for every
    token before it, at most K, plus one token from the target. The draft kinds differ only in
    ``matched`` (teacher-forced top-1 hits, or the unrolled levels of a feature head)."""
    rounds = tokens = 0
    for s in range(gen.shape[0]):
        pos = torch.nonzero(gen[s]).flatten().tolist()
        t = 0
        while t < len(pos):
            run = 0
            while run < spec_k and t + run < len(pos) and matched(s, pos, t, run):
                run += 1
            step = min(run + 1, len(pos) - t)
            rounds, tokens, t = rounds + 1, tokens + step, t + step
    return tokens / max(1, rounds)


def agreement(hit: torch.Tensor, data: LabelledData, inside: torch.Tensor, linear_k4_tokens: float) -> Agreement:
    """:class:`Agreement` from the teacher-forced top-1 matches ``hit`` ``[n, L]`` of ``data``
    (overall, by prompt/generated, chat/raw and kind of request), the subset's coverage mask
    ``inside`` and the simulated tokens per round of linear speculation."""
    gen = data.generated_mask()
    chat = data.chat[:, None].expand_as(gen)

    def rate(m: torch.Tensor) -> float:
        return float(hit[m].float().mean()) if m.any() else float("nan")

    by_kind = None
    if data.kind is not None:
        by_kind = {KINDS[k]: round(rate(gen & (data.kind == k)[:, None]), 5) for k in sorted(set(data.kind.tolist()))}
    return Agreement(
        generated=rate(gen), prompt=rate(data.valid & ~gen), coverage=float(inside[gen].float().mean()),
        linear_k4_tokens=linear_k4_tokens, chat_generated=rate(gen & chat),
        raw_generated=rate(gen & ~chat), positions=int(gen.sum()), by_kind=by_kind)


def draft_config_for(target: nn.Module, tokenizer: Tokenizer, train: LabelledData, cfg: DistillConfig,
                  target_name: str, kind: str = "independent", feature_layers: Sequence[int] = ()
                  ) -> tuple[list[int], DraftConfig]:
    """Step 3: the vocabulary subset (+ EOS) and the draft's architecture."""
    always = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    subset = choose_vocab_subset(train, cfg.vocab_subset, always)
    return subset, DraftConfig.from_target(target, name=target_name, layers=cfg.layers, vocab_subset=subset,
                                           kind=kind, feature_layers=feature_layers)


def warm_start(draft: DistilledDraft, source: DistilledDraft) -> int:
    """Copy ``source``'s layers and final norm into ``draft``, and its head rows for the tokens
    both subsets hold; returns how many head rows were copied.

    Why row by row: the subset is chosen again from the new data (the tokens of a new domain
    must be in it), so the rows of tokens new to the subset keep their start from the target's
    embedding (:meth:`DistilledDraft.init_from_target`) and the rest keep what ``source`` learnt.
    """
    if type(source) is not DistilledDraft:
        raise DynaTreeError(f"the init draft is a {type(source).__name__}; only an independent draft "
                            "(dynatree distill --kind independent) can start another")
    if len(source.model.layers) != len(draft.model.layers):
        raise DynaTreeError(f"the init draft has {len(source.model.layers)} layers, the config asks for "
                            f"{len(draft.model.layers)}; pass --layers {len(source.model.layers)}")
    with torch.no_grad():
        draft.model.layers.load_state_dict(source.model.layers.state_dict())
        draft.model.norm.load_state_dict(source.model.norm.state_dict())
        old = {int(t): i for i, t in enumerate(source.vocab_subset.tolist())}
        pairs = [(j, old[int(t)]) for j, t in enumerate(draft.vocab_subset.tolist()) if int(t) in old]
        if pairs:
            new_rows, old_rows = (torch.tensor(x) for x in zip(*pairs))
            draft.head.weight[new_rows] = source.head.weight[old_rows].to(draft.head.weight)
    return len(pairs)


def start_training(draft: nn.Module, cfg: DistillConfig, subset: list[int], ckpt_path: Path, log_path: Path,
                   resume: bool) -> tuple[torch.optim.Optimizer, torch.Generator, int]:
    """(optimizer, batch-sampler generator, step) for a fresh run, or restored from ``ckpt_path``
    when it was made with the same settings; the log is cut back to the resumed step."""
    optimizer = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    step = 0
    if not resume:
        ckpt_path.unlink(missing_ok=True)
    if ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=True)
        if ckpt["config"] != asdict(cfg) or ckpt["vocab_subset"] != subset:
            raise DynaTreeError(f"{ckpt_path} was made with other settings; pass resume=False "
                                "(--no-resume) or use another output folder")
        draft.load_state_dict(ckpt["draft"], strict=False)
        optimizer.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["generator"])
        torch.set_rng_state(ckpt["torch_rng"])
        step = int(ckpt["step"])
    _truncate_log(log_path, step)
    return optimizer, gen, step


def save_checkpoint(path: Path, step: int, cfg: DistillConfig, subset: list[int], draft: nn.Module,
                    optimizer: torch.optim.Optimizer, gen: torch.Generator) -> None:
    """Everything :func:`start_training` needs to resume exactly (atomic write)."""
    atomic_save({"step": step, "config": asdict(cfg), "vocab_subset": subset,
                  "draft": draft.trainable_state_dict(), "optimizer": optimizer.state_dict(),
                  "generator": gen.get_state(), "torch_rng": torch.get_rng_state()}, path)


def distill(target: nn.Module, tokenizer: Tokenizer, *, out_dir: str | os.PathLike[str],
            config: DistillConfig | None = None, target_name: str = DEFAULT_TARGET,
            documents: Sequence[Text] | None = None, resume: bool = True,
            progress: bool = True) -> Path:
    """Distil a draft for ``target``; returns the folder with the final weights and config.

    Steps, each cached in ``out_dir`` so an interrupted run picks up where it stopped:
    1. prompts from ``documents`` (default: the corpora named in the config), held-out by
       document (the same split as the bench's offline prompt sets);
    2. target labels: greedy continuations + top-k logits at every position (``data.pt``);
    3. vocabulary subset = the target's most frequent top-1 tokens on the training labels;
       weights from the target's first layers, or from the draft ``config.init`` names
       (:func:`warm_start`);
    4. AdamW on layers + norm + head, checkpointed every ``checkpoint_every`` steps with the
       optimizer and sampler RNG (``checkpoint.pt``, atomic), held-out agreement every
       ``eval_every`` steps, one JSON line per step in ``train_log.jsonl``;
    5. ``final/``: fp16 ``model.safetensors`` + ``config.json`` (+ ``metrics.json``).

    ``resume=False`` deletes the previous checkpoint and log (the labelled data is kept if it
    was made with the same data settings).
    """
    cfg = config or DistillConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    ckpt_path, log_path = out / CHECKPOINT_FILE, out / LOG_FILE
    source = load_distilled_draft(target, cfg.init) if cfg.init else None  # bad paths fail before labelling
    train, evals = labelled_sets(target, tokenizer, out, cfg, documents, progress)
    subset, dcfg = draft_config_for(target, tokenizer, train, cfg, target_name)
    draft = DistilledDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
    if source is not None:
        warm_start(draft, source)
    optimizer, gen, step = start_training(draft, cfg, subset, ckpt_path, log_path, resume)

    idx, probs = subset_targets(train, draft.vocab_subset.cpu(), dcfg.vocab_size)
    batches = _batches(train, idx, probs, cfg, gen)
    bar = progress_bar(total=cfg.steps, initial=step, desc="distilling", enabled=progress)
    t0 = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        while step < cfg.steps:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss, agree = _train_step(draft, optimizer, next(batches))
            step += 1
            end_step(log, bar, step, loss, agree, cfg, t0, lambda: evaluate(draft, evals),
                     lambda: save_checkpoint(ckpt_path, step, cfg, subset, draft, optimizer, gen))
    bar.close()
    return save_final(draft, out, train, cfg, evaluate(draft, evals))


def end_step(log: Any, bar: Any, step: int, loss: float, agree: float, cfg: DistillConfig, t0: float,
             score: Callable[[], Agreement], checkpoint: Callable[[], None]) -> None:
    """One JSON line per step (held-out ``score`` every ``eval_every``), the progress bar, and a
    checkpoint every ``checkpoint_every`` steps and at the last."""
    record: dict[str, Any] = {"step": step, "loss": round(loss, 5), "agree": round(agree, 5),
                              "lr": lr_at(step - 1, cfg), "seconds": round(time.monotonic() - t0, 2)}
    if step % cfg.eval_every == 0 or step == cfg.steps:
        record["eval"] = asdict(score())
    log.write(json.dumps(record) + "\n")
    log.flush()
    bar.update(1)
    bar.set_postfix(loss=f"{loss:.3f}", agree=f"{agree:.3f}")
    if step % cfg.checkpoint_every == 0 or step == cfg.steps:
        checkpoint()


def save_final(draft: DistilledDraft, out: Path, train: LabelledData, cfg: DistillConfig, score: Agreement) -> Path:
    """``final/``: the fp16 weights, config and held-out metrics."""
    final = save_draft(draft, out / FINAL_DIR)
    metrics = {"train_positions": int(train.valid.sum()), "eval": asdict(score), "config": asdict(cfg)}
    (final / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return final


# ---------------------------------------------------------------------------------------- CLI
# ------------------------------------------------------------------------------------ helpers
def _truncate_log(path: Path, step: int) -> None:
    """Drop log lines past the checkpoint being resumed (or all of them on a fresh start), so
    the log of a resumed run reads exactly like the log of an uninterrupted one."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
    with _atomic(path) as tmp:
        tmp.write_text("".join(ln + "\n" for ln in lines))


