"""The library's front door: what :func:`dynatree.generate` and the HF entry check about the models
and the prompt before any model runs.

Why this exists: a model or a prompt of the wrong kind otherwise fails deep inside a forward, in a
message that names neither the argument nor the fix (an encoder-decoder target ends in "You must
specify exactly one of input_ids or inputs_embeds", a ragged list of ids in "expected sequence of
length 3 at dim 1"), or, worse, it runs: a masked LM attends in both directions, so its "greedy
output" is no causal model's, and a bool tensor is read as the token ids 0 and 1. Each of these
is a :class:`~dynatree.errors.DynaTreeError` with one line here, raised before any model call.

Lives in :mod:`dynatree.runtime` (not :mod:`dynatree.loop`) because the model draft source checks
its draft with it too, and the draft sources sit below the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dynatree.errors import DynaTreeError, first_line
from dynatree.runtime.cache import vocab_size


def check_causal_lm(model: Any, role: str) -> None:
    """Refuse a ``model`` (the run's ``role``: "target", "draft", ...) that is not a decoder-only
    causal LM: an encoder-decoder, a model without a next-token head, or one whose decoder attends
    in both directions.

    Judged from what transformers says about the model without running it:
    ``config.is_encoder_decoder``; ``can_generate()`` (False for encoders, masked LMs and bare
    ``...Model`` bodies without an LM head); and the ``is_causal`` flag transformers sets on
    attention modules (BERT-like models build bidirectional attention unless their config has
    ``is_decoder=True``; a causal LM flags its self-attention causal). Only the decoder's modules
    are asked (``get_decoder()``), so a vision tower's bidirectional attention in a multimodal
    model does not count. A module that says nothing (no config, no ``can_generate``, no flags,
    e.g. a distilled draft or a custom module) is let through: it is not refused on a guess.
    """
    name = type(model).__name__
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False) is True:
        raise DynaTreeError(f"encoder-decoder models are not supported by dynatree (decoder-only causal LMs only): "
                            f"the {role} is a {name}")
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and not can_generate():
        raise DynaTreeError(f"the {role} {name} is not a causal LM (it has no next-token head: an encoder, a masked "
                            "LM or a model body); load it with AutoModelForCausalLM")
    decoder = _decoder(model)
    modules = decoder.modules() if isinstance(decoder, torch.nn.Module) else ()
    # Refused only if some module is flagged and none causal: the walk stops at the first causal
    # flag (a causal LM's first attention module), not after every module of the model (~1 ms of
    # attribute misses per call on SmolLM2-135M).
    flagged = False
    for m in modules:
        flag = getattr(m, "is_causal", None)
        if flag is True:
            return
        flagged = flagged or flag is False
    if flagged:
        hint = " (its config has is_decoder=False)" if getattr(config, "is_decoder", None) is False else ""
        raise DynaTreeError(f"the {role} {name} is not a causal LM: its attention is bidirectional{hint}; dynatree "
                            "needs a decoder-only causal LM")


def _decoder(model: Any) -> Any:
    """The module whose attention decides causality: ``get_decoder()`` where transformers offers
    one (the language model of a multimodal model), else the model itself."""
    get = getattr(model, "get_decoder", None)
    if callable(get):
        try:
            decoder = get()
        except (AttributeError, NotImplementedError):  # a model that declares no decoder
            decoder = None
        if isinstance(decoder, torch.nn.Module):
            return decoder
    return model


def prompt_ids(input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]], target: torch.nn.Module) -> list[int]:
    """The one prompt of ``input_ids`` (``[1, L]`` or ``[L]``: a tensor, an array or lists of
    integers) as a list of token ids of ``target``'s vocabulary, else a one-line error naming what
    is wrong with it. Bools are refused although torch would read them as 0 and 1: a mask passed
    where the ids belong is a mistake, not a prompt."""
    ids = _as_tensor(input_ids)
    shape = tuple(ids.shape)
    if ids.dim() == 2:
        if ids.shape[0] > 1:
            raise DynaTreeError(
                f"batch size {ids.shape[0]} > 1 is not supported yet; call generate once per prompt"
            )
        if ids.shape[0] == 0:
            raise DynaTreeError(f"empty prompt: input_ids of shape {shape} has no rows")
        ids = ids[0]
    if ids.dim() != 1:
        raise DynaTreeError(f"input_ids must be [1, L] or [L], got shape {shape}")
    if ids.numel() == 0:
        raise DynaTreeError("empty prompt: input_ids has no tokens")
    if ids.dtype == torch.bool:
        raise DynaTreeError("input_ids must be integer token ids, got bools (an attention mask in its place?)")
    if ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise DynaTreeError("input_ids must be integer token ids")
    vocab = vocab_size(target)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        bad = hi if hi >= vocab else lo
        raise DynaTreeError(f"token id {bad} out of range for the target vocabulary (size {vocab})")
    return ids.tolist()


def _as_tensor(input_ids: Any) -> torch.Tensor:
    """``input_ids`` as a tensor, refusing in one line what torch would refuse in a raw error
    (None, text, a ragged list) or would silently read as numbers (Python bools in a list)."""
    if isinstance(input_ids, torch.Tensor):
        return input_ids
    if input_ids is None or isinstance(input_ids, (str, bytes)):
        what = "None" if input_ids is None else f"a {type(input_ids).__name__}"
        raise DynaTreeError(f"input_ids must be token ids ([1, L] or [L] integers), got {what}; tokenize the prompt "
                            "first")
    if isinstance(input_ids, Sequence):
        rows = [row for row in input_ids if isinstance(row, Sequence) and not isinstance(row, (str, bytes))]
        if rows and len(rows) != len(input_ids):
            raise DynaTreeError("input_ids mixes lists and token ids: pass one prompt, [1, L] or [L]")
        lengths = list(dict.fromkeys(len(row) for row in rows))
        if len(lengths) > 1:
            raise DynaTreeError(f"input_ids is a ragged list (rows of {' and '.join(map(str, lengths))} tokens): "
                                "pass one prompt, [1, L] or [L]")
        if any(isinstance(t, bool) for row in (rows or [input_ids]) for t in row):
            raise DynaTreeError("input_ids must be integer token ids, got bools (an attention mask in its place?)")
    try:
        return torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise DynaTreeError(f"input_ids must be token ids ([1, L] or [L] integers): {first_line(exc)}") from None


def prompt_rows(input_ids: Any, attention_mask: Any, target: torch.nn.Module, pad_token_id: int | None = None,
                eos_token_id: int | Sequence[int] | None = None) -> list[list[int]]:
    """Every prompt of ``input_ids`` as its own list of token ids: one prompt (``[L]``, ``[1, L]``),
    a batch ``[B, L]`` whose ``attention_mask`` marks left padding with 0 (HF's convention for
    decoder-only models), or a list of prompts of different lengths. Each row passes
    :func:`prompt_ids`' checks; a mask that pads on the right, or leaves a row empty, is refused in
    one line before any model call.

    A ``[B, L]`` batch without a mask is read as HF's ``generate`` reads it: where the pad token
    (``pad_token_id``, else the target's ``generation_config.pad_token_id``) occurs in it and is not
    an EOS token, the mask is ``input_ids != pad``; otherwise every token is real. Where a row
    *begins* with a pad token that is also an EOS token, whether it is padding cannot be told: that
    is refused, asking for the mask (HF would decode the padding as prompt)."""
    if _ragged(input_ids):
        if attention_mask is not None:
            raise DynaTreeError("attention_mask goes with a padded [B, L] input_ids, not with a list of prompts")
        return [prompt_ids(row, target) for row in input_ids]
    ids = _as_tensor(input_ids)
    if attention_mask is None:
        if ids.dim() == 2 and ids.shape[0] > 1:
            attention_mask = _inferred_mask(ids, target, pad_token_id, eos_token_id)
            if attention_mask is None:
                return [prompt_ids(row, target) for row in ids]
        else:
            return [prompt_ids(input_ids, target)]
    mask = _as_tensor(attention_mask)
    if ids.dim() == 1:
        ids = ids.view(1, -1)
    mask = mask.view(1, -1) if mask.dim() == 1 else mask
    if tuple(mask.shape) != tuple(ids.shape):
        raise DynaTreeError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}: they must match")
    if mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
        raise DynaTreeError("attention_mask must hold 0 (padding) and 1 (token) only")
    mask = mask.long().cpu()
    rows = []
    for b in range(ids.shape[0]):
        real = int(mask[b].sum())
        if real == 0:
            raise DynaTreeError(f"row {b} of attention_mask is all padding: every prompt needs a token")
        if not bool(mask[b, ids.shape[1] - real:].all()):
            raise DynaTreeError(f"row {b} of attention_mask is not left-padded (zeros first, then ones: HF's "
                                "convention for decoder-only generation; pass padding_side='left' to the tokenizer)")
        rows.append(prompt_ids(ids[b, ids.shape[1] - real:], target))
    return rows


def _inferred_mask(ids: torch.Tensor, target: torch.nn.Module, pad: int | None,
                   eos: int | Sequence[int] | None) -> torch.Tensor | None:
    """HF's mask for a ``[B, L]`` batch given without one (see :func:`prompt_rows`), or None (every
    token real)."""
    config = getattr(target, "generation_config", None)
    if pad is None:
        pad = getattr(config, "pad_token_id", None)
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    if not isinstance(pad, int) or ids.dtype == torch.bool or ids.dtype.is_floating_point:
        return None
    if pad in eos_ids:
        starts = [b for b in range(ids.shape[0]) if int(ids[b, 0]) == pad]
        if starts:
            raise DynaTreeError(f"input_ids is a [B, L] batch without attention_mask, and rows {starts} begin with "
                                f"token {pad}, which is both the pad and an EOS token: whether it is padding cannot "
                                "be told; pass attention_mask (the tokenizer's, padding_side='left')")
        return None
    if not bool((ids == pad).any()):
        return None
    return (ids != pad).long()


def _ragged(input_ids: Any) -> bool:
    """A list of token-id lists whose lengths differ (several prompts, unpadded)."""
    if isinstance(input_ids, torch.Tensor) or not isinstance(input_ids, Sequence) or isinstance(input_ids, (str, bytes)):
        return False
    rows = [row for row in input_ids if isinstance(row, Sequence) and not isinstance(row, (str, bytes))]
    return len(rows) == len(input_ids) > 1 and len({len(row) for row in rows}) > 1


__all__ = ["check_causal_lm", "prompt_ids", "prompt_rows"]
