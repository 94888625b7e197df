"""The settings that decide a distilled draft's weights (no torch here: the CLI reads its defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynatree.errors import DynaTreeError

CORPUS_NAMES = ("pydoc", "licences", "wiki", "books")
DATA_KINDS = ("continuation", "instruct", "mix")
#: The corpora each kind of data reads when ``corpora`` is left empty: instruct data is built from
#: what every machine has (the standard library always adds its docstrings and code).
DEFAULT_CORPORA = {"continuation": "pydoc,licences,wiki,books", "instruct": "pydoc,licences",
                   "mix": "pydoc,licences"}
#: Bumped when the prompts a data setting yields change, so labelled data made before is rebuilt:
#: 2 = training text cut around text it shares with held-out documents (pydoc topics repeat one
#: another), and documents the bench holds out kept out of training whatever ``holdout_every`` is.
DATA_VERSION = 2


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
    #: comma-separated subset of CORPUS_NAMES; "" = DEFAULT_CORPORA of ``data``
    corpora: str = ""
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
    #: The weight of the feature regression (the head's output against the target's final hidden
    #: state); None = 1.0 when the head reads the final hidden state, 0 when it reads fused layers
    #: (EAGLE-3 drops the regression there: the head's own output no longer has a target to match).
    feature_weight: float | None = None
    #: Feature drafts: what the head reads of the target. "auto" (the default for feature drafts,
    #: filled in from "") = a low, a middle and a high layer fused (EAGLE-3: the outputs of decoder
    #: layers 2, N/2 and N-3 of N), which agreed 4.6 points more often on instruct answers than the
    #: final hidden state alone (2-core AMD EPYC VM); "final" = the final hidden state
    #: (EAGLE); or comma-separated layer numbers (1 .. N-1; layer i's output).
    feature_layers: str = ""
    #: What the draft learns from (:mod:`dynatree.training.instruct`): "continuation" (the target's
    #: continuations of prose windows, half of them chat-wrapped), "instruct" (the target's answers
    #: to requests through its chat template) or "mix" (``instruct_fraction`` of the sequences
    #: instruct, the rest continuation).
    data: str = "continuation"
    max_prompt_tokens: int = 448  # instruct: longer rendered prompts are skipped, not cut
    answer_tokens: int = 128  # instruct: tokens of each answer at most
    sample_fraction: float = 0.25  # instruct: answers sampled at sample_temperature (diversity)
    sample_temperature: float = 0.8
    followup_fraction: float = 0.1  # instruct: second-turn requests after the target's own answer
    instruct_fraction: float = 0.5  # mix only
    #: A draft folder (independent kind, same ``layers``) to start from instead of the target's
    #: first layers: fine-tuning a draft trained on one kind of text on another keeps what the
    #: first run paid for (a GPU run's instruct answers, say) while the new data adds the rest.
    init: str = ""

    def corpus_names(self) -> list[str]:
        """The corpora this config reads (``corpora``, or the default of its data kind)."""
        return (self.corpora or DEFAULT_CORPORA.get(self.data, DEFAULT_CORPORA["continuation"])).split(",")

    def sequence_length(self) -> int:
        """Tokens per labelled sequence: prompt + new tokens (continuation), at most the longest
        prompt + answer (instruct; mix: the longer of both)."""
        instruct = self.max_prompt_tokens + self.answer_tokens
        cont = self.prompt_tokens + self.new_tokens
        return {"continuation": cont, "instruct": instruct}.get(self.data, max(cont, instruct))

    def __post_init__(self) -> None:
        positive = ("layers", "vocab_subset", "steps", "batch", "seq_len", "top_k",
                    "prompt_tokens", "new_tokens", "train_sequences", "eval_sequences",
                    "gen_batch", "holdout_every", "checkpoint_every", "eval_every", "max_prompt_tokens",
                    "answer_tokens")
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise DynaTreeError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not self.lr > 0 or self.warmup < 0 or self.weight_decay < 0:
            raise DynaTreeError("lr must be > 0; warmup and weight_decay must be >= 0")
        if not 0.0 <= self.chat_fraction <= 1.0:
            raise DynaTreeError(f"chat_fraction must lie in [0, 1], got {self.chat_fraction}")
        if self.data not in DATA_KINDS:
            raise DynaTreeError(f"data must be one of {', '.join(DATA_KINDS)}, got {self.data!r}")
        for name in ("sample_fraction", "followup_fraction", "instruct_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise DynaTreeError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if not self.sample_temperature > 0:
            raise DynaTreeError(f"sample_temperature must be > 0, got {self.sample_temperature}")
        if self.data == "continuation" and self.seq_len > self.prompt_tokens + self.new_tokens:
            raise DynaTreeError(f"seq_len ({self.seq_len}) cannot exceed prompt_tokens + new_tokens "
                                f"({self.prompt_tokens + self.new_tokens}): every labelled "
                                "sequence has exactly that length")
        if self.seq_len > self.sequence_length():
            raise DynaTreeError(f"seq_len ({self.seq_len}) cannot exceed max_prompt_tokens + answer_tokens "
                                f"({self.sequence_length()}), the longest labelled sequence")
        unknown = set(self.corpus_names()) - set(CORPUS_NAMES)
        if unknown:
            raise DynaTreeError(f"corpora must be a comma-separated subset of {','.join(CORPUS_NAMES)}, "
                                f"got {self.corpora!r}")
        if self.kind not in ("independent", "feature"):
            raise DynaTreeError(f"kind must be 'independent' or 'feature', got {self.kind!r}")
        if self.unroll < 1 or (self.feature_weight is not None and self.feature_weight < 0):
            raise DynaTreeError("unroll must be >= 1 and feature_weight >= 0")
        if self.kind == "feature" and not self.feature_layers:
            object.__setattr__(self, "feature_layers", "auto")  # (frozen) the measured better default
        if self.feature_layers:
            if self.kind != "feature":
                raise DynaTreeError("feature_layers is for feature drafts (--kind feature)")
            if self.feature_layers not in ("auto", "final") and not all(
                    p.strip().isdigit() and int(p) >= 1 for p in self.feature_layers.split(",")):
                raise DynaTreeError(f"feature_layers must be 'auto', 'final' or comma-separated layer numbers "
                                    f">= 1, got {self.feature_layers!r}")
            if self.feature_weight and self.feature_layers != "final":
                raise DynaTreeError("the feature regression needs the target's final hidden state, which a head "
                                    "reading fused layers does not predict: leave feature_weight at 0")
        if self.init and self.kind != "independent":
            raise DynaTreeError("init (a draft folder to start from) works for independent drafts only")
        if self.holdout_every < 2:
            raise DynaTreeError("holdout_every must be >= 2 (1 would hold out every document)")

    def regression_weight(self) -> float:
        """The feature regression's weight (``feature_weight``, or its default for ``feature_layers``)."""
        if self.feature_weight is not None:
            return self.feature_weight
        return 0.0 if self.feature_layers not in ("", "final") else 1.0

    def data_key(self) -> dict[str, Any]:
        """The fields that decide the labelled data: ``data.pt`` is reused when they are equal."""
        keys = ["top_k", "train_sequences", "eval_sequences", "holdout_every", "seed", "data"]
        if self.data != "instruct":
            keys += ["prompt_tokens", "new_tokens", "chat_fraction"]
        if self.data != "continuation":
            keys += ["max_prompt_tokens", "answer_tokens", "sample_fraction", "sample_temperature",
                     "followup_fraction"]
        if self.data == "mix":
            keys.append("instruct_fraction")
        return {"corpora": ",".join(self.corpus_names()), "version": DATA_VERSION,
                **{k: getattr(self, k) for k in keys}}
