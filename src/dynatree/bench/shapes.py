"""Random-weight models of real models' shapes: what a model of that size costs, without its weights.

What a verify of so many rows costs, which kernels the few-row plan picks and which tree budget the
defaults choose depend on a model's shapes (hidden size, layers, MLP width, heads, vocabulary) and
the machine, not on the values of its weights. So a user who plans to run a 1.5B or 8B model can
see its cost curve and budget on their own machine from a random-weight model of the same shape
(``dynatree random-model``, then ``dynatree costs`` or ``dynatree bench --target FOLDER``), and the
project measures its kernels at sizes it does not ship (``benchmarks/cpu/kernels/``).

The shapes below are copied from the models' published ``config.json`` files; ``--config`` takes
any other (a config is a few kB: ``AutoConfig.from_pretrained(hub_id).to_json_file(...)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dynatree.errors import DynaTreeError

def _shape(arch: str, hidden: int, layers: int, mlp: int, heads: int, kv_heads: int, vocab: int,
           tied: bool) -> tuple[str, dict[str, Any]]:
    return arch, dict(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, vocab_size=vocab, tie_word_embeddings=tied)


#: name -> (architecture, config fields), from the published configs: hidden size, layers, MLP
#: width, query heads, key/value heads, vocabulary, tied embeddings.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": _shape("qwen2", 896, 24, 4864, 14, 2, 151936, True),
    "qwen2.5-1.5b": _shape("qwen2", 1536, 28, 8960, 12, 2, 151936, True),
    "qwen2.5-3b": _shape("qwen2", 2048, 36, 11008, 16, 2, 151936, True),
    "qwen2.5-7b": _shape("qwen2", 3584, 28, 18944, 28, 4, 152064, False),
    "llama-3.2-1b": _shape("llama", 2048, 16, 8192, 32, 8, 128256, True),
    "llama-3.2-3b": _shape("llama", 3072, 28, 8192, 24, 8, 128256, True),
    "llama-3.1-8b": _shape("llama", 4096, 32, 14336, 32, 8, 128256, False),
}


def shape_config(shape: str | Path) -> Any:
    """The ``PretrainedConfig`` of a named shape (:data:`SHAPES`) or of a ``config.json`` file."""
    from transformers import AutoConfig

    path = Path(shape)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise DynaTreeError(f"no such config file: {shape}")
        data = json.loads(path.read_text())
        if "model_type" not in data:
            raise DynaTreeError(f"{shape} has no 'model_type': not a transformers config.json")
        kind = data.pop("model_type")
        return AutoConfig.for_model(kind, **data)
    if shape not in SHAPES:
        raise DynaTreeError(f"unknown shape '{shape}': one of {', '.join(SHAPES)}, or a config.json file")
    arch, fields = SHAPES[shape]
    return AutoConfig.for_model(arch, **fields)


def random_model(shape: str | Path, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    """A causal LM of ``shape`` with random weights (HF's own initialisation), in eval mode."""
    from transformers import AutoModelForCausalLM

    config = shape_config(shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._name_or_path = f"random:{Path(shape).stem if Path(shape).suffix else shape}"
    return model.eval()


def save_random_model(shape: str | Path, out: str | Path, tokenizer: Any, dtype: torch.dtype = torch.float32) -> Path:
    """Write a random-weight model of ``shape`` and ``tokenizer`` to the folder ``out`` (a folder
    ``--target`` takes). The tokenizer only has to map prompts to ids below the model's vocabulary:
    the cost does not depend on which tokens run."""
    model = random_model(shape, dtype)
    vocab = model.config.vocab_size
    if len(tokenizer) > vocab:
        raise DynaTreeError(f"the tokenizer has {len(tokenizer)} tokens, more than the shape's vocabulary ({vocab}): "
                            "pass one of at most that size (--tokenizer)")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
