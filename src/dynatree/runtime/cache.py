"""KV-cache bookkeeping on unmodified HuggingFace ``DynamicCache`` objects.

After a verify pass the cache holds ``[committed prefix | every tree node]``. Committing a path
means keeping the accepted nodes' rows, moved to sit right after the prefix, and dropping the rest.
We move rows instead of cropping and re-running the accepted tokens (what the DynaTree paper's code does):
the rows were computed with exactly the positions and ancestors they would have had in sequential
decoding, so they are the rows sequential decoding would have produced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer

from dynatree.runtime import distributed
from dynatree.runtime.devices import check_compiler
from dynatree.runtime.growing_layer import GrowingLayer
from dynatree.errors import DynaTreeError
from dynatree.runtime.kernels.cpu_linear import SmallBatchLinear, packing_applies
from dynatree.options import LinearPlan, fixed_plan
from dynatree.runtime.kernels.grouped_kv import applies as grouped_kv_applies, grouped_kv
from dynatree.runtime.kernels.screened_head import for_head
from dynatree.runtime.window import AttentionLayout, attention_layout, layer_masks
from dynatree.tuning import PREFILL_CHUNK


_FIND: Any = object()  # new_cache's "work the layout out from the model"


def new_cache(model: torch.nn.Module, layout: AttentionLayout | None = _FIND) -> DynamicCache:
    """A fresh dynamic cache for ``model``; refuses layer types we cannot compact safely.

    Sliding-window layers get full-length layers: the window is applied by the mask
    (:mod:`dynatree.runtime.window`), since HF's sliding layers drop and roll rows. ``layout``:
    the model's :func:`~dynatree.runtime.window.attention_layout`, when the caller has it already
    (reading it from the config walks every layer's settings: ~0.6 ms on SmolLM2-135M).
    """
    if layout is _FIND:
        layout = attention_layout(model)
    cache = DynamicCache(config=getattr(model, "config", None))
    full = (DynamicLayer, DynamicSlidingWindowLayer) if layout is not None else (DynamicLayer,)
    cache.layers = [GrowingLayer() if type(x) in full else x for x in cache.layers]
    if cache.layer_class_to_replicate is DynamicLayer:  # (no config: layers are made on first use)
        cache.layer_class_to_replicate = GrowingLayer
    for layer in cache.layers:
        if type(layer) is not GrowingLayer:
            raise DynaTreeError(
                f"{type(model).__name__} uses {type(layer).__name__} cache layers (sliding window or "
                "similar); tree speculative decoding here supports full-attention caches only"
            )
    return cache


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def compact(cache: DynamicCache | StaticCache, start: int, keep: Sequence[int] | torch.Tensor,
            truncate: bool = True) -> None:
    """Keep cache rows ``keep`` (absolute, ascending, all >= start) at ``start, start+1, ...``.

    In place on every layer. The right-hand side of an advanced-index assignment is materialised
    before the write, so overlapping source/destination ranges are safe. ``truncate`` drops the
    rows after them (a dynamic cache's length is its tensors' length); a static cache keeps its
    capacity and its owner records the new length instead (``truncate=False``).
    """
    keep_t = torch.as_tensor(keep, dtype=torch.long)
    k = int(keep_t.numel())
    contiguous = k == 0 or (int(keep_t[0]) == start and int(keep_t[-1]) == start + k - 1)
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            continue
        if not contiguous:
            idx = keep_t.to(layer.keys.device)
            layer.keys[..., start : start + k, :] = layer.keys[..., idx, :]
            layer.values[..., start : start + k, :] = layer.values[..., idx, :]
        if truncate:
            layer.keys = layer.keys[..., : start + k, :]
            layer.values = layer.values[..., : start + k, :]


def vocab_size(model: torch.nn.Module) -> int:
    """The width of ``model``'s logits: its output embedding's rows, else the (text) config's ``vocab_size``.

    The one way the package reads a vocabulary size: the engine, the draft/target check and
    :func:`dynatree.loading.models.check_compatible` all call this."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and hasattr(out, "weight"):
        return int(out.weight.shape[0])
    config = model.config
    return int((config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size)


def plain_head(model: torch.nn.Module) -> bool:
    """True if ``model``'s logits are exactly ``head(base_model(...))``: no scaling or soft-capping on top."""
    cfg = model.config
    plain = not any(getattr(cfg, a, None) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    return plain and getattr(model, "base_model", model) is not model \
        and isinstance(model.get_output_embeddings(), torch.nn.Linear)


def cache_chunk(kv: Any, args: tuple, logits: bool) -> torch.Tensor | None:
    """Run one causal chunk ``args`` (tokens, positions, visible, since) on ``kv``; the last
    row's logits ``[V]`` if ``logits``. Without them, the LM head is left out where ``kv`` computes
    it apart (a drafting run's prompt, a prompt's chunk before its last: the product over the
    vocabulary, 3.8 ms a row at the embedded target)."""
    if not logits and kv.supports_lazy_head():
        kv.forward_hidden(*args)
        return None
    last = kv.forward(*args, last_only=True)
    return last[-1] if logits else None


# ------------------------------------------------------------------ the few-row linear kernels
def few_row_plan(model: torch.nn.Module, device: torch.device, cpu_linear: bool | LinearPlan) -> LinearPlan | None:
    """The few-row linear kernels (kernels/linear_plan.py) a model+cache on ``device`` runs by row
    count: ``cpu_linear`` resolved (True: the layout tuned on the EPYC; False: none), never off
    the CPU or on sharded weights, packed weights only where a second copy of them is affordable."""
    plan = fixed_plan() if cpu_linear is True else (cpu_linear or None)
    if plan is not None and not (plan.active and device.type == "cpu" and distributed.layout_allowed(model)):
        return None
    # (asked only of a plan that packs: the answer walks every parameter, ~0.7 ms on SmolLM2-135M)
    if plan is not None and plan.packs and not packing_applies(model):
        plan = plan.without_packing()
    return plan


def few_row_layout(plan: LinearPlan | None, rows: int | None = None) -> contextlib.AbstractContextManager:
    """The few-row kernels for a call of ``rows`` rows (None: any). A call whose row count the
    plan leaves on ``F.linear`` runs without the mode: a TorchFunctionMode sees every torch call
    of the forward, and its Python dispatch cost ~0.3x a one-row step of SmolLM2-135M on an
    Intel Sapphire Rapids, where the plan keeps one-row calls on ``F.linear``."""
    if plan is None or (rows is not None and plan.kernel(rows) == "linear"):
        return contextlib.nullcontext()
    return SmallBatchLinear(plan=plan)


def head_argmax(kv: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The argmax of ``kv``'s head over its vocabulary on each row of ``hidden`` (a single or a
    batched cache: its ``model``, ``head``, ``vocab_size``, ``device`` and ``apply_head``): through
    the head's int8 screen where it applies, else from the logits."""
    screened = None
    if kv.device.type == "cpu" and not distributed.is_sharded(kv.model):
        screened = for_head(kv.head, kv.vocab_size)
    if screened is None:
        return kv.apply_head(hidden)[..., : kv.vocab_size].argmax(-1).view(-1)
    return screened.argmax(hidden, kv.apply_head)


def head_layout(plan: LinearPlan | None, rows: int) -> contextlib.AbstractContextManager:
    """The kernels of a call of the LM head alone on ``rows`` final hidden states (the lazy
    head's): the plan's own bands for the head (:meth:`LinearPlan.head_plan`)."""
    return few_row_layout(None if plan is None else plan.head_plan(), rows)


def padded_step_inputs(tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int, length: int,
                       bucket: int, columns: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed-shape step's inputs for ``q = len(tokens)`` real rows padded to ``bucket``: token ids
    and positions ``[1, bucket]`` and which of ``columns`` cache columns each row sees
    ``[bucket, columns]``. Real rows see every row before ``since`` and ``visible`` from there;
    padding rows repeat the last position and see only their own row (written at ``length + i``,
    past the real rows: never seen by a later call, then overwritten), so no row is all-masked."""
    q = tokens.numel()
    ids = torch.zeros(1, bucket, dtype=torch.long)
    ids[0, :q] = tokens
    pos = torch.full((1, bucket), int(positions[-1]), dtype=torch.long)
    pos[0, :q] = positions
    allowed = torch.zeros(bucket, columns, dtype=torch.bool)
    allowed[:q, :since] = True
    allowed[:q, since : length + q] = visible
    pad = torch.arange(q, bucket)
    allowed[pad, length + pad] = True
    return ids, pos, allowed


# ------------------------------------------------------------------------- model + its cache
class CachedModel:
    """A causal LM together with its KV cache: the one place that calls the model while decoding.

    ``forward`` runs new tokens that see every cached row before ``since`` and, among the rows
    from ``since`` on plus the new tokens themselves, exactly those marked in ``visible``
    (``[q, length - since + q]``). That covers the prefill's causal chain, the drafter's levels and
    the target's verify pass with one mask convention.
    """

    engine = "hf"
    max_tree_rows: int | None = None  # (any tree: the dynamic cache grows)

    def __init__(self, model: torch.nn.Module, vocab_size: int, cpu_linear: bool | LinearPlan = False) -> None:
        param = next(model.parameters())
        self.model = model
        self.vocab_size = vocab_size
        self.device, self.dtype = param.device, param.dtype
        # Sliding-window layers (None: all full attention): their masks need each cache row's position.
        self.layout: AttentionLayout | None = attention_layout(model)
        self.cache = new_cache(model, layout=self.layout)
        self.calls = 0
        self.pos = torch.zeros(0, dtype=torch.long)
        plan = self.linear_plan = few_row_plan(model, self.device, cpu_linear)
        self.cpu_linear = plan is not None
        self.packed_linear = plan is not None and plan.packs

    def _layout(self, rows: int | None = None) -> contextlib.AbstractContextManager:
        return few_row_layout(self.linear_plan, rows)

    def apply_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states (what :class:`~dynatree.core.verify.LazyLogits` calls),
        with the plan's kernels for the head alone."""
        with head_layout(self.linear_plan, hidden.numel() // hidden.shape[-1]):
            return self.head(hidden)

    def head_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """The argmax of the head's logits on each row of ``hidden``: through the head's int8
        screen where it applies (:mod:`dynatree.runtime.kernels.screened_head`: fp32 weights on a
        CPU, this machine's int8 product exact; not a head sharded over ranks), else from the logits."""
        return head_argmax(self, hidden)

    @property
    def length(self) -> int:
        return cache_length(self.cache)

    def prefill(self, tokens: Sequence[int], hidden: bool = False, layers: Sequence[int] = (),
                logits: bool = False) -> torch.Tensor | None:
        """Cache ``tokens`` with plain causal attention. With ``hidden``, return their features
        (:meth:`forward_features`: what a feature-conditioned draft reads); with ``logits``, the
        last token's logits ``[V]`` (computed by the call anyway: a draft's first round then needs
        no call of its own for the root)."""
        q = len(tokens)
        if not q:
            width = self.model.config.hidden_size * max(1, len(layers))
            return torch.zeros(0, width, dtype=self.dtype, device=self.device) if hidden else None
        args = (tokens, torch.arange(self.length, self.length + q), torch.ones(q, q, dtype=torch.bool).tril(), self.length)
        if hidden:
            return self.forward_features(*args, layers=layers)[1]
        return cache_chunk(self, args, logits)

    def forward(
        self,
        tokens: Sequence[int] | torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        since: int,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Run ``tokens`` at ``positions``; returns float logits ``[q, V]`` (``[1, V]`` if last_only)."""
        out = self.call(tokens, positions, visible, since, logits_to_keep=1 if last_only else 0)
        return out.logits[0, :, : self.vocab_size].float()

    def call(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
             base: bool = False, **inputs: Any) -> Any:
        """One model call on the cache (mask and positions as in :meth:`forward`) with extra model
        ``inputs`` (a feature draft's ``features``); returns the model's raw output. ``base`` calls
        the model without its LM head (``base_model``)."""
        self.calls += 1
        rows = len(tokens)
        with self._layout(rows), grouped_kv(grouped_kv_applies(self.device, rows)):
            out = (self.model.base_model if base else self.model)(
                input_ids=torch.as_tensor(tokens, dtype=torch.long).view(1, -1).to(self.device),
                attention_mask=self._mask(visible, since, positions),
                position_ids=positions.view(1, -1).to(self.device),
                past_key_values=self.cache,
                use_cache=True,
                **inputs,
            )
        self._track(positions)
        return out

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        compact(self.cache, start, keep)
        if self.layout is not None:
            self.pos = torch.cat([self.pos[:start], self.pos[torch.as_tensor(keep, dtype=torch.long)]])

    def _mask(self, visible: torch.Tensor, since: int, positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """The call's additive mask; per layer type (sliding windows applied) for sliding-window models."""
        from dynatree.core.tree import attention_mask

        if self.layout is None:
            q = visible.shape[0]
            if q == 1 and bool(visible.all()):
                # One row that sees every cached row (an autoregressive step, a draft's chain):
                # no mask, the path HF's own generate takes (SDPA without a mask, grouped-query
                # heads packed); an all-visible additive mask computes the same softmax slower.
                return None
            if visible.shape[1] == q and torch.equal(visible, torch.ones(q, q, dtype=torch.bool).tril()):
                # New tokens in a causal chain after every cached row (a prefill, a chain-shaped
                # tree): HF's own causal mask, which is what its generate uses; on CPU SDPA then
                # skips the blocks above the diagonal (a 1,500-token prefill of SmolLM2-135M: 3.0 s
                # against 3.6 s with our additive mask, 2-core Intel Xeon).
                return None
            return attention_mask(visible, since, self.dtype, self.device)
        q = visible.shape[0]
        allowed = torch.ones(q, since + visible.shape[1], dtype=torch.bool)
        allowed[:, since:] = visible
        key_pos = torch.cat([self.pos, positions.flatten().cpu()])
        return layer_masks(allowed, positions.flatten().cpu(), key_pos, self.layout, self.dtype, self.device)

    def _track(self, positions: torch.Tensor) -> None:
        """Remember the positions of the rows just cached (a sliding window is a span of positions)."""
        if self.layout is not None:
            self.pos = torch.cat([self.pos, positions.flatten().cpu()])

    @property
    def head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def plain_head(self) -> bool:
        """True if logits are exactly ``head(base_model(...))``: no scaling or soft-capping on top."""
        return plain_head(self.model)

    def supports_lazy_head(self) -> bool:
        """Whether :meth:`forward_hidden` + :attr:`head` reproduce :meth:`forward` exactly."""
        return self.plain_head()

    def forward_hidden(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                       since: int) -> torch.Tensor:
        """Like :meth:`forward` but stops before the LM head: final hidden states ``[q, H]``."""
        return self.call(tokens, positions, visible, since, base=True).last_hidden_state[0]

    def forward_features(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                         since: int, layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """(final hidden states ``[q, H]``, features): the features are the final hidden states, or
        with ``layers`` the outputs of those decoder layers concatenated ``[q, len(layers) * H]``
        (EAGLE-3's fused features). Layer outputs are read on the eager engine only: the static
        engine's compiled steps return the final hidden states alone."""
        if not layers:
            hidden = self.forward_hidden(tokens, positions, visible, since)
            return hidden, hidden
        if self.engine != "hf":
            raise DynaTreeError(f"fused target features (layers {list(layers)}) need the hf engine, not {self.engine!r}")
        out = self.call(tokens, positions, visible, since, base=True, output_hidden_states=True)
        # hidden_states[i] is decoder layer i's output (0: the embeddings; the last: after the final norm)
        return out.last_hidden_state[0], torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)


class BucketedModel(CachedModel):
    """A model+cache whose steps have fixed shapes (query rows padded to buckets): its ``_run``
    returns the real rows of one step, final hidden states when ``_hidden`` (the head is then
    applied here, to those rows only), else logits. The static and the aot engines are two."""

    _hidden: bool
    buckets: tuple[int, ...]

    def bucket_for(self, rows: int) -> int | None:
        """The smallest bucket that holds a call of ``rows`` rows (None: larger than every bucket)."""
        return next((b for b in self.buckets if b >= rows), None)

    def _run(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
             last_only: bool) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
                last_only: bool = False) -> torch.Tensor:
        rows = self._run(tokens, positions, visible, since, last_only)
        if self._hidden:
            rows = self.apply_head(rows)
        return rows[:, : self.vocab_size].float()

    def forward_hidden(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                       since: int) -> torch.Tensor:
        if not self._hidden:
            raise DynaTreeError("this model's logits are not head(hidden states); use forward()")
        return self._run(tokens, positions, visible, since, False)


class StaticCachedModel(BucketedModel):
    """Pre-allocated KV cache, query counts padded to fixed buckets, optionally ``torch.compile``d.

    Every call has one of a few shapes (``[1, bucket]`` tokens against a ``[bucket, capacity]``
    mask), so a compiled step is traced once per bucket and never again, and on GPU each can be a
    CUDA graph (``compile_mode="reduce-overhead"``). Padding queries write their KV rows after the
    real ones; those rows lie past ``length`` and are masked from every later query, then
    overwritten. Compaction gathers accepted rows in place, the cache's storage never moves.
    """

    engine = "static"
    BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        capacity: int,
        compile: bool = False,
        compile_mode: str | None = None,
        buckets: Sequence[int] | None = None,
        cpu_linear: bool | LinearPlan = False,
    ) -> None:
        super().__init__(model, vocab_size, cpu_linear)
        self.buckets = tuple(sorted(buckets)) if buckets else self.BUCKETS
        self.max_tree_rows = self.buckets[-1]  # a verify call takes at most the largest bucket
        self.capacity = capacity + self.buckets[-1]  # room for the padding of the last call
        self.cache = StaticCache(config=model.config, max_cache_len=self.capacity)
        if self.layout is not None:  # full-length rows; the mask applies the window (see dynatree.runtime.window)
            self.cache.layers = [StaticLayer(max_cache_len=self.capacity) if type(x) is StaticSlidingWindowLayer else x
                                 for x in self.cache.layers]
            self.pos = torch.zeros(self.capacity, dtype=torch.long)
        self._length = 0
        self._prefilling = False
        # The compiled step stops before the LM head when the head is a plain Linear: the head is
        # then applied to the real rows only (not the bucket's padding), or lazily per tree node.
        self._hidden = self.plain_head()
        self._step = self._raw_step
        self._warm: set[int] = set()  # buckets whose compiled graph exists (see _call)
        self._compiled = bool(compile)
        if compile:
            check_compiler(self.device)  # a one-line error, not an inductor traceback on the first call
            self._step = torch.compile(self._raw_step, dynamic=False, mode=compile_mode)
            self._limit_name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
            # Initialise the cache eagerly: a graph traced on the lazy first call would guard on
            # is_initialized == False and be traced again on the next call, and the cache tensors
            # are only marked as static addresses (CUDA graphs) outside compilation.
            device = next(model.parameters()).device
            mask = torch.zeros(1, 1, 1, self.capacity, dtype=self.dtype, device=device)
            if self.layout is not None and self.layout.mixed:
                mask = {t: mask for t in set(self.layout.types)}
            self._raw_step(torch.zeros(1, 1, dtype=torch.long, device=device), mask,
                           torch.zeros(1, 1, dtype=torch.long, device=device))
            self._set_length(0)

    @property
    def length(self) -> int:
        return self._length

    PREFILL_CHUNK = PREFILL_CHUNK  # (dynatree.tuning)

    def prefill(self, tokens: Sequence[int], hidden: bool = False, layers: Sequence[int] = (),
                logits: bool = False) -> torch.Tensor | None:
        """Causal prefill in chunks of at most ``PREFILL_CHUNK`` tokens. Chunks larger than the
        largest bucket run the *uncompiled* step unpadded (one trace per prompt length would be
        worse): with small buckets (e.g. 1, 2, 4 on a CPU) a prompt would otherwise take dozens of
        calls."""
        step = max(self.buckets[-1], self.PREFILL_CHUNK)
        parts = []
        self._prefilling = True  # chunks above the largest bucket may run eager and unpadded
        try:
            for i in range(0, len(tokens), step):
                parts.append(super().prefill(list(tokens[i : i + step]), hidden, layers, logits and i + step >= len(tokens)))
        finally:
            self._prefilling = False
        if not hidden:
            return parts[-1] if logits and parts else None
        return torch.cat(parts) if parts else super().prefill([], hidden, layers)

    def precompile(self) -> None:
        """Run one causal call per bucket (compiling its graph if compiled), then empty the cache."""
        for b in self.buckets:
            self.reset()
            self.forward(torch.zeros(b, dtype=torch.long), torch.arange(b), torch.ones(b, b, dtype=torch.bool).tril(), 0)
        self.reset()

    def reset(self) -> None:
        """Empty the cache for a new generation (storage and compiled graphs are kept)."""
        self._set_length(0)
        self.calls = 0

    def _raw_step(self, ids: torch.Tensor, mask: torch.Tensor | dict[str, torch.Tensor], pos: torch.Tensor) -> torch.Tensor:
        with self._layout(ids.shape[-1]):
            if self._hidden:
                return self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                             past_key_values=self.cache, use_cache=True).last_hidden_state
            return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache,
                              use_cache=True).logits

    def _set_length(self, length: int) -> None:
        self._length = length
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(length)


    def _run(self, tokens: Sequence[int] | torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, since: int,
             last_only: bool) -> torch.Tensor:
        """One padded, possibly compiled step; the real rows of its output (hidden states or logits)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        q, length = tokens.numel(), self._length
        if length + q > self.capacity - self.buckets[-1]:  # (an unpadded prefill chunk needs no more)
            raise DynaTreeError(f"static cache capacity {self.capacity - self.buckets[-1]} exceeded ({length + q} rows)")
        bucket = self.bucket_for(q)
        step = self._step
        if bucket is None and (last_only or self._prefilling) and q <= self.PREFILL_CHUNK:  # a prefill chunk: eager, unpadded
            bucket, step = q, self._raw_step
        if bucket is None:
            raise DynaTreeError(f"a call of {q} tokens exceeds the largest static bucket ({self.buckets[-1]}); use engine='hf'")
        self.calls += 1
        ids, pos, allowed = padded_step_inputs(tokens, positions, visible, since, length, bucket, self.capacity)
        if self.layout is None:
            mask = torch.zeros(bucket, self.capacity, dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
            mask = mask.view(1, 1, bucket, -1).to(self.device)
        else:
            # Rows past length + bucket are masked anyway; the padding rows sit at their queries' positions.
            self.pos[length : length + bucket] = pos[0]
            mask = layer_masks(allowed, pos[0], self.pos, self.layout, self.dtype, self.device)
        out = self._call(step, bucket, ids.to(self.device), mask, pos.to(self.device))
        self._set_length(length + q)
        rows = out[0, q - 1 : q] if last_only else out[0, :q]
        # clone: a CUDA-graph replay reuses its output buffer on the next call
        return rows.clone()

    # Dynamo checks every guard of a compiled step before each call: on a CPU that was about 2.6 ms
    # per call for a tiny model (cProfile, 2-core AMD EPYC VM), several times per round. Once
    # a bucket's graph exists nothing a later call changes can invalidate it (same model, same cache
    # tensors, same shapes), so later calls run only the guards that tell the existing graphs
    # apart (torch.compiler.set_stance(skip_guard_eval_unsafe=True), made for this warm-up-then-
    # serve pattern). The first call of a bucket keeps the full guards so it compiles normally.
    # Off by default: the GPU kit's smoke run (tests/bench/test_gpu_kit.py) hit "Recompilation triggered
    # with skip_guard_eval_unsafe stance" with it on, i.e. a warm bucket still needed a new graph;
    # a skipped guard that was needed could pick the wrong graph silently, and the measured gain
    # (~10% on a tiny compiled model) does not pay for that risk until the cause is understood.
    FAST_GUARDS = False

    def _call(self, step: Any, bucket: int, *args: torch.Tensor) -> torch.Tensor:
        if not self._compiled or step is self._raw_step:
            return step(*args)
        if self.FAST_GUARDS and bucket in self._warm:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return step(*args)
        # Every static cache of the process compiles this one method: one graph per (architecture,
        # bucket, mask layout), shared by engines of the same architecture. Target and draft alone
        # pass dynamo's default limit of 8 graphs per code object, beyond which it would silently
        # run the step uncompiled; a process that builds many engines (the bench, the tests)
        # needs more. So during the call the limit is dynamo's own overall safeguard
        # (accumulated_recompile_limit), restored afterwards (a save and restore costs ~5 us,
        # torch._dynamo.config.patch ~180 us): the setting other code sees stays unchanged.
        cfg, name = torch._dynamo.config, self._limit_name
        saved = getattr(cfg, name)
        setattr(cfg, name, max(saved, getattr(cfg, "accumulated_recompile_limit", 256)))
        try:
            out = step(*args)
        finally:
            setattr(cfg, name, saved)
        self._warm.add(bucket)
        return out

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        keep_t = torch.as_tensor(keep, dtype=torch.long)
        compact(self.cache, start, keep_t, truncate=False)
        if self.layout is not None:
            self.pos[start : start + keep_t.numel()] = self.pos[keep_t]
        self._set_length(start + int(keep_t.numel()))
