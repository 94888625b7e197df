"""StreamingLLM-style KV eviction (attention sinks + a recent window), exact for every strategy.

The first DynaTree paper version compares against "StreamingLLM + speculative": the first ``sinks`` tokens stay in the
cache forever (they absorb attention mass) and only the ``window`` most recent tokens are kept
besides them, so memory is bounded and a model can generate past its trained context. StreamingLLM
assigns positions *inside the cache*: once the window is full, a query sees each window key at its
true distance and each sink ``i`` at distance ``sinks + window - i``.

The semantics here are per token, so they do not depend on how tokens are grouped into rounds:
token ``t`` attends to the sinks and to tokens ``t - window .. t`` with exactly those distances.
That makes greedy speculative output equal greedy autoregressive output under the same eviction
(tested), which a round-granular eviction (evict between rounds, one sink position per round)
would not give. How, on RoPE models:

* every row keeps its true position (window distances are then right with no re-rotation);
* the sink keys are re-rotated per query: a query at ``t > sinks + window`` sees a copy of the
  sink rows rotated by ``t - sinks - window`` (one copy per distinct shift in the call, appended
  for the call and removed after it), and the originals otherwise;
* rows older than the window are masked per query and physically dropped in chunks.

Requires rotary position embeddings applied NeoX-style (``rotate_half`` on the first rotary dims:
Llama, Mistral, Qwen2/3, GPTNeoX/Pythia); learned absolute positions (GPT-2) cannot be moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynatree.runtime.cache import CachedModel, cache_chunk, compact
from dynatree.errors import DynaTreeError
from dynatree.options import check_window
from dynatree.runtime.window import attention_layout

#: Architectures whose rotary embedding is ``x * cos + rotate_half(x) * sin`` on the first dims.
ROPE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gpt_neox")
#: RoPE variants whose angle is linear in the position (a shift is then a rotation).
LINEAR_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class StreamingConfig:
    """``sinks`` first tokens kept forever + the ``window`` most recent tokens (StreamingLLM: 4 sinks)."""

    window: int
    sinks: int = 4
    #: evict once this many rows have left the window (amortises the row move; invisible anyway)
    evict_chunk: int = 64

    def __post_init__(self) -> None:
        check_window(self.window, self.sinks)
        if not isinstance(self.evict_chunk, int) or self.evict_chunk < 1:
            raise DynaTreeError(f"evict_chunk must be a positive integer, got {self.evict_chunk!r}")

    def check(self, model: torch.nn.Module, max_depth: int, limit: int | None) -> None:
        """Refuse windows the tree or the model cannot live with (messages name the numbers)."""
        if self.window <= max_depth:
            raise DynaTreeError(
                f"kv_window ({self.window}) must exceed the strategy's maximum tree depth ({max_depth}): "
                "a node must see all its ancestors"
            )
        span = self.sinks + self.window + 1
        if limit is not None and span > limit:
            raise DynaTreeError(
                f"kv_sinks + kv_window + 1 = {span} exceeds {type(model).__name__}'s maximum of {limit} positions"
            )


@dataclass(frozen=True)
class Rope:
    """What a key rotation needs: the frequencies (float64) and how many leading dims rotate."""

    inv_freq: torch.Tensor
    dims: int


def find_rope(model: torch.nn.Module) -> Rope:
    """The model's rotary embedding, or a one-line error saying why eviction cannot move its keys."""
    layout = attention_layout(model)
    if layout is not None:
        # Eviction moves rows and re-rotates sink copies behind the cache's back; the per-position
        # window masks of dynatree.runtime.window would then be built over the wrong rows.
        raise DynaTreeError(
            f"KV eviction (kv_window) cannot be combined with sliding-window attention ({type(model).__name__}: "
            f"{layout.describe()}); the model's own window already bounds attention, run it without kv_window"
        )
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in ROPE_MODEL_TYPES:
        raise DynaTreeError(
            f"KV eviction (kv_window) needs NeoX-style rotary positions; {type(model).__name__} "
            f"(model_type {kind!r}) is not one of {', '.join(ROPE_MODEL_TYPES)}"
        )
    ropes = [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    if not ropes or any(not torch.equal(r.inv_freq, ropes[0].inv_freq) for r in ropes):
        raise DynaTreeError(f"KV eviction: {type(model).__name__} does not have one rotary embedding")
    kind = getattr(ropes[0], "rope_type", "default")
    if kind not in LINEAR_ROPE_TYPES:
        raise DynaTreeError(f"KV eviction: rope_type {kind!r} is not linear in the position "
                            f"(supported: {', '.join(LINEAR_ROPE_TYPES)})")
    inv = ropes[0].inv_freq.detach().to("cpu", torch.float64)
    return Rope(inv, 2 * inv.numel())


def rotate(keys: torch.Tensor, shift: int, rope: Rope) -> torch.Tensor:
    """Keys ``[..., n, head_dim]`` as if computed ``shift`` positions later (RoPE composes additively).

    HF stores ``scale * (k cos(p f) + rotate_half(k) sin(p f))``; rotating that by ``shift f``
    gives the key at ``p + shift`` with the same scale, so no attention-scaling factor is applied.
    """
    angle = torch.cat([shift * rope.inv_freq] * 2)
    cos = angle.cos().to(keys.device, keys.dtype)
    sin = angle.sin().to(keys.device, keys.dtype)
    rot, rest = keys[..., : rope.dims], keys[..., rope.dims :]
    half = rope.dims // 2
    turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + turned * sin, rest], dim=-1)


