"""The feature-conditioned draft head (the EAGLE idea, our own code).

An independent draft sees only tokens, so it must rebuild the target's understanding of the context
from scratch with a few layers. This head instead reads the target's **final hidden state of the
parent token** (its *feature*, the vector the target's LM head turns into logits) together with
the token's embedding, and predicts the *next* feature with one or two decoder layers::

    x_j   = fc([embed(token_j) ; f_{j-1}])          # f_{j-1}: the parent's feature
    f'_j  = norm(decoder_layers(x_j, cache))         # predicted feature of token j
    logits = head_subset(f'_j)                       # the next token's logits (vocabulary subset)

Where the target's features come from: committed tokens were all run through the target (by the
prefill or a verify pass), so their features are known exactly; the verify pass computes every
tree node's final hidden state anyway, so the accepted nodes' features cost nothing. Inside a tree
a node's parent was never run through the target, so deeper levels read the head's *own*
predicted feature of the parent (what :class:`~dynatree.drafts.model.FeatureProposer` keeps per node).

**Fused layers (EAGLE-3).** The final hidden state is tuned to predict the next token only; the
outputs of a low, a middle and a high decoder layer also keep what the target knows about the token
and its context. With ``DraftConfig.feature_layers`` the head reads those outputs concatenated
(``[q, len(layers) * hidden]``) and first reduces them to the hidden width with ``fuse`` (no bias, so
the zero feature of a sequence's first token stays zero); inside a tree its deeper levels read its
own predicted features, which live in that reduced space, as in training's unrolled levels.

Its weights are a :class:`~dynatree.drafts.distilled.DistilledDraft` (shared frozen embedding, decoder
layers of the target's width, subset head) plus the ``fc`` layer; ``DraftConfig.kind`` is
``"feature"``. It is trained by :mod:`dynatree.training.features`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from dynatree.drafts.distilled import DistilledDraft, DraftConfig, _decoder
from dynatree.errors import DynaTreeError


class FeatureDraft(DistilledDraft):
    """A draft whose every call also takes the parent tokens' features ``[b, n, hidden]``.

    ``forward(input_ids, features=...)`` returns full-vocabulary ``.logits`` and the predicted
    features as ``.hidden_states`` (a 1-tuple, ``[b, n, hidden]``). Without ``features`` (generic
    callers) zero features are used: the output is then a weak but valid draft.
    """

    #: What the engine checks to hand the target's features to the drafter.
    uses_target_features = True

    def __init__(self, config: DraftConfig, embedding: nn.Embedding) -> None:
        super().__init__(config, embedding)
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True, device=self.device)
        taps = len(config.feature_layers)
        self.fuse = nn.Linear(taps * h, h, bias=False, device=self.device) if taps else None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's decoder layers this head reads (empty: its final hidden state)."""
        return self.draft_config.feature_layers

    def parent_features(self, target_features: torch.Tensor) -> torch.Tensor:
        """The target's features ``[..., len(layers) * hidden]`` (or ``[..., hidden]``) as this head
        reads them: fused to ``[..., hidden]``. Its own predicted features need no such step."""
        if self.fuse is None:
            return target_features
        return self.fuse(target_features.to(device=self.device, dtype=self.dtype))

    def hidden_states(self, input_ids: torch.Tensor, features: torch.Tensor | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """Predicted (final-norm) features ``[b, n, hidden]`` and the cache. ``features``: each
        token's parent's feature ``[b, n, hidden]``, i.e. :meth:`parent_features` of the target's,
        or this head's own prediction."""
        embeds = self.embedding(input_ids.to(self.embedding.weight.device))
        embeds = embeds.detach().to(device=self.device, dtype=self.dtype)
        if features is None:
            features = torch.zeros_like(embeds)
        x = self.fc(torch.cat([embeds, features.to(device=self.device, dtype=self.dtype)], dim=-1))
        out = self.model(inputs_embeds=x, **kwargs)
        return out.last_hidden_state, out.past_key_values

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                past_key_values: Any = None, use_cache: bool | None = None,
                logits_to_keep: int | torch.Tensor = 0, **kwargs: Any) -> CausalLMOutputWithPast:
        hidden, cache = self.hidden_states(
            input_ids, features, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden = hidden[:, keep, :]
        return CausalLMOutputWithPast(logits=self.scatter_full(self.head(hidden)), past_key_values=cache,
                                      hidden_states=(hidden,))

    def init_from_target(self, target: nn.Module) -> None:
        """Layers from the target's *last* layers (they map features to features), norm and head
        from the target; ``fc`` starts as "pass the parent's feature through" plus a small
        embedding term, so the untrained head begins near "the next token is the target's
        prediction at the parent"."""
        super().init_from_target(target)

        layers = _decoder(target).layers
        for i, layer in enumerate(self.model.layers):
            layer.load_state_dict(layers[len(layers) - len(self.model.layers) + i].state_dict())
        h = self.draft_config.hidden_size
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, h:].copy_(torch.eye(h))
            self.fc.weight[:, :h].normal_(std=0.02)
            self.fc.bias.zero_()
            if self.fuse is not None:  # start from the highest fused layer, passed through
                self.fuse.weight.zero_()
                self.fuse.weight[:, -h:].copy_(torch.eye(h))


def resolve_feature_layers(spec: str, num_layers: int) -> tuple[int, ...]:
    """The decoder layers (1 .. ``num_layers`` - 1) a ``DistillConfig.feature_layers`` spec names:
    "" or "final" = none (the final hidden state), "auto" = EAGLE-3's low, middle and high layers
    (2, N/2, N-3, clipped and deduplicated for small targets), else the listed numbers."""
    if spec in ("", "final"):
        return ()
    if spec == "auto":
        wanted = [2, num_layers // 2, num_layers - 3]
        return tuple(sorted({min(max(1, i), num_layers - 1) for i in wanted}))
    layers = tuple(int(p) for p in spec.split(","))
    bad = [i for i in layers if not 1 <= i < num_layers]
    if bad:
        raise DynaTreeError(f"feature layers {bad} do not exist: a target of {num_layers} layers has "
                            f"layers 1 .. {num_layers - 1} to read (the last one's output is the final hidden state)")
    return layers


def uses_target_features(draft: nn.Module | None) -> bool:
    """Whether ``draft`` reads the target's features (a :class:`FeatureDraft` or alike)."""
    return bool(getattr(draft, "uses_target_features", False))
