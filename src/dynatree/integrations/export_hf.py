"""Export a distilled draft as an ordinary HF ``LlamaForCausalLM`` that other tools can load.

The runtime draft (:class:`~dynatree.drafts.distilled.DistilledDraft`) is lean: it borrows the target's
embedding and its head covers only ``vocab_subset``, every other token getting a very negative
finite logit. HF's assisted generation, and any engine that is not dynatree, need a self-contained
causal LM instead: its own embedding, a head over the full vocabulary, standard config and
weight files. That is what :func:`export_hf` writes.

**Why the head needs one extra hidden channel.** ``LlamaForCausalLM``'s head has no bias, and the
final RMSNorm output has no constant component, so no row of a bias-free head gives a token a
fixed very negative logit. Zero rows are not enough: they give logit 0, which wins whenever all
subset logits are negative and always takes probability mass from the subset. The export
therefore widens the hidden state by a *mask channel* (plus zero channels up to a multiple of 8
and of the head count) without changing what the layers compute:

* every embedding row holds the constant ``c`` in the mask channel; no layer writes to it (the
  padded columns/rows of every projection are zero), so it stays ``c`` in the residual stream;
* RMSNorm averages over the wider hidden size and now also sees ``c**2``. Choosing
  ``c**2 = eps * H / 2``, the exported ``eps' = (eps * H - c**2) / H'`` and norm weights scaled by
  ``sqrt(H / H')`` make every norm's output on the real channels equal to the runtime draft's,
  up to float rounding;
* after the final norm the mask channel is ``c * rsqrt(...) > 0`` at every position, so a head
  row that is zero except for ``-MASK_WEIGHT`` there gives a token outside the subset a logit far
  below any subset logit (about ``-1e28`` and lower): it is never the argmax and its softmax
  probability is exactly 0, as in the runtime draft.

Hence: same argmax and the same softmax over the full vocabulary, to float rounding; checked on
random ids by :func:`check_export` before any file is written.

The feature-conditioned draft is not exportable: it reads the target's hidden state at every
step, which a standalone causal LM never receives.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, LlamaForCausalLM

from dynatree.drafts.distilled import DistilledDraft
from dynatree.errors import DynaTreeError

#: Weight of the mask channel in the head rows of tokens outside the subset. Times the channel's
#: value after the final norm (positive, at most ``sqrt(H' / 2)``) this stays finite in float32
#: and bfloat16 (max ~3.4e38) while pushing those logits below -1e20 for any residual-stream size
#: a real model reaches.
MASK_WEIGHT = 1e30
#: Width padding: HF requires the hidden size to be a multiple of the head count, and multiples
#: of 8 keep fast matmul paths on accelerators; the exported width is a multiple of both.
PAD_MULTIPLE = 8
#: dtypes the files can be written in. float16 cannot hold ``MASK_WEIGHT`` (it would become -inf
#: and the masked logits -inf, which turns some downstream arithmetic into NaN).
EXPORT_DTYPES = (torch.float32, torch.bfloat16)
#: Log-probabilities below this are probability 0 in every float dtype (exp underflows):
#: :func:`check_export` does not compare tokens that both models put below it.
IMPOSSIBLE_LOGPROB = -1e3


@dataclass(frozen=True)
class ExportCheck:
    """What :func:`check_export` measured: the largest log-probability difference over tokens
    either model deems possible, and the positions compared."""

    max_logprob_diff: float
    positions: int
    #: The dtype the files were written in; the check always runs on the float32 build.
    saved_dtype: str = "float32"

    def __str__(self) -> str:
        rounded = "" if self.saved_dtype == "float32" else f"; then rounded to {self.saved_dtype} for the files"
        return (f"equals the runtime draft on {self.positions} random positions (largest log-probability "
                f"difference {self.max_logprob_diff:.1e}{rounded})")


def build_hf_model(draft: nn.Module) -> LlamaForCausalLM:
    """The runtime ``draft`` as a self-contained float32 ``LlamaForCausalLM`` (see the module doc).

    Raises :class:`DynaTreeError` for a feature-conditioned draft or anything that is not a
    distilled draft.
    """
    _check_exportable(draft)
    dc = draft.draft_config
    h, vocab, eps = dc.hidden_size, dc.vocab_size, float(dc.rms_norm_eps)
    if eps <= 0:
        raise DynaTreeError("cannot export a draft with rms_norm_eps <= 0: the mask channel needs eps > 0")
    multiple = math.lcm(PAD_MULTIPLE, dc.num_attention_heads)
    width = math.ceil((h + 1) / multiple) * multiple
    c = torch.tensor(math.sqrt(eps * h / 2), dtype=torch.float32)  # the value the files will hold
    new_eps = (eps * h - float(c) ** 2) / width
    scale = math.sqrt(h / width)

    cfg = dc.llama_config()
    cfg.hidden_size = width
    cfg.rms_norm_eps = new_eps
    cfg.tie_word_embeddings = False
    cfg.dynatree_export = {"target_name": dc.target_name, "hidden_size": h, "mask_channel": h,
                           "vocab_subset_size": len(dc.vocab_subset)}
    model = LlamaForCausalLM(cfg).eval()

    src = {k: v.detach().to("cpu", torch.float32) for k, v in draft.trainable_state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    for name, value in src.items():
        if not name.startswith("model."):
            continue
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
                          "up_proj.weight")):
            value = _pad(value, cols=width)  # reads the hidden state: padded inputs are ignored
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            value = _pad(value, rows=width)  # writes the hidden state: never the mask channel
        elif name.endswith("norm.weight"):
            value = _pad(value * scale, rows=width)
        state[name] = value
    state["model.norm.weight"][h] = 1.0  # the final norm passes the mask channel on to the head

    embedding = draft.get_input_embeddings().weight.detach().to("cpu", torch.float32)
    embed = _pad(embedding, cols=width)
    embed[:, h] = c
    state["model.embed_tokens.weight"] = embed

    head = torch.zeros(vocab, width)
    head[:, h] = -MASK_WEIGHT
    subset = torch.tensor(dc.vocab_subset, dtype=torch.long)
    head[subset] = _pad(src["head.weight"], cols=width)
    state["lm_head.weight"] = head

    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:  # a bug in the mapping above, not a user error
        raise RuntimeError(f"export mapping incomplete: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model


def check_export(draft: nn.Module, model: nn.Module, *, sequences: int = 4, length: int = 32,
                 seed: int = 0, atol: float | None = None) -> ExportCheck:
    """Compare ``model``'s full-vocabulary log-probabilities with the runtime ``draft``'s on random ids.

    Every token that either model gives a log-probability above :data:`IMPOSSIBLE_LOGPROB` must
    agree within ``atol`` (default: 1e-3 for a float32 draft, 5e-2 otherwise), and the argmax
    must be equal wherever the draft's top two logits differ by more than ``atol``. Raises
    :class:`DynaTreeError` on a mismatch: that export would draft different tokens.
    """
    vocab = draft.draft_config.vocab_size
    if atol is None:
        atol = 1e-3 if draft.dtype == torch.float32 else 5e-2
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (sequences, length), generator=gen)
    with torch.no_grad():
        want = draft(input_ids=ids.to(draft.device)).logits.float().cpu()
        got = model(input_ids=ids.to(model.device)).logits.float().cpu()
    if got.shape != want.shape:
        raise DynaTreeError(f"exported logits have shape {tuple(got.shape)}, the draft's {tuple(want.shape)}")
    lp_want, lp_got = want.log_softmax(-1), got.log_softmax(-1)
    possible = (lp_want > IMPOSSIBLE_LOGPROB) | (lp_got > IMPOSSIBLE_LOGPROB)
    diff = (lp_want - lp_got).abs().where(possible, torch.zeros(()))
    worst = float(diff.max())
    if not worst <= atol:  # also catches NaN
        raise DynaTreeError(f"exported model differs from the draft: log-probability off by {worst:.3g} "
                            f"(tolerance {atol:g})")
    top2 = want.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > atol
    flipped = (want.argmax(-1) != got.argmax(-1)) & clear
    if flipped.any():
        raise DynaTreeError(f"exported model picks a different next token at {int(flipped.sum())} of "
                            f"{flipped.numel()} positions")
    return ExportCheck(max_logprob_diff=worst, positions=int(ids.numel()))


def export_hf(draft: nn.Module, out_dir: str | os.PathLike[str], tokenizer: Any = None, *,
              dtype: torch.dtype = torch.float32, check: bool = True) -> Path:
    """Write ``draft`` to ``out_dir`` as an HF causal LM: ``config.json``, ``model.safetensors``,
    ``generation_config.json``, and the tokenizer's files when ``tokenizer`` is given.

    Load it with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and pass it to HF as
    ``assistant_model``. ``check`` first compares the exported model with ``draft`` on random ids
    (:func:`check_export`), so a wrong export never reaches the disk. ``dtype``: float32
    (default; equal up to float rounding) or bfloat16 (half the size, rounded weights).
    """
    return _export(draft, out_dir, tokenizer, dtype=dtype, check=check)[0]


def export_draft(draft: str, out_dir: str | os.PathLike[str], *, target: str, dtype: str = "float32"
                 ) -> tuple[Path, ExportCheck]:
    """What ``dynatree export-draft`` does: load ``target`` and the distilled ``draft`` (a shipped
    preset or a folder written by ``dynatree distill``), export, and save the target's tokenizer
    alongside. Returns the folder and the check's result."""
    from dynatree.loading import models
    from dynatree.catalog import SHIPPED_DRAFTS
    from dynatree.drafts.checkpoint import load_distilled_draft

    torch_dtype = models.parse_dtype(dtype)
    _check_dtype(torch_dtype)  # before loading anything
    folder = Path(draft).expanduser()
    if draft not in SHIPPED_DRAFTS and not folder.is_dir():
        raise DynaTreeError(f"'{draft}' is neither a shipped draft ({', '.join(SHIPPED_DRAFTS)}) "
                            "nor a folder written by dynatree distill")
    tmodel, tokenizer = models.load_model(target)
    runtime = (models.resolve_draft(draft, tmodel) if draft in SHIPPED_DRAFTS
               else load_distilled_draft(tmodel, folder))
    out, result = _export(runtime, out_dir, tokenizer, dtype=torch_dtype, check=True)
    assert result is not None
    return out, result