class StreamingKV:
    """A :class:`CachedModel` seen through sink + window eviction, with the same interface.

    Callers keep using *logical* row indices (``length`` counts every token ever cached, so
    positions stay ``length + depth``); the wrapper maps them to physical rows, builds each call's
    mask over the rows actually present and keeps ``pos``, the true position of every row.
    """

    def __init__(self, kv: CachedModel, config: StreamingConfig, rope: Rope) -> None:
        if kv.engine != "hf":
            raise DynaTreeError("KV eviction (kv_window) works with engine='hf' only")
        self.kv, self.config, self.rope = kv, config, rope
        self.pos = torch.zeros(0, dtype=torch.long)  # true position of each physical row
        self.evicted = 0  # rows dropped from the front of the window so far

    # --------------------------------------------------------------- CachedModel interface
    engine = "hf"
    max_tree_rows: int | None = None

    @property
    def length(self) -> int:
        return self.kv.length + self.evicted

    @property
    def rows(self) -> int:
        """Rows physically in the cache (bounded by sinks + window + chunk + one round)."""
        return self.kv.length

    # The wrapped model's identity and head are unchanged by eviction: explicit delegation, so the
    # KVModel interface (dynatree.runtime.cache) is what a reader and a type checker see here.
    @property
    def model(self) -> torch.nn.Module:
        return self.kv.model

    @property
    def vocab_size(self) -> int:
        return self.kv.vocab_size

    @property
    def device(self) -> torch.device:
        return self.kv.device

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def calls(self) -> int:
        return self.kv.calls

    def apply_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.kv.apply_head(hidden)

    def head_argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.kv.head_argmax(hidden)

    def supports_lazy_head(self) -> bool:
        return self.kv.supports_lazy_head()

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise DynaTreeError("KV eviction supports forward/forward_hidden only (feature drafts are refused with kv_window)")

    def prefill(self, tokens: Sequence[int], hidden: bool = False, layers: Sequence[int] = (),
                logits: bool = False) -> torch.Tensor | None:
        """Causal prefill in chunks, evicting between them (a prompt may be longer than the window);
        with ``logits``, the last token's ``[V]``. ``hidden`` (features for a feature draft) is
        refused: the engine refuses that pairing first."""
        if hidden:
            raise DynaTreeError("KV eviction does not return hidden states (feature drafts are refused with kv_window)")
        tokens = list(tokens)
        # The sinks go first on their own: later queries may need rotated copies of them.
        first = max(0, min(self.config.sinks - self.length, len(tokens)))
        cuts = [0, *range(first, len(tokens), self.config.evict_chunk), len(tokens)]
        for i, j in zip(cuts, cuts[1:]):
            chunk = tokens[i:j]
            if not chunk:
                continue
            n, start = len(chunk), self.length
            args = (chunk, torch.arange(start, start + n), torch.ones(n, n, dtype=torch.bool).tril(), start)
            last = cache_chunk(self, args, logits and j == len(tokens))
            self._evict()
        return last if logits and tokens else None

    def forward(self, tokens, positions, visible, since, last_only: bool = False) -> torch.Tensor:
        return self._call(self.kv.forward, tokens, positions, visible, since, last_only=last_only)

    def forward_hidden(self, tokens, positions, visible, since) -> torch.Tensor:
        return self._call(self.kv.forward_hidden, tokens, positions, visible, since)

    def forward_features(self, *args: Any, **kwargs: Any) -> Any:
        raise DynaTreeError("KV eviction does not return features (feature drafts are refused with kv_window)")

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        keep_p = torch.as_tensor(keep, dtype=torch.long) - self.evicted
        start_p = start - self.evicted
        self.kv.compact(start_p, keep_p)
        self.pos = torch.cat([self.pos[:start_p], self.pos[keep_p]])
        self._evict()

    # ------------------------------------------------------------------------ internals
    def shifts(self, positions: torch.Tensor) -> torch.Tensor:
        """Per query: how far the sinks must be rotated (0 until the window is full)."""
        return (positions - self.config.sinks - self.config.window).clamp(min=0)

    def _call(self, fn, tokens, positions, visible, since, **kw) -> torch.Tensor:
        cfg = self.config
        positions = torch.as_tensor(positions, dtype=torch.long).flatten()
        phys, q = self.kv.length, positions.numel()
        since_p = since - self.evicted
        if since_p < 0 or since_p > phys:
            raise AssertionError(f"row {since} was evicted (evicted {self.evicted}, cached {phys})")
        shift = self.shifts(positions)
        copies = [int(s) for s in torch.unique(shift) if s > 0]
        sinks = min(cfg.sinks, phys)
        if copies and sinks < cfg.sinks:
            raise AssertionError("a shifted query before every sink is cached")
        # Which rows each query may see: the caller's mask (ancestors), then sinks or band.
        allowed = torch.ones(q, phys + q, dtype=torch.bool)
        allowed[:, since_p:] = visible
        row_pos = torch.cat([self.pos, positions])
        is_sink = row_pos < cfg.sinks
        band = row_pos[None, :] >= positions[:, None] - cfg.window
        allowed &= torch.where(is_sink[None, :], (shift == 0)[:, None], band)
        if copies:
            blocks = [(shift == s)[:, None].expand(q, sinks) for s in copies]
            allowed = torch.cat([allowed[:, :phys], *blocks, allowed[:, phys:]], dim=1)
            self._add_sink_copies(copies, sinks)
        try:
            out = fn(tokens, positions, allowed, 0, **kw)
        finally:
            if copies:  # drop the copies, move the new rows down onto them
                n_copy = len(copies) * sinks
                compact(self.kv.cache, phys, torch.arange(phys + n_copy, self.kv.length))
        self.pos = torch.cat([self.pos, positions])
        return out

    def _add_sink_copies(self, shifts: list[int], sinks: int) -> None:
        for layer in self.kv.cache.layers:
            k = layer.keys[..., :sinks, :]
            v = layer.values[..., :sinks, :]
            layer.keys = torch.cat([layer.keys, *(rotate(k, s, self.rope) for s in shifts)], dim=-2)
            layer.values = torch.cat([layer.values, *([v] * len(shifts))], dim=-2)

    def _evict(self) -> None:
        """Drop window rows no future query can see, once there are ``evict_chunk`` of them."""
        cfg = self.config
        first_needed = self.length - cfg.window  # the next query sits at position >= length
        stale = int(((self.pos >= cfg.sinks) & (self.pos < first_needed)).sum())
        if stale < cfg.evict_chunk:
            return
        keep = torch.nonzero(self.pos >= first_needed).flatten()  # sinks are rows [0, sinks)
        self.kv.compact(cfg.sinks, keep)
        self.pos = torch.cat([self.pos[: cfg.sinks], self.pos[keep]])
        self.evicted += stale
