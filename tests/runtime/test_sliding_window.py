"""Sliding-window and hybrid-attention targets (Mistral, Gemma 3, Qwen2 with a window) are exact.

Tiny random targets with a window of 6 positions generate 24 tokens after a 6-token prompt, so the
window slides four times over during every run. Mistral slides on every layer, Gemma 3 interleaves
sliding and full layers through ``layer_types`` and Qwen2 slides above ``max_window_layers``.
Every strategy is checked against HF ``generate(do_sample=False)`` greedily on both engines and
through the sampling verifier (at ``top_k=1`` the target distribution is a point mass, so lossless
sampling must reproduce the greedy text). The verify pass's full logits, not only their argmax, are
checked against a plain HF forward of each root-to-node path, with trees deeper than the window.
Mutants that drop or misplace the window must be caught.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import dynatree
import dynatree.runtime.cache
from dynatree import STRATEGIES, EngineOptions, SamplingConfig, StoppingConfig
from dynatree.runtime.cache import CachedModel, StaticCachedModel
from dynatree.errors import DynaTreeError
from dynatree.core.tree import TreeBuilder
from dynatree.core.verify import tree_forward
from dynatree.runtime.window import SLIDING, AttentionLayout, attention_layout
from tiny import VOCAB, WINDOW_ARCHS, hf_greedy, perturbed, window_model

OPTIONS: dict[str, dict] = {
    "linear": {"k": 4},
    "fixed": {"depth": 4, "branch": 2, "tau": 0.0, "max_nodes": 16},
    "dynatree": {"tau": 0.0, "d0": 3, "d_max": 5, "max_nodes": 16, "window": 2},
    "dyspec": {"max_nodes": 16},
    "dyspec-threshold": {"threshold": 0.01, "max_nodes": 16},
}
PROMPT, NEW = 6, 24
NO_EOS = StoppingConfig(eos_token_id=())


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Hidden size 32 gains nothing from intra-op threads; on a shared 2-core machine a second
    OpenMP thread only spin-waits (this file took 4 min with 2 threads, 45 s with 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def models(arch: str, window: int = 6) -> tuple[torch.nn.Module, torch.nn.Module]:
    target = window_model(arch, window=window)
    return target, perturbed(target)


def prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=None)
def reference(arch: str, window: int = 6) -> torch.Tensor:
    return hf_greedy(models(arch, window)[0], prompt(), NEW)


def run(arch: str, strategy: str, window: int = 6, **kw) -> torch.Tensor:
    target, draft = models(arch, window)
    opts = {**OPTIONS.get(strategy, {}), **kw}
    return dynatree.generate(target, draft, prompt(), strategy, max_new_tokens=NEW, stopping=NO_EOS, **opts, text=False).sequences


def test_models_really_slide() -> None:
    """Guards the setup: the window changes HF's own output, and the layouts are the intended ones."""
    for arch in WINDOW_ARCHS:
        wide = hf_greedy(window_model(arch, window=4096), prompt(), NEW)
        assert not torch.equal(wide, reference(arch)), arch
    kinds = {arch: attention_layout(models(arch)[0]) for arch in WINDOW_ARCHS}
    assert [kinds[a].mixed for a in WINDOW_ARCHS] == [False, True, True]
    assert all(k.window == 6 for k in kinds.values())


@pytest.mark.parametrize("arch", WINDOW_ARCHS)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_equals_target(arch: str, strategy: str) -> None:
    ref = reference(arch)
    for engine in ("hf", "static"):
        out = run(arch, strategy, options=EngineOptions(engine=engine))
        assert torch.equal(out, ref), (arch, strategy, engine, "greedy")
    # Sampling verifier (rejection sampling, residuals) on a point-mass target distribution.
    out = run(arch, strategy, sampling=SamplingConfig(temperature=1.0, top_k=1), seed=3)
    assert torch.equal(out, ref), (arch, strategy, "sampled")


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_trees_deeper_than_the_window(arch: str) -> None:
    """A window of 3 with chains of 5: a node must lose its oldest ancestors on sliding layers."""
    ref = reference(arch, 3)
    for strategy, engine in [("linear", "hf"), ("fixed", "static")]:
        opts = {"k": 5} if strategy == "linear" else {"depth": 5}
        assert torch.equal(run(arch, strategy, 3, options=EngineOptions(engine=engine), **opts), ref), (arch, strategy)


def random_tree(root: int, size: int, seed: int) -> TreeBuilder:
    """A tree with a chain of depth 8 (deeper than the window) and random side branches."""
    g = torch.Generator().manual_seed(seed)
    b = TreeBuilder(root)
    node = 0
    for _ in range(8):
        node = b.add(node, int(torch.randint(2, VOCAB, (1,), generator=g)), 0.0)
    while len(b) < size:
        parent = int(torch.randint(0, len(b), (1,), generator=g))
        b.add(parent, int(torch.randint(2, VOCAB, (1,), generator=g)), 0.0)
    return b


