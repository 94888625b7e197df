"""Training a distilled draft (:mod:`dynatree.distilled`) for a Llama-style target, offline.

Why this exists: on a CPU the draft's per-token cost decides whether speculation wins at all. The
obvious free drafts fail for the offline pair (SmolLM2-135M-Instruct): its first *k* layers plus the
LM head agree with the full model's greedy token only 6-51% of the time, and any draft that keeps
the full 49152-token head already costs about a quarter of a target step. So the draft has a few
layers of the target's width, initialised from its first layers, the shared frozen embedding, and
a reduced-vocabulary head initialised from the target's tied embedding rows.

It is trained to imitate the target where the target is actually used: teacher-forced top-k
next-token distributions of the target over offline prose prompts (the ``corpora`` setting:
Python's ``pydoc_data`` topics cleaned to prose paragraphs, the Debian licence texts, and the
Wikipedia / books corpora of :mod:`dynatree.corpora`) *and* over the target's own greedy
continuations of those prompts (both raw continuation and chat-formatted requests), because in
greedy speculative decoding every context the draft sees is target-generated text. Held-out
documents (:func:`dynatree.corpora.is_held_out`) never reach training.

Labelling (one target forward per position) is the cost that limits the draft on a CPU; every
step is resumable, and ``--device cuda`` runs labelling and training on a GPU.
"""

from __future__ import annotations

import glob
import json
import math
import os
import random
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from . import corpora
from .corpora import Text, is_held_out
from .distill_config import DEFAULT_TARGET, DistillConfig
from .distilled import DistilledDraft, DraftConfig, TargetFingerprint, _atomic, save_draft
from .errors import DynaTreeError

DATA_FILE = "data.pt"
CHECKPOINT_FILE = "checkpoint.pt"
LOG_FILE = "train_log.jsonl"
FINAL_DIR = "final"

#: Chat requests wrapped around prose passages; the answers are the target's natural chat output.
CHAT_INSTRUCTIONS = (
    "Continue the following text.",
    "Summarize the following text in a few sentences.",
    "Explain the following passage in simple words.",
    "What is the main point of this passage?",
)


# ---------------------------------------------------------------------------------- the corpus
_GRAMMAR = re.compile(r"::=|^\s*[|]|>>>|^\s*\.\.\.")


def _prose_paragraphs(text: str) -> list[str]:
    """Keep prose: no indented code or grammar blocks, no headings, mostly letters."""
    keep = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        first = lines[0]
        if first.startswith("   ") or any(_GRAMMAR.search(line) for line in lines):
            continue
        if re.fullmatch(r"[*=\-~^\s]+", lines[-1]):  # underlined heading
            continue
        para = " ".join(line.strip() for line in lines)
        para = re.sub(r"^\* ", "", para)
        para = re.sub(r"\*([^*\s][^*]*)\*", r"\1", para)
        letters = sum(ch.isalpha() or ch == " " for ch in para)
        if len(para) >= 80 and letters >= 0.8 * len(para):
            keep.append(para)
    return keep


_LOCAL_PREFIX = {"pydoc": "pydoc", "licences": "licence"}  # document-name prefix of offline_corpus()


def documents_for(names: str) -> list[Text]:
    """The documents of the comma-separated corpora ``names`` (pydoc, licences: always on the
    machine; wiki, books: fetched once from the package registries, see :mod:`dynatree.corpora`)."""
    wanted = names.split(",")
    prefixes = tuple(f"{_LOCAL_PREFIX[n]}/" for n in wanted if n in _LOCAL_PREFIX)
    docs = [d for d in offline_corpus() if d.name.startswith(prefixes)] if prefixes else []
    for name in ("wiki", "books"):
        if name in wanted:
            docs += corpora.load(name)
    return docs


def offline_corpus(licence_dir: str = "/usr/share/common-licenses") -> list[Text]:
    """Prose available on any machine without a network: pydoc topics and Debian licences.

    ``pydoc_data.topics`` is cleaned to prose paragraphs (raw, the target loops on grammar
    fragments); licence files are deduplicated through their symlinks. A missing licence folder
    (non-Debian systems) just means fewer documents.
    """
    import pydoc_data.topics as topics

    docs = []
    for name in sorted(topics.topics):
        paras = _prose_paragraphs(topics.topics[name])
        if paras:
            docs.append(Text(f"pydoc/{name}", "\n\n".join(paras)))
    seen: set[str] = set()
    for path in sorted(glob.glob(os.path.join(licence_dir, "*"))):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, encoding="utf-8", errors="replace") as fh:
            paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", fh.read())]
        paras = [p for p in paras if len(p) >= 40]
        docs.append(Text(f"licence/{os.path.basename(real)}", "\n\n".join(paras)))
    return docs


