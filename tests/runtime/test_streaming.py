"""StreamingLLM-style eviction (attention sinks + recent window): exact per token, for every strategy.

The reference is written the way the StreamingLLM paper describes it (positions *inside* the cache:
window keys re-rotated down each step, sinks fixed), independently of the wrapper's scheme (true
positions, sinks re-rotated per query). Speculative output must equal it token for token.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from transformers import DynamicCache

from dynatree import EngineOptions, StoppingConfig, generate
from dynatree.errors import DynaTreeError
from dynatree.runtime.streaming import StreamingKV, find_rope, rotate
from tiny import perturbed, tiny_model

ROPE_ARCHS = ("llama", "neox", "qwen2")
SINKS, WINDOW, NEW = 2, 16, 120
EVICTING = EngineOptions(kv_window=WINDOW, kv_sinks=SINKS)
NO_EOS = StoppingConfig(eos_token_id=())
ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineOptions)}
SPECS = {
    "autoregressive": {},
    "linear": {"k": 4},
    "fixed": {"depth": 4, "branch": 2, "max_nodes": 8},
    "dynatree": {"max_nodes": 8},
    "dyspec": {"max_nodes": 8},
    "dyspec-threshold": {"max_nodes": 8},
}


def prompt(n: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, 96, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def streaming_llm_reference(model, ids: torch.Tensor, new: int, sinks: int, window: int) -> list[int]:
    """Greedy decoding, one token at a time, with the cache laid out as StreamingLLM does.

    Keys are kept at their true positions on the side; every step builds a cache of the sinks
    plus the last ``window`` tokens with the window re-rotated to consecutive cache positions, and
    the new token sits at the next cache position.
    """
    rope = find_rope(model)
    n_layers = model.config.num_hidden_layers
    keys: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
    values: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
    tokens = ids[0].tolist()
    out: list[int] = []
    t = 0
    while len(out) < new:
        start = max(sinks, t - window)
        kept = list(range(min(sinks, t))) + list(range(start, t))
        cache = DynamicCache(config=model.config)
        for layer in range(n_layers):
            if kept:
                k = torch.cat([keys[layer][j] if j < sinks else rotate(keys[layer][j], sinks - start, rope)
                               for j in kept], dim=-2)
                v = torch.cat([values[layer][j] for j in kept], dim=-2)
                cache.update(k, v, layer)
        here = len(kept)  # the query's position inside the cache
        logits = model(input_ids=torch.tensor([[tokens[t]]]), position_ids=torch.tensor([[here]]),
                       past_key_values=cache, use_cache=True).logits
        for layer in range(n_layers):
            keys[layer].append(rotate(cache.layers[layer].keys[..., -1:, :], t - here, rope))
            values[layer].append(cache.layers[layer].values[..., -1:, :])
        t += 1
        if t >= len(tokens):
            nxt = int(logits[0, -1].argmax())
            tokens.append(nxt)
            out.append(nxt)
    return out


def test_rotate_moves_keys_like_running_later() -> None:
    """Keys of a prompt run at offset 7 equal its keys at offset 0 rotated by 7, in every layer."""
    for arch in ROPE_ARCHS:
        model = tiny_model(arch)
        rope = find_rope(model)
        ids = prompt(6)
        runs = []
        for offset in (0, 7):
            cache = DynamicCache(config=model.config)
            with torch.inference_mode():
                model(input_ids=ids, position_ids=torch.arange(offset, offset + 6).view(1, -1),
                      past_key_values=cache, use_cache=True)
            runs.append([layer.keys for layer in cache.layers])
        for k0, k7 in zip(*runs):
            torch.testing.assert_close(rotate(k0, 7, rope), k7, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(k0, k7, atol=1e-3), "positions must matter for the check to mean anything"


@pytest.mark.parametrize("arch", ROPE_ARCHS)
def test_every_strategy_equals_the_streaming_llm_reference(arch: str) -> None:
    target = tiny_model(arch, max_positions=64)  # 13 + 120 tokens: twice the model's context
    draft = perturbed(target)
    ids = prompt()
    ref = streaming_llm_reference(target, ids, NEW, SINKS, WINDOW)
    full_context = generate(target, draft, ids, "autoregressive", max_new_tokens=40, stopping=NO_EOS, text=False)
    full_context = full_context.sequences[0, 13:].tolist()
    assert ref[:40] != full_context, "the window must change the output, or the test proves nothing"
    for name, opts in SPECS.items():
        out = generate(target, draft, ids, name, max_new_tokens=NEW, stopping=NO_EOS, options=EVICTING,
                       seed=0, **opts, text=False)
        assert out.sequences[0, 13:].tolist() == ref, f"{arch}/{name} differs from StreamingLLM decoding"


def test_round_granular_sinks_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: one sink shift per call (what evicting between rounds gives) breaks exactness."""
    monkeypatch.setattr(StreamingKV, "shifts", lambda self, pos: (pos[:1] - self.config.sinks
                                                                  - self.config.window).clamp(min=0).expand_as(pos))
    target = tiny_model("llama", max_positions=64)
    draft = perturbed(target)
    ids = prompt()
    ref = streaming_llm_reference(target, ids, NEW, SINKS, WINDOW)
    outs = [generate(target, draft, ids, name, max_new_tokens=NEW, stopping=NO_EOS, options=EVICTING, **SPECS[name], text=False)
            .sequences[0, 13:].tolist() for name in ("linear", "fixed", "dynatree")]
    assert any(out != ref for out in outs)


