"""What a distilled draft is trained on: prompts from the offline corpora, held out by document,
and the target's labels for them (greedy continuations with top-k logits at every position).

Labelling (one target forward per position) is the cost that limits the draft on a CPU; it is
resumable through partial files and its result is cached in ``data.pt`` per data settings.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from dynatree.text import corpora
from dynatree.text import prose
from dynatree.text.corpora import Text, is_held_out
from dynatree.training.config import DistillConfig
from dynatree.training.split import HeldOutText, held_out_anywhere, pieces
from dynatree.drafts.distilled import _atomic
from dynatree.errors import DynaTreeError

DATA_FILE = "data.pt"

#: Chat requests wrapped around prose passages; the answers are the target's natural chat output.
CHAT_INSTRUCTIONS = (
    "Continue the following text.",
    "Summarize the following text in a few sentences.",
    "Explain the following passage in simple words.",
    "What is the main point of this passage?",
)


# ---------------------------------------------------------------------------------- the corpus
_LOCAL_PREFIX = {"pydoc": "pydoc", "licences": "licence"}  # document-name prefix of offline_corpus()


def documents_for(names: str | Sequence[str]) -> list[Text]:
    """The documents of the corpora ``names`` (comma-separated or a list; pydoc, licences: always on
    the machine; wiki, books: fetched once from the package registries, see :mod:`dynatree.text.corpora`)."""
    wanted = names.split(",") if isinstance(names, str) else list(names)
    prefixes = tuple(f"{_LOCAL_PREFIX[n]}/" for n in wanted if n in _LOCAL_PREFIX)
    docs = [d for d in offline_corpus() if d.name.startswith(prefixes)] if prefixes else []
    for name in ("wiki", "books"):
        if name in wanted:
            docs += corpora.load(name)
    return docs


def offline_corpus(licence_dir: str | Path = corpora.LICENCES_DIR) -> list[Text]:
    """Prose available on any machine without a network: pydoc topics (by name) and Debian licences,
    kept by the training filter of :mod:`dynatree.text.prose`. Without the licence folder (non-Debian
    systems) there are just fewer documents."""
    pydoc = sorted(corpora.pydoc_texts(), key=lambda t: t.name)
    docs = [Text(t.name, "\n\n".join(paras)) for t in pydoc if (paras := prose.training_paragraphs(t.text))]
    return docs + [Text(t.name, "\n\n".join(prose.licence_paragraphs(t.text)))
                   for t in corpora.licence_texts(Path(licence_dir))]


class Tokenizer(Protocol):
    """The slice of an HF tokenizer that prompt building uses."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass
class PromptWindows:
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
                  ) -> PromptWindows:
    """Cut documents into prompt windows of exactly ``prompt_tokens`` tokens.

    Raw prompts are a prose window; chat prompts are a shorter prose window inside the chat
    template with one of :data:`CHAT_INSTRUCTIONS` (only when the tokenizer has a chat template).
    Held-out documents (:func:`is_held_out`) only feed the evaluation prompts; documents the bench
    holds out never feed training, and training documents are cut around every paragraph that
    shares text with a held-out one (:func:`training_documents`).
    """
    rng = random.Random(cfg.seed)
    p = cfg.prompt_tokens
    wrappers = [w for w in (_chat_wrapper(tokenizer, i) for i in CHAT_INSTRUCTIONS) if w]
    wrappers = [w for w in wrappers if p - len(w[0]) - len(w[1]) >= 16]
    pools: dict[tuple[bool, bool], list[list[int]]] = {(h, c): [] for h in (0, 1) for c in (0, 1)}
    for doc, held in training_documents(documents, cfg.holdout_every):
        ids = tokenizer.encode(doc.text, add_special_tokens=False)
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
    return PromptWindows(train, evals, train_chat, eval_chat)


def training_documents(documents: Sequence[Text], holdout_every: int) -> list[tuple[Text, bool]]:
    """(document, held out) pairs: held-out documents whole; training documents (held out neither
    by ``holdout_every`` nor by the bench's rule) cut into pieces around every paragraph that shares
    a 60-character run with held-out text (:mod:`dynatree.training.split`); the rest dropped.

    Splitting by name alone leaked: the training topic ``pydoc/assignment`` repeats paragraphs of
    the held-out ``pydoc/augassign``, ``pydoc/compound`` those of ``pydoc/async``, GPL-3 some of GFDL.
    """
    guard = HeldOutText(d.text for d in documents if held_out_anywhere(d.name, holdout_every))
    out = []
    for doc in documents:
        if is_held_out(doc.name, holdout_every):
            out.append((doc, True))
        elif not held_out_anywhere(doc.name, holdout_every):
            out += [(Text(doc.name, "\n\n".join(p)), False) for p in pieces(doc.text.split("\n\n"), guard)]
    return out


