"""What the CLI tests share: tiny model pairs saved as HF folders, the environment of a ``python -m
dynatree`` subprocess, the ``error:`` lines of an output, and the target's own greedy reply.

The ``model_dirs`` fixture (``tests/conftest.py``) is :func:`save_pair` over a tiny Llama.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dynatree.integrations.chat import chat_eos
from tiny import perturbed
from tiny_tok import tiny_tokenizer

SRC = Path(__file__).resolve().parents[1] / "src"


def save_model(folder: Path, model: torch.nn.Module, tok=None) -> Path:
    """``model`` and its tokenizer (default: the tiny chat-template one) saved as one HF folder."""
    model.save_pretrained(folder)
    (tok or tiny_tokenizer()).save_pretrained(folder)
    return folder


def save_pair(root: Path, target: torch.nn.Module, draft: torch.nn.Module | None = None,
              tok=None) -> tuple[Path, Path]:
    """``root/target`` and ``root/draft`` (default: a perturbed copy of the target), each with the
    tokenizer, for ``--target`` and ``--draft``."""
    draft = perturbed(target) if draft is None else draft
    return save_model(root / "target", target, tok), save_model(root / "draft", draft, tok)


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a ``python -m dynatree`` child: this checkout's sources, no hub access."""
    return {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", **extra}


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def reference_reply(target: torch.nn.Module, ids: list[int], tok, n: int) -> str:
    """The target's greedy reply of at most ``n`` tokens to ``ids``, ended by the chat's end token."""
    out = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, eos_token_id=chat_eos(target, tok),
                          pad_token_id=0)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)
