"""The settings that decide a distilled draft's weights (no torch here: the CLI reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynatree.errors import DynaTreeError

CORPUS_NAMES = ("pydoc", "licences", "wiki", "books")


@dataclass(frozen=True)
class DistillConfig:
    """Everything that decides the trained weights (data, architecture, optimisation).

    A checkpoint is only resumed when its ``DistillConfig`` equals the current one; the labelled
    data file is reused when the data fields (:meth:`data_key`) are equal.
    """

    layers: int = 2
    vocab_subset: int = 4096
    steps: int = 500
    batch: int = 16
    seq_len: int = 160
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    top_k: int = 8
    corpora: str = "pydoc,licences,wiki,books"  # comma-separated, see distill.documents_for()
    prompt_tokens: int = 96
    new_tokens: int = 64
    train_sequences: int = 2048
    eval_sequences: int = 128
    chat_fraction: float = 0.5
    gen_batch: int = 32
    holdout_every: int = 8
    checkpoint_every: int = 50
    eval_every: int = 100
    seed: int = 0
    #: "independent" (tokens only, :mod:`dynatree.drafts.distilled`) or "feature" (reads the target's
    #: hidden states, :mod:`dynatree.drafts.feature_head`; trained by :mod:`dynatree.training.features`).
    kind: str = "independent"
    #: feature drafts: tree levels trained per step (level d reads the head's own predictions of
    #: levels < d, as deeper tree levels do at run time), and the weight of the feature regression.
    unroll: int = 3
    feature_weight: float = 1.0

    def __post_init__(self) -> None:
        positive = ("layers", "vocab_subset", "steps", "batch", "seq_len", "top_k",
                    "prompt_tokens", "new_tokens", "train_sequences", "eval_sequences",
                    "gen_batch", "holdout_every", "checkpoint_every", "eval_every")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise DynaTreeError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not self.lr > 0 or self.warmup < 0 or self.weight_decay < 0:
            raise DynaTreeError("lr must be > 0; warmup and weight_decay must be >= 0")
        if not 0.0 <= self.chat_fraction <= 1.0:
            raise DynaTreeError(f"chat_fraction must lie in [0, 1], got {self.chat_fraction}")
        if self.seq_len > self.prompt_tokens + self.new_tokens:
            raise DynaTreeError(f"seq_len ({self.seq_len}) cannot exceed prompt_tokens + new_tokens "
                                f"({self.prompt_tokens + self.new_tokens}): every labelled "
                                "sequence has exactly that length")
        unknown = set(self.corpora.split(",")) - set(CORPUS_NAMES)
        if unknown or not self.corpora:
            raise DynaTreeError(f"corpora must be a comma-separated subset of {','.join(CORPUS_NAMES)}, "
                                f"got {self.corpora!r}")
        if self.kind not in ("independent", "feature"):
            raise DynaTreeError(f"kind must be 'independent' or 'feature', got {self.kind!r}")
        if self.unroll < 1 or self.feature_weight < 0:
            raise DynaTreeError("unroll must be >= 1 and feature_weight >= 0")
        if self.holdout_every < 2:
            raise DynaTreeError("holdout_every must be >= 2 (1 would hold out every document)")

    def data_key(self) -> dict[str, Any]:
        keys = ("corpora", "top_k", "prompt_tokens", "new_tokens", "train_sequences", "eval_sequences",
                "chat_fraction", "holdout_every", "seed")
        return {k: getattr(self, k) for k in keys}