# -------------------------------------------------------------------------------- target labels
@dataclass
class LabelledData:
    """Target-labelled sequences ``[n, L]`` with ``L = prompt_tokens + new_tokens``.

    ``topk_ids/topk_logits[s, t]`` are the target's top-k next-token predictions after
    ``tokens[s, :t+1]``; ``valid`` masks positions at or after a generated EOS (and padding);
    positions ``t >= prompt_tokens - 1`` predict target-generated tokens (what speculation is
    scored on), or ``t >= gen_start[s]`` when rows differ.

    Instruct prompts differ in length: their rows are left-padded, ``start[s]`` is the first
    column of row ``s`` (earlier columns are padding, never valid, never attended to in training),
    and ``kind[s]`` indexes :data:`dynatree.training.instruct.KINDS` (None for continuation data).
    """

    tokens: torch.Tensor  # long [n, L]
    topk_ids: torch.Tensor  # long [n, L, k]
    topk_logits: torch.Tensor  # float16 [n, L, k]
    valid: torch.Tensor  # bool [n, L]
    chat: torch.Tensor  # bool [n]
    prompt_tokens: int
    start: torch.Tensor | None = None  # long [n]: first non-padding column
    gen_start: torch.Tensor | None = None  # long [n]: first column predicting a generated token
    kind: torch.Tensor | None = None  # long [n]: index into instruct.KINDS

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def generated_mask(self) -> torch.Tensor:
        if self.gen_start is not None:
            cols = torch.arange(self.tokens.shape[1])
            return (cols[None, :] >= self.gen_start[:, None]) & self.valid
        gen = torch.zeros_like(self.valid)
        gen[:, self.prompt_tokens - 1:] = True
        return gen & self.valid

    def real_mask(self) -> torch.Tensor | None:
        """Non-padding columns ``[n, L]``, or None when no row is padded."""
        if self.start is None or not bool((self.start > 0).any()):
            return None
        return torch.arange(self.tokens.shape[1])[None, :] >= self.start[:, None]

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
    key = json.dumps({**cfg.data_key(), "gen_batch": cfg.gen_batch})  # parts are gen_batch rows each
    if partial is not None and partial.is_file():
        saved = torch.load(partial, weights_only=True)
        if saved["key"] == key and torch.equal(saved["prompts"], prompts):
            parts = saved["parts"]
    starts = range(0, len(prompts), cfg.gen_batch)
    last_save = time.monotonic()
    bar = progress_bar(total=len(starts), initial=len(parts), desc=desc, enabled=progress)
    for i in list(starts)[len(parts):]:
        parts.append(label_batch(target, prompts[i:i + cfg.gen_batch], cfg.new_tokens, cfg.top_k,
                                 eos_token_id))
        bar.update(1)
        if partial is not None and (time.monotonic() - last_save > 60 or i == starts[-1]):
            atomic_save({"key": key, "prompts": prompts, "parts": parts}, partial)
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


def label_continuation(target: nn.Module, tokenizer: Tokenizer, out: Path, cfg: DistillConfig,
                       documents: Sequence[Text] | None = None, progress: bool = True
                       ) -> tuple[LabelledData, LabelledData]:
    """(train, held-out) continuation labels: prompt windows of the corpora, greedily continued by
    the target; resumable through partial files in ``out`` (cached by
    :func:`dynatree.training.labels.labelled_sets`)."""
    prompts = build_prompts(tokenizer, documents if documents is not None
                            else documents_for(cfg.corpus_names()), cfg)
    eos = tokenizer.eos_token_id
    # held-out first: it is small, and an interrupted run can already score other drafts on it
    evals = label_prompts(target, prompts.eval, prompts.eval_chat, cfg, eos,
                          partial=out / "eval.partial.pt", progress=progress,
                          desc="target labels (held-out)")
    train = label_prompts(target, prompts.train, prompts.train_chat, cfg, eos,
                          partial=out / "data.partial.pt", progress=progress,
                          desc="target labels (train)")
    return train, evals


def pad_left(data: LabelledData, length: int) -> LabelledData:
    """``data`` with its rows left-padded to ``length`` columns (padding: token 0, never valid),
    ``start`` / ``gen_start`` moved with them."""
    n, have = data.tokens.shape
    shift = length - have
    if shift < 0:
        raise ValueError(f"cannot pad {have} columns to {length}")
    start = data.start if data.start is not None else torch.zeros(n, dtype=torch.long)
    gen = data.gen_start if data.gen_start is not None else torch.full((n,), data.prompt_tokens - 1)
    if shift == 0:
        return LabelledData(**{**data.as_dict(), "start": start, "gen_start": gen})

    def left(t: torch.Tensor) -> torch.Tensor:
        pad = t.new_zeros((n, shift, *t.shape[2:]))
        return torch.cat([pad, t], dim=1)

    return LabelledData(tokens=left(data.tokens), topk_ids=left(data.topk_ids), topk_logits=left(data.topk_logits),
                        valid=left(data.valid), chat=data.chat, prompt_tokens=data.prompt_tokens + shift,
                        start=start + shift, gen_start=gen + shift, kind=data.kind)


def concat(parts: Sequence[LabelledData]) -> LabelledData:
    """Rows of several labelled sets in one, left-padded to the longest (one part: itself)."""
    if len(parts) == 1:
        return parts[0]
    length = max(p.tokens.shape[1] for p in parts)
    padded = [pad_left(p, length) for p in parts]
    kinds = [p.kind if p.kind is not None else torch.zeros(len(p), dtype=torch.long) for p in padded]
    fields = ("tokens", "topk_ids", "topk_logits", "valid", "chat", "start", "gen_start")
    cat = {f: torch.cat([getattr(p, f) for p in padded]) for f in fields}
    return LabelledData(**cat, kind=torch.cat(kinds), prompt_tokens=max(p.prompt_tokens for p in padded))


def atomic_save(obj: Any, path: Path) -> None:
    with _atomic(path) as tmp:
        torch.save(obj, tmp)


def progress_bar(*, total: int, initial: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)

