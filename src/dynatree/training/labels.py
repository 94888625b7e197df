"""Steps 1-2 of distillation for every kind of data: the (train, held-out) target labels, from
``data.pt`` when it was made with the same data settings for the same target, else built and
labelled (resumable through partial files): continuation windows (:mod:`dynatree.training.data`),
instruct requests (:mod:`dynatree.training.instruct`) or a mix of both.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynatree.drafts.distilled import TargetFingerprint
from dynatree.text.corpora import Text
from dynatree.training import instruct
from dynatree.training.config import DistillConfig
from dynatree.training.data import DATA_FILE, LabelledData, Tokenizer, atomic_save, concat, label_continuation


def stamp(cfg: DistillConfig, target: nn.Module, **extra: Any) -> dict[str, Any]:
    """What a cached file of labels or features is valid for: the data settings (and any ``extra``
    setting the file depends on) and the target's weights (a fingerprint of its embeddings). Saved
    beside the payload."""
    fingerprint = TargetFingerprint.of(target.get_input_embeddings().weight)
    return {"key": json.dumps({**cfg.data_key(), **extra}), "fingerprint": asdict(fingerprint)}


def load_stamped(path: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The file at ``path`` if it was saved under the ``wanted`` stamp, else None (made again)."""
    if not path.is_file():
        return None
    saved = torch.load(path, weights_only=True)
    fingerprint = TargetFingerprint(**wanted["fingerprint"])
    if saved["key"] == wanted["key"] and TargetFingerprint(**saved["fingerprint"]).matches(fingerprint):
        return saved
    return None


def labelled_sets(target: nn.Module, tokenizer: Tokenizer, out: Path, cfg: DistillConfig,
                  documents: Sequence[Text] | None = None, progress: bool = True,
                  log: Callable[[str], None] = print) -> tuple[LabelledData, LabelledData]:
    """(train, held-out) labels of ``cfg.data``; ``documents`` replaces the corpora of continuation
    data (tests). Cached in ``out/data.pt`` under :meth:`DistillConfig.data_key`."""
    out.mkdir(parents=True, exist_ok=True)
    data_path = out / DATA_FILE
    wanted = stamp(cfg, target)
    saved = load_stamped(data_path, wanted)
    if saved is not None:
        return LabelledData(**saved["train"]), LabelledData(**saved["eval"])

    if cfg.data == "continuation":
        train, evals = label_continuation(target, tokenizer, out, cfg, documents, progress)
    elif cfg.data == "instruct":
        evals = instruct.label_instruct_side(target, tokenizer, cfg, cfg.eval_sequences, True, out, progress, log)
        train = instruct.label_instruct_side(target, tokenizer, cfg, cfg.train_sequences, False, out, progress, log)
    else:  # mix: instruct_fraction of each side instruct, the rest continuation
        n_train = round(cfg.train_sequences * cfg.instruct_fraction)
        n_eval = round(cfg.eval_sequences * cfg.instruct_fraction)
        cont: tuple[LabelledData, ...] = ()
        if n_train < cfg.train_sequences and n_eval < cfg.eval_sequences:
            cont_cfg = dataclasses.replace(
                cfg, data="continuation", corpora=",".join(cfg.corpus_names()),
                seq_len=min(cfg.seq_len, cfg.prompt_tokens + cfg.new_tokens),
                train_sequences=cfg.train_sequences - n_train, eval_sequences=cfg.eval_sequences - n_eval)
            cont = label_continuation(target, tokenizer, out, cont_cfg, documents, progress)
        sides = []
        for i, (n, held) in enumerate(((n_train, False), (n_eval, True))):
            parts = [cont[i]] if cont else []
            if n > 0:
                parts.append(instruct.label_instruct_side(target, tokenizer, cfg, n, held, out, progress, log))
            sides.append(concat(parts))
        train, evals = sides
    atomic_save({**wanted, "train": train.as_dict(), "eval": evals.as_dict()},
                data_path)
    for partial in out.glob("*.partial.pt"):  # the complete data is in data.pt
        partial.unlink(missing_ok=True)
    return train, evals