class Tokenizer(Protocol):
    """The slice of an HF tokenizer that prompt building uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass
class PromptSet:
    """Equal-length prompts, so target generation needs no padding: ``[n, prompt_tokens]``."""

    train: torch.Tensor
    eval: torch.Tensor
    train_chat: torch.Tensor  # bool per prompt: chat-formatted (True) or raw continuation
    eval_chat: torch.Tensor


def _chat_wrapper(tokenizer: Any, instruction: str) -> tuple[list[int], list[int]] | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    mark = "\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": f"{instruction}\n\n{mark}"}],
                                         tokenize=False, add_generation_prompt=True)
    before, after = text.split(mark)
    return (tokenizer.encode(before, add_special_tokens=False),
            tokenizer.encode(after, add_special_tokens=False))


def build_prompts(tokenizer: Tokenizer, documents: Sequence[Text], cfg: DistillConfig
                  ) -> PromptSet:
    """Cut documents into prompt windows of exactly ``prompt_tokens`` tokens.

    Raw prompts are a prose window; chat prompts are a shorter prose window inside the chat
    template with one of :data:`CHAT_INSTRUCTIONS` (only when the tokenizer has a chat template).
    Held-out documents (:func:`is_held_out`) only feed the evaluation prompts.
    """
    rng = random.Random(cfg.seed)
    p = cfg.prompt_tokens
    wrappers = [w for w in (_chat_wrapper(tokenizer, i) for i in CHAT_INSTRUCTIONS) if w]
    wrappers = [w for w in wrappers if p - len(w[0]) - len(w[1]) >= 16]
    pools: dict[tuple[bool, bool], list[list[int]]] = {(h, c): [] for h in (0, 1) for c in (0, 1)}
    for doc in documents:
        ids = tokenizer.encode(doc.text, add_special_tokens=False)
        held = is_held_out(doc.name, cfg.holdout_every)
        pools[(held, False)] += [ids[i:i + p] for i in range(0, len(ids) - p + 1, p)]
        for j, (pre, post) in enumerate(wrappers):
            w = p - len(pre) - len(post)
            # each instruction gets a different phase so chat passages do not repeat raw windows
            start = (j * w) // max(1, len(wrappers))
            pools[(held, True)] += [pre + ids[i:i + w] + post
                                    for i in range(start, len(ids) - w + 1, w * len(wrappers))]
    for pool in pools.values():
        rng.shuffle(pool)

    def take(held: bool, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        n_chat = round(n * cfg.chat_fraction) if pools[(held, True)] else 0
        chat, raw = pools[(held, True)][:n_chat], pools[(held, False)][:n - n_chat]
        if len(chat) + len(raw) < n:
            split = "held-out" if held else "training"
            raise DynaTreeError(f"the corpus yields only {len(chat) + len(raw)} {split} prompts of "
                                f"{p} tokens, {n} requested; lower the sequence count")
        seqs = chat + raw
        order = list(range(n))
        rng.shuffle(order)
        flags = torch.tensor([i < len(chat) for i in order])
        return torch.tensor([seqs[i] for i in order], dtype=torch.long), flags

    train, train_chat = take(False, cfg.train_sequences)
    evals, eval_chat = take(True, cfg.eval_sequences)
    return PromptSet(train, evals, train_chat, eval_chat)


# -------------------------------------------------------------------------------- target labels
@dataclass
class LabelledData:
    """Target-labelled sequences ``[n, L]`` with ``L = prompt_tokens + new_tokens``.

    ``topk_ids/topk_logits[s, t]`` are the target's top-k next-token predictions after
    ``tokens[s, :t+1]``; ``valid`` masks positions at or after a generated EOS; positions
    ``t >= prompt_tokens - 1`` predict target-generated tokens (what speculation is scored on).
    """

    tokens: torch.Tensor  # long [n, L]
    topk_ids: torch.Tensor  # long [n, L, k]
    topk_logits: torch.Tensor  # float16 [n, L, k]
    valid: torch.Tensor  # bool [n, L]
    chat: torch.Tensor  # bool [n]
    prompt_tokens: int

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def generated_mask(self) -> torch.Tensor:
        gen = torch.zeros_like(self.valid)
        gen[:, self.prompt_tokens - 1:] = True
        return gen & self.valid

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@torch.inference_mode()
def label_batch(target: nn.Module, prompts: torch.Tensor, new_tokens: int, top_k: int,
                eos_token_id: int | None) -> dict[str, torch.Tensor]:
    """Greedy-continue ``prompts`` with the target, keeping its top-k logits at every position.

    One prefill plus ``new_tokens`` cached decode steps: the labels of the generated part come for
    free from the decode steps, so no second teacher-forced pass is needed.
    """
    device = target.get_input_embeddings().weight.device
    ids = prompts.to(device)
    out = target(input_ids=ids, use_cache=True)
    logits = [out.logits.float()]
    cache = out.past_key_values
    tokens = [ids]
    for _ in range(new_tokens):
        nxt = logits[-1][:, -1:].argmax(-1)
        tokens.append(nxt)
        out = target(input_ids=nxt, past_key_values=cache, use_cache=True)
        logits.append(out.logits.float())
        cache = out.past_key_values
    all_logits = torch.cat(logits, dim=1)
    top = all_logits.topk(top_k, dim=-1)
    seq = torch.cat(tokens, dim=1)
    valid = torch.ones_like(seq, dtype=torch.bool)
    if eos_token_id is not None:
        p = prompts.shape[1]
        is_eos = seq[:, p:] == eos_token_id
        after = is_eos.long().cumsum(1) > 0  # at or after the first generated EOS
        valid[:, p:] = ~after
    return {"tokens": seq.cpu(), "topk_ids": top.indices.cpu(),
            "topk_logits": top.values.to(torch.float16).cpu(), "valid": valid.cpu()}


def label_prompts(target: nn.Module, prompts: torch.Tensor, chat: torch.Tensor,
                  cfg: DistillConfig, eos_token_id: int | None, *, partial: Path | None = None,
                  progress: bool = True, desc: str = "labelling") -> LabelledData:
    """:func:`label_batch` over all prompts in ``gen_batch`` chunks, resumable via ``partial``."""
    parts: list[dict[str, torch.Tensor]] = []
    if partial is not None and partial.is_file():
        saved = torch.load(partial, weights_only=True)
        if saved["key"] == json.dumps(cfg.data_key()) and torch.equal(saved["prompts"], prompts):
            parts = saved["parts"]
    starts = range(0, len(prompts), cfg.gen_batch)
    last_save = time.monotonic()
    bar = _progress(total=len(starts), initial=len(parts), desc=desc, enabled=progress)
    for i in list(starts)[len(parts):]:
        parts.append(label_batch(target, prompts[i:i + cfg.gen_batch], cfg.new_tokens, cfg.top_k,
                                 eos_token_id))
        bar.update(1)
        if partial is not None and (time.monotonic() - last_save > 60 or i == starts[-1]):
            _atomic_save({"key": json.dumps(cfg.data_key()), "prompts": prompts, "parts": parts},
                         partial)
            last_save = time.monotonic()
    bar.close()
    cat = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
    return LabelledData(chat=chat, prompt_tokens=cfg.prompt_tokens, **cat)


def choose_vocab_subset(data: LabelledData, size: int, always: Sequence[int] = ()) -> list[int]:
    """The ``size`` tokens the target predicts most often (top-1, valid positions) + ``always``."""
    vocab = int(data.topk_ids.max()) + 1
    counts = torch.bincount(data.topk_ids[..., 0][data.valid], minlength=vocab).double()
    # break ties (and fill beyond the observed tokens) with the top-k mass, then by id
    counts += 1e-3 * torch.bincount(data.topk_ids[data.valid].flatten(), minlength=vocab)
    chosen = set(int(t) for t in always)
    for t in torch.argsort(counts, descending=True, stable=True).tolist():
        if len(chosen) >= size:
            break
        chosen.add(int(t))
    return sorted(chosen)


# ------------------------------------------------------------------------------------- training
def _subset_targets(data: LabelledData, subset: torch.Tensor, vocab_size: int
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


def _train_step(draft: DistilledDraft, optimizer: torch.optim.Optimizer,
                batch: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    tokens, idx, probs, mask = (t.to(draft.device, non_blocking=True) for t in batch)
    draft.train()
    loss, agree = distill_loss(draft.subset_logits(tokens), idx, probs, mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach()), float(agree)


def _lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of ``lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))


def _batches(data: LabelledData, idx: torch.Tensor, probs: torch.Tensor, cfg: DistillConfig,
             gen: torch.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    """Random windows of ``seq_len`` from random sequences; the generator state is checkpointed."""
    length = data.tokens.shape[1]
    while True:
        rows = torch.randint(len(data), (cfg.batch,), generator=gen)
        start = torch.randint(length - cfg.seq_len + 1, (cfg.batch,), generator=gen)
        cols = start[:, None] + torch.arange(cfg.seq_len)
        r = rows[:, None]
        yield data.tokens[r, cols], idx[r, cols], probs[r, cols], data.valid[r, cols]


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


@torch.inference_mode()
def evaluate(draft: nn.Module, data: LabelledData, *, spec_k: int = 4) -> Agreement:
    """Greedy agreement of ``draft`` (any HF-style causal LM) with the target's labels.

    Under greedy speculation the draft always sees the target's own text, so teacher forcing on
    the target's greedy continuation is exact, and so is the linear-speculation simulation: a
    round starting at position t accepts the run of matches from t (at most K) plus one token.
    """
    draft.eval()
    match = []
    device = next(draft.parameters()).device
    for i in range(0, len(data), 8):
        logits = draft(input_ids=data.tokens[i:i + 8].to(device)).logits
        match.append(logits.argmax(-1).cpu() == data.topk_ids[i:i + 8, :, 0])
    hit = torch.cat(match)
    gen = data.generated_mask()
    prompt = data.valid & ~gen
    subset = getattr(draft, "vocab_subset", None)
    if subset is not None:
        inside = torch.isin(data.topk_ids[..., 0], subset.cpu())
    else:
        inside = torch.ones_like(hit)

    def rate(m: torch.Tensor) -> float:
        return float(hit[m].float().mean()) if m.any() else float("nan")

    rounds = tokens = 0
    for s in range(len(data)):
        pos = torch.nonzero(gen[s]).flatten()
        m = hit[s, pos].tolist()
        t = 0
        while t < len(m):
            run = 0
            while run < spec_k and t + run < len(m) and m[t + run]:
                run += 1
            step = min(run + 1, len(m) - t)
            rounds, tokens, t = rounds + 1, tokens + step, t + step
    chat = data.chat[:, None].expand_as(gen)
    return Agreement(
        generated=rate(gen), prompt=rate(prompt), coverage=float(inside[gen].float().mean()),
        linear_k4_tokens=tokens / max(1, rounds), chat_generated=rate(gen & chat),
        raw_generated=rate(gen & ~chat), positions=int(gen.sum()))


def labelled_data(target: nn.Module, tokenizer: Tokenizer, out: Path, cfg: DistillConfig,
                  documents: Sequence[Text] | None = None, progress: bool = True
                  ) -> tuple[LabelledData, LabelledData]:
    """Steps 1-2 of :func:`distill`: (train, held-out) target labels, from ``data.pt`` when it was
    made with the same data settings for the same target, else built and labelled (resumable)."""
    data_path = out / DATA_FILE
    key = json.dumps(cfg.data_key())
    fingerprint = TargetFingerprint.of(target.get_input_embeddings().weight)
    train = evals = None

    if data_path.is_file():
        saved = torch.load(data_path, weights_only=True)
        if saved["key"] == key and TargetFingerprint(**saved["fingerprint"]).matches(fingerprint):
            train, evals = LabelledData(**saved["train"]), LabelledData(**saved["eval"])
    if train is None or evals is None:
        prompts = build_prompts(tokenizer, documents if documents is not None
                                else documents_for(cfg.corpora), cfg)
        eos = tokenizer.eos_token_id
        # held-out first: it is small, and an interrupted run can already score other drafts on it
        evals = label_prompts(target, prompts.eval, prompts.eval_chat, cfg, eos,
                              partial=out / "eval.partial.pt", progress=progress,
                              desc="target labels (held-out)")
        train = label_prompts(target, prompts.train, prompts.train_chat, cfg, eos,
                              partial=out / "data.partial.pt", progress=progress,
                              desc="target labels (train)")
        _atomic_save({"key": key, "fingerprint": asdict(fingerprint),
                      "train": train.as_dict(), "eval": evals.as_dict()}, data_path)
        for name in ("eval.partial.pt", "data.partial.pt"):  # the complete data is in data.pt
            (out / name).unlink(missing_ok=True)

    return train, evals


def _draft_config(target: nn.Module, tokenizer: Tokenizer, train: LabelledData, cfg: DistillConfig,
                  target_name: str, kind: str = "independent") -> tuple[list[int], DraftConfig]:
    """Step 3: the vocabulary subset (+ EOS) and the draft's architecture."""
    always = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    subset = choose_vocab_subset(train, cfg.vocab_subset, always)
    return subset, DraftConfig.from_target(target, name=target_name, layers=cfg.layers, vocab_subset=subset,
                                           kind=kind)


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
    train, evals = labelled_data(target, tokenizer, out, cfg, documents, progress)
    subset, dcfg = _draft_config(target, tokenizer, train, cfg, target_name)
    draft = DistilledDraft(dcfg, target.get_input_embeddings()).float()
    draft.init_from_target(target)
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

    idx, probs = _subset_targets(train, draft.vocab_subset.cpu(), dcfg.vocab_size)
    batches = _batches(train, idx, probs, cfg, gen)
    bar = _progress(total=cfg.steps, initial=step, desc="distilling", enabled=progress)
    t0 = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        while step < cfg.steps:
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, cfg)
            loss, agree = _train_step(draft, optimizer, next(batches))
            step += 1
            record: dict[str, Any] = {"step": step, "loss": round(loss, 5),
                                      "agree": round(agree, 5), "lr": _lr_at(step - 1, cfg),
                                      "seconds": round(time.monotonic() - t0, 2)}
            if step % cfg.eval_every == 0 or step == cfg.steps:
                record["eval"] = asdict(evaluate(draft, evals))
            log.write(json.dumps(record) + "\n")
            log.flush()
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", agree=f"{agree:.3f}")
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                _atomic_save({"step": step, "config": asdict(cfg), "vocab_subset": subset,
                              "draft": draft.trainable_state_dict(),
                              "optimizer": optimizer.state_dict(), "generator": gen.get_state(),
                              "torch_rng": torch.get_rng_state()}, ckpt_path)
    bar.close()

    final = save_draft(draft, out / FINAL_DIR)
    metrics = {"train_positions": int(train.valid.sum()), "eval": asdict(evaluate(draft, evals)),
               "config": asdict(cfg)}
    (final / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return final


# ---------------------------------------------------------------------------------------- CLI
def distill_with_target(target: str, cfg: DistillConfig, *, out: Path, resume: bool = True,
                        device: str = "cpu", progress: bool = True) -> tuple[Path, dict[str, Any]]:
    """Load ``target`` (a preset, path or hub id) on ``device`` and run :func:`distill`; returns the
    final folder and its held-out metrics. What ``dynatree distill`` runs."""
    from .models import load_model  # local: model loading pulls in optional dependencies

    model, tokenizer = load_model(target, device=device)  # checks the device first (one-line errors)
    train = distill
    if cfg.kind == "feature":
        from .distill_features import distill_features as train  # builds on this module

    final = train(model, tokenizer, out_dir=out, config=cfg, target_name=target, resume=resume, progress=progress)
    return final, json.loads((final / "metrics.json").read_text())["eval"]


# ------------------------------------------------------------------------------------ helpers
def _truncate_log(path: Path, step: int) -> None:
    """Drop log lines past the checkpoint being resumed (or all of them on a fresh start), so
    the log of a resumed run reads exactly like the log of an uninterrupted one."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
    with _atomic(path) as tmp:
        tmp.write_text("".join(ln + "\n" for ln in lines))


def _atomic_save(obj: Any, path: Path) -> None:
    with _atomic(path) as tmp:
        torch.save(obj, tmp)


def _progress(*, total: int, initial: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)