def _export(draft: nn.Module, out_dir: str | os.PathLike[str], tokenizer: Any, *, dtype: torch.dtype,
            check: bool) -> tuple[Path, ExportCheck | None]:
    _check_dtype(dtype)
    model = build_hf_model(draft)
    result = check_export(draft, model) if check else None
    if result is not None:
        result = replace(result, saved_dtype=str(dtype).removeprefix("torch."))
    special = {}
    if tokenizer is not None:
        special = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        for key, value in special.items():
            setattr(model.config, key, value)
    model.generation_config = GenerationConfig(do_sample=False, **{k: v for k, v in special.items() if v is not None})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out, result


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in EXPORT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in EXPORT_DTYPES)
        raise DynaTreeError(f"cannot export in {str(dtype).removeprefix('torch.')}: use {names} "
                            "(float16 cannot hold the masking logit)")


def _check_exportable(draft: nn.Module) -> None:
    if getattr(draft, "uses_target_features", False):
        raise DynaTreeError("the feature-conditioned draft reads the target's hidden states at every step "
                            "and cannot run as a standalone HF model; export the independent draft instead")
    if not isinstance(draft, DistilledDraft):
        raise DynaTreeError(f"export needs a dynatree distilled draft, got {type(draft).__name__} "
                            "(an HF model can be saved with its own save_pretrained)")


def _pad(t: torch.Tensor, *, rows: int | None = None, cols: int | None = None) -> torch.Tensor:
    """``t`` zero-padded at the end to ``rows`` (dim 0) and/or ``cols`` (dim 1)."""
    shape = list(t.shape)
    if rows is not None:
        shape[0] = rows
    if cols is not None:
        shape[1] = cols
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out