def test_window_larger_than_the_run_changes_nothing() -> None:
    target = tiny_model("neox")
    draft = perturbed(target)
    ids = prompt()
    full = generate(target, draft, ids, "dynatree", max_new_tokens=50, stopping=NO_EOS, max_nodes=8, text=False).sequences
    evicting = generate(target, draft, ids, "dynatree", max_new_tokens=50, stopping=NO_EOS, max_nodes=8,
                        options=EngineOptions(kv_window=200), text=False).sequences
    assert torch.equal(full, evicting)


def test_cache_stays_bounded_and_prompt_longer_than_window(monkeypatch: pytest.MonkeyPatch) -> None:
    rows: list[int] = []
    compact = StreamingKV.compact

    def spy(self, start, keep):
        compact(self, start, keep)
        rows.append(self.rows)

    monkeypatch.setattr(StreamingKV, "compact", spy)
    target = tiny_model("llama", layers=1, max_positions=64)
    ids = prompt(150)  # longer than the model's context and than the window
    out = generate(target, perturbed(target), ids, "dynatree", max_new_tokens=300, stopping=NO_EOS, max_nodes=8,
                   options=EngineOptions(kv_window=24, kv_sinks=4), text=False)
    assert out.sequences.shape[1] == 450
    chunk = 64  # StreamingConfig.evict_chunk
    assert rows and max(rows) <= 4 + 24 + chunk + 8 + 1
    assert min(rows[len(rows) // 2:]) >= 4 + 24  # and it does keep the window


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_window": 0}, "kv_window must be a positive integer"),
        ({"kv_window": 16, "kv_sinks": -1}, "kv_sinks must be an integer >= 0"),
        ({"kv_window": 5, "strategy": "linear", "k": 5}, "must exceed the strategy's maximum tree depth (5)"),
        ({"kv_window": 100}, "kv_sinks + kv_window + 1 = 105 exceeds"),
        ({"kv_window": 16, "engine": "static"}, "engine='hf' only"),
    ],
)
def test_streaming_errors(kwargs: dict, message: str) -> None:
    target = tiny_model("llama", max_positions=64)
    engine = {k: v for k, v in kwargs.items() if k in ENGINE_FIELDS}  # refused where EngineOptions is built
    kwargs = {"strategy": "dynatree", **{k: v for k, v in kwargs.items() if k not in ENGINE_FIELDS}}
    with pytest.raises(DynaTreeError, match=re.escape(message)):
        generate(target, perturbed(target), prompt(), max_new_tokens=8, options=EngineOptions(**engine), **kwargs, text=False)


def test_learned_positions_are_refused() -> None:
    target = tiny_model("gpt2")
    with pytest.raises(DynaTreeError, match="needs NeoX-style rotary positions"):
        generate(target, perturbed(target), prompt(), "linear", max_new_tokens=8, options=EngineOptions(kv_window=32), text=False)


def test_too_long_without_eviction_suggests_it() -> None:
    target = tiny_model("llama", max_positions=64)
    with pytest.raises(DynaTreeError, match=r"EngineOptions\(kv_window=N\)"):
        generate(target, perturbed(target), prompt(), "linear", max_new_tokens=100, text=False)


def test_the_default_hybrid_fits_a_window_below_the_text_depth() -> None:
    """The library's default with a draft model (the model and the text in one tree) under a
    window smaller than the text's full depth (32): its text proposals are cut to the window, so
    it runs where the model alone runs, equal to StreamingLLM decoding, and the text still drafts."""
    target = tiny_model("llama", max_positions=64)
    draft = perturbed(target)
    ids = prompt()
    ref = streaming_llm_reference(target, ids, NEW, SINKS, WINDOW)
    for name in ("dynatree", "dyspec"):
        out = generate(target, draft, ids, name, max_new_tokens=NEW, stopping=NO_EOS, options=EVICTING, seed=0,
                       **SPECS[name])
        assert out.sequences[0, 13:].tolist() == ref, name
        assert max(r.depth for r in out.stats.rounds) < WINDOW