def path_tokens(b: TreeBuilder, node: int) -> list[int]:
    out = []
    while node > 0:
        out.append(b.tokens[node])
        node = b.parent[node]
    return out[::-1]


@pytest.mark.parametrize("arch", WINDOW_ARCHS)
@pytest.mark.parametrize("engine", ["hf", "static"])
@torch.inference_mode()
def test_tree_logits_equal_sequential_logits(arch: str, engine: str) -> None:
    """Each node's verify logits equal HF's logits after prefix + root-to-node path (two rounds, the
    second after compacting a deep accepted path), with HF building the window masks itself."""
    target, _ = models(arch, 3)
    kv = CachedModel(target, VOCAB) if engine == "hf" else StaticCachedModel(target, VOCAB, 64, buckets=(1, 16))
    committed = prompt(2)[0].tolist() + [5, 9, 11]
    kv.prefill(committed[:-1])
    for round_ in range(2):
        b = random_tree(committed[-1], 14, round_)
        tree = b.freeze()
        prefix = kv.length
        logits, rows = tree_forward(kv, tree)
        for node in range(tree.size):
            seq = torch.tensor([committed + path_tokens(b, node)])
            want = target(seq).logits[0, -1].float()
            assert torch.allclose(logits[node], want, atol=1e-4, rtol=1e-4), (arch, engine, round_, node)
        kv.compact(prefix, rows[[0, *range(1, 7)]])  # keep the root and six levels of the chain
        committed += path_tokens(b, 6) + [7]


# ------------------------------------------------------------------------------ mutants
def no_window(layer_masks):
    def broken(allowed, query_pos, key_pos, layout, dtype, device):
        return layer_masks(allowed, query_pos, key_pos, dataclasses.replace(layout, window=10**6), dtype, device)

    return broken


def window_everywhere(layer_masks):
    def broken(allowed, query_pos, key_pos, layout, dtype, device):
        masks = layer_masks(allowed, query_pos, key_pos, layout, dtype, device)
        return {t: masks[SLIDING] for t in masks} if isinstance(masks, dict) else masks

    return broken


def window_over_rows(layer_masks):
    def broken(allowed, query_pos, key_pos, layout, dtype, device):
        rows = torch.arange(key_pos.numel())  # (engine="hf": the queries are the last rows)
        return layer_masks(allowed, rows[-query_pos.numel():], rows, layout, dtype, device)

    return broken


MUTANTS = {
    "window ignored": (no_window, WINDOW_ARCHS, 6),
    "window on full layers too": (window_everywhere, ("gemma3", "qwen2-sw"), 6),
    "window over cache rows, not positions": (window_over_rows, ("mistral", "gemma3"), 3),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_window_mutants_are_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make, archs, window = MUTANTS[mutant]
    monkeypatch.setattr(dynatree.runtime.cache, "layer_masks", make(dynatree.runtime.cache.layer_masks))
    for arch in archs:
        caught = any(not torch.equal(run(arch, s, window, **o), reference(arch, window))
                     for s, o in [("linear", {"k": 5}), ("fixed", {"depth": 5})])
        assert caught, f"mutant '{mutant}' was not detected on {arch}"


# ------------------------------------------------------------------------------ refusals
class _Stub(torch.nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config


def test_unsupported_layer_types_are_refused_in_one_line() -> None:
    from transformers import Gemma3TextConfig, Llama4TextConfig

    chunked = Llama4TextConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8)
    with pytest.raises(DynaTreeError, match=r"^_Stub has 'chunked_attention' layers; [^\n]*$"):
        attention_layout(_Stub(chunked))
    hybrid = Gemma3TextConfig(num_hidden_layers=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(DynaTreeError, match=r"^_Stub mixes full and sliding-window layers [^\n]*mapping"):
        attention_layout(_Stub(hybrid))


def test_full_attention_models_have_no_layout() -> None:
    from tiny import tiny_model

    assert attention_layout(tiny_model("llama")) is None
    assert attention_layout(window_model("mistral", window=None)) is None


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_streaming_eviction_is_refused(arch: str) -> None:
    with pytest.raises(DynaTreeError, match=r"^KV eviction \(kv_window\) cannot be combined with sliding-window"):
        run(arch, "linear", options=EngineOptions(kv_window=16))


def test_layout_describes_itself() -> None:
    layout = AttentionLayout(("sliding_attention", "full_attention", "sliding_attention"), 512)
    assert layout.mixed and layout.describe() == "2 of 3 layers sliding-window (W=512)"
