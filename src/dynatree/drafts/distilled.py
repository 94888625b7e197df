"""The distilled draft at run time: its config, the module, and loading/saving its files.

A distilled draft is ``layers`` decoder layers of the target's own width and head layout (an HF
:class:`~transformers.LlamaModel`, unmodified), the target's token embedding **shared** (not
copied, not trained, not shipped), and a **reduced-vocabulary head** over the ``vocab_subset``
tokens the target predicts most often. Its logits are scattered back into the full vocabulary;
every other token gets a very negative *finite* logit, so it can never be the argmax and
softmax/log-softmax stay NaN-free. It is called exactly like an HF causal LM (4D additive tree
mask, explicit positions, ``DynamicCache``), so the engine needs no special case for it.

Why it exists, and how it is trained: :mod:`dynatree.training.distill`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from dynatree.errors import DynaTreeError

#: Where the shipped draft for the default target lives inside the package.
SHIPPED_DRAFT = "assets/drafts/smollm2-135m-distilled"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_PROBE_ROWS = 8
_PROBE_COLS = 4
DRAFT_KINDS = ("independent", "feature")

@dataclass(frozen=True)
class TargetFingerprint:
    """Identifies the target a draft was trained against: embedding shape plus a few sampled values.

    Sampled values (compared with a tolerance) rather than a hash of raw bytes, so that the same
    target loaded in another dtype (bf16, fp16) still matches, while a different model does not.
    """

    shape: tuple[int, int]
    probe: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or min(self.shape) <= 0:
            raise ValueError(f"fingerprint shape must be two positive ints, got {self.shape}")
        if len(self.probe) != _PROBE_ROWS * _PROBE_COLS:
            raise ValueError(f"fingerprint probe must hold {_PROBE_ROWS * _PROBE_COLS} values")

    @classmethod
    def of(cls, embedding: torch.Tensor) -> TargetFingerprint:
        vocab, hidden = embedding.shape
        rows = torch.linspace(0, vocab - 1, _PROBE_ROWS).round().long()
        cols = torch.linspace(0, hidden - 1, _PROBE_COLS).round().long()
        values = embedding.detach()[rows][:, cols].float().flatten().cpu()
        return cls(shape=(int(vocab), int(hidden)), probe=tuple(round(float(v), 6) for v in values))

    def matches(self, other: TargetFingerprint) -> bool:
        if tuple(self.shape) != tuple(other.shape):
            return False
        a, b = torch.tensor(self.probe), torch.tensor(other.probe)
        return bool(torch.allclose(a, b, rtol=1e-2, atol=1e-3))


@dataclass(frozen=True)
class DraftConfig:
    """Architecture of a distilled draft; saved as ``config.json`` next to the weights."""

    target_name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    hidden_act: str
    rope_parameters: dict[str, Any]
    vocab_subset: tuple[int, ...]
    fingerprint: TargetFingerprint
    #: "independent" (:class:`DistilledDraft`, tokens only) or "feature" (reads the target's
    #: hidden states, :class:`~dynatree.drafts.feature_head.FeatureDraft`). Older files have no field.
    kind: str = "independent"
    #: Feature drafts: the target's decoder layers whose outputs the head reads, fused (EAGLE-3);
    #: empty = the target's final hidden state. Older files have no field.
    feature_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        subset = self.vocab_subset
        if not subset:
            raise ValueError("vocab_subset must not be empty")
        if list(subset) != sorted(set(subset)):
            raise ValueError("vocab_subset must be strictly increasing token ids")
        if subset[0] < 0 or subset[-1] >= self.vocab_size:
            raise ValueError(f"vocab_subset ids must lie in [0, {self.vocab_size})")
        if tuple(self.fingerprint.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError("fingerprint shape must equal (vocab_size, hidden_size)")
        if self.kind not in DRAFT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(DRAFT_KINDS)}, got {self.kind!r}")
        if self.feature_layers and (self.kind != "feature" or min(self.feature_layers) < 1):
            raise ValueError("feature_layers (layer numbers >= 1) belong to feature drafts only")

    @classmethod
    def from_target(cls, target: nn.Module, *, name: str, layers: int,
                    vocab_subset: Sequence[int], kind: str = "independent",
                    feature_layers: Sequence[int] = ()) -> DraftConfig:
        """Copy the target's layer geometry so target layers can initialise the draft's."""
        c = target.config
        heads = int(c.num_attention_heads)
        if layers > int(c.num_hidden_layers):
            raise DynaTreeError(f"the draft cannot have more layers ({layers}) than the target "
                                f"({c.num_hidden_layers})")
        return cls(
            target_name=name,
            vocab_size=int(c.vocab_size),
            hidden_size=int(c.hidden_size),
            intermediate_size=int(c.intermediate_size),
            num_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
            rms_norm_eps=float(c.rms_norm_eps),
            max_position_embeddings=int(c.max_position_embeddings),
            hidden_act=str(c.hidden_act),
            rope_parameters=dict(c.rope_parameters),
            vocab_subset=tuple(sorted(int(t) for t in vocab_subset)),
            fingerprint=TargetFingerprint.of(target.get_input_embeddings().weight),
            kind=kind,
            feature_layers=tuple(int(i) for i in feature_layers),
        )

    def llama_config(self, vocab_size: int | None = None) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab_size if vocab_size is None else vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            hidden_act=self.hidden_act,
            rope_parameters=dict(self.rope_parameters),
            tie_word_embeddings=False,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> DraftConfig:
        raw = json.loads(text)
        fp = raw.pop("fingerprint")
        return cls(**{**raw, "vocab_subset": tuple(raw["vocab_subset"]),
                      "feature_layers": tuple(raw.get("feature_layers", ())),
                      "fingerprint": TargetFingerprint(tuple(fp["shape"]), tuple(fp["probe"]))})


class DistilledDraft(nn.Module):
    """``layers`` Llama decoder layers + reduced-vocabulary head over a shared, frozen embedding.

    Called like an HF causal LM: ``draft(input_ids, attention_mask=4D additive mask,
    position_ids, past_key_values=DynamicCache, use_cache=True, logits_to_keep=0)`` returns
    ``.logits`` of shape ``[batch, n, vocab_size]`` over the *full* vocabulary.

    The target's embedding is held by reference and deliberately *not* registered as a submodule:
    ``draft.to(...)``, ``draft.parameters()`` and ``draft.state_dict()`` then never touch the
    target's weights, and the draft's files never contain them.
    """

    def __init__(self, config: DraftConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        if tuple(embedding.weight.shape) != (config.vocab_size, config.hidden_size):
            raise DynaTreeError(
                f"embedding has shape {tuple(embedding.weight.shape)}, the draft expects "
                f"({config.vocab_size}, {config.hidden_size})")
        self.draft_config = config
        #: What the engine reads: full vocabulary, k layers (sizes the DynamicCache).
        self.config = config.llama_config()
        # The inner model gets a 1-token dummy vocabulary: inputs are always given as embeddings
        # from the shared table, so a second 49152 x hidden table would be dead weight.
        self.model = LlamaModel(config.llama_config(vocab_size=1))
        self.model.embed_tokens = None
        self.head = nn.Linear(config.hidden_size, len(config.vocab_subset), bias=False)
        self.register_buffer("vocab_subset", torch.tensor(config.vocab_subset, dtype=torch.long),
                             persistent=False)
        self._shared: tuple[nn.Embedding] = (embedding,)
        self.to(embedding.weight.device)

    @property
    def embedding(self) -> nn.Embedding:
        """The target's input embedding (shared)."""
        return self._shared[0]

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embedding

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def hidden_states(self, input_ids: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """Final-norm hidden states ``[b, n, hidden]`` and the cache; kwargs go to ``LlamaModel``."""
        embeds = self.embedding(input_ids.to(self.embedding.weight.device))
        # detach: the embedding belongs to the target and stays frozen during distillation.
        embeds = embeds.detach().to(device=self.device, dtype=self.dtype)
        out = self.model(inputs_embeds=embeds, **kwargs)
        return out.last_hidden_state, out.past_key_values

    def subset_logits(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Logits over the vocabulary subset only ``[b, n, len(vocab_subset)]`` (training path)."""
        return self.head(self.hidden_states(input_ids, **kwargs)[0])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs: Any) -> CausalLMOutputWithPast:
        hidden, cache = self.hidden_states(
            input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        sub = self.head(hidden[:, keep, :])
        return CausalLMOutputWithPast(logits=self.scatter_full(sub), past_key_values=cache)

    def scatter_full(self, sub: torch.Tensor) -> torch.Tensor:
        """Subset logits -> full-vocabulary logits; absent tokens get ``finfo.min / 2`` (finite)."""
        full = sub.new_full((*sub.shape[:-1], self.config.vocab_size),
                            torch.finfo(sub.dtype).min / 2)
        return full.index_copy_(-1, self.vocab_subset, sub)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The draft's own weights (layers, final norm, head): what gets saved and shipped."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("model.rotary_emb")}

    def init_from_target(self, target: nn.Module) -> None:
        """Layers from the target's first layers, norm from its final norm, head from its
        (tied) embedding rows: the draft starts as the target's early exit over the subset."""
        decoder = _decoder(target)
        try:
            for i, layer in enumerate(self.model.layers):
                layer.load_state_dict(decoder.layers[i].state_dict())
            self.model.norm.load_state_dict(decoder.norm.state_dict())
        except (RuntimeError, AttributeError) as err:
            raise DynaTreeError(f"target {type(target).__name__} is not Llama-shaped; cannot "
                                f"initialise the draft from it ({err})") from err
        out_emb = target.get_output_embeddings()
        rows = (out_emb.weight if out_emb is not None else self.embedding.weight).detach()
        with torch.no_grad():
            self.head.weight.copy_(rows[self.vocab_subset.to(rows.device)].to(self.head.weight))


def _decoder(target: nn.Module) -> nn.Module:
    decoder = getattr(target, "model", None)
    if decoder is None or not hasattr(decoder, "layers"):
        raise DynaTreeError(f"target {type(target).__name__} has no Llama-style .model.layers")
    return decoder


def default_draft_path() -> Path:
    """The draft shipped with the package for :data:`DEFAULT_TARGET`."""
    return Path(str(resources.files("dynatree").joinpath(SHIPPED_DRAFT)))


def save_draft(draft: DistilledDraft, path: str | os.PathLike[str],
               dtype: torch.dtype = torch.float16) -> Path:
    """Write ``model.safetensors`` (``dtype``) and ``config.json`` to ``path`` atomically."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype=dtype, device="cpu").contiguous()
               for k, v in draft.trainable_state_dict().items()}
    with _atomic(out / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"target": draft.draft_config.target_name})
    with _atomic(out / CONFIG_FILE) as tmp:
        Path(tmp).write_text(draft.draft_config.to_json())
    return out


class _atomic:
    """Context manager yielding a temp path in the destination folder, renamed into place on
    success (``os.replace`` is atomic), removed on failure: a crash never leaves a torn file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        self.tmp = Path(name)

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            os.chmod(self.tmp, 0o644)  # mkstemp creates 0600; shipped files must be readable
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
