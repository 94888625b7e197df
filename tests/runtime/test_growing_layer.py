"""runtime/growing_layer.py: appends write into spare room instead of copying the layer, and the
layer holds exactly what HF's ``DynamicLayer`` holds through every operation our code performs on a
cache (appends, crops, in-place compaction, batch-row selection, eviction's re-assembly, growth
past the spare room). Controls: HF's own layer moves its storage on every append (so the in-place
check can fail), and a layer that trusted a re-assigned tensor as its own buffer is caught."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

import dynatree
from dynatree.options import StoppingConfig
from dynatree.runtime.cache import CachedModel, compact, new_cache
from dynatree.runtime.growing_layer import MIN_SPARE, GrowingLayer
from tiny import hf_greedy, tiny_model

B, H, D = 3, 2, 4


def _kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, n, D, generator=g), torch.randn(B, H, n, D, generator=g)


def _same(a, b) -> None:
    assert a.keys.shape == b.keys.shape
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def _script(layer, broken_owned: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run one sequence of cache operations on ``layer``; return what each append returned."""
    out = []
    seed = iter(range(1000))

    def append(n: int) -> None:
        k, v = layer.update(*_kv(n, next(seed)))
        out.append((k.clone(), v.clone()))

    append(7)                                   # prefill
    for _ in range(5):
        append(1)                               # plain steps
    append(4)                                   # a tree of 4 nodes...
    keep = torch.tensor([12, 13, 15])           # ...keeps its root and two nodes (a gap)
    layer.keys[..., 12:15, :] = layer.keys[..., keep, :]
    layer.values[..., 12:15, :] = layer.values[..., keep, :]
    layer.keys, layer.values = layer.keys[..., :15, :], layer.values[..., :15, :]
    append(2)
    layer.keys, layer.values = layer.keys[[2, 0]], layer.values[[2, 0]]   # rows 1 finished
    if broken_owned:
        layer._owned = lambda: True
    k, v = layer.update(*(t[:2] for t in _kv(3, 99)))
    out.append((k.clone(), v.clone()))
    layer.keys = torch.cat([layer.keys[..., :2, :], layer.keys[..., 10:, :]], dim=-2)   # an eviction
    layer.values = torch.cat([layer.values[..., :2, :], layer.values[..., 10:, :]], dim=-2)
    k, v = layer.update(*(t[:2] for t in _kv(MIN_SPARE + 40, 7)))  # past the spare room
    out.append((k.clone(), v.clone()))
    return out


def test_holds_what_hfs_layer_holds_through_every_operation():
    ours, hf = GrowingLayer(), DynamicLayer()
    for (k1, v1), (k2, v2) in zip(_script(ours), _script(hf), strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    _same(ours, hf)


def test_a_layer_trusting_a_reassigned_tensor_is_caught():
    """Control: if the layer took the batch-selected rows for its own buffer, the appends after it
    would be wrong, and the comparison above would see it."""
    broken, hf = GrowingLayer(), DynamicLayer()
    with pytest.raises((AssertionError, RuntimeError)):
        for (k1, _), (k2, _) in zip(_script(broken, broken_owned=True), _script(hf), strict=True):
            assert k1.shape == k2.shape and torch.equal(k1, k2)


def test_appends_write_in_place_and_grow_with_room_to_spare():
    layer = GrowingLayer()
    layer.update(*_kv(10, 0))
    start = layer.keys.data_ptr()
    for i in range(MIN_SPARE):  # every append within the spare room: the storage stays
        layer.update(*_kv(1, i + 1))
        assert layer.keys.data_ptr() == start and layer.values.shape[-2] == 11 + i
    layer.update(*_kv(1, 500))  # one past it: a new buffer, with room again
    assert layer.keys.data_ptr() != start
    assert layer._kbuf.shape[-2] >= layer.keys.shape[-2] + MIN_SPARE


def test_control_hfs_layer_moves_its_storage_on_every_append():
    layer = DynamicLayer()
    layer.update(*_kv(10, 0))
    start = layer.keys.data_ptr()
    layer.update(*_kv(1, 1))
    assert layer.keys.data_ptr() != start


def test_compaction_on_a_cache_of_growing_layers_equals_hfs():
    model = tiny_model("llama")
    ours = new_cache(model)
    assert all(type(x) is GrowingLayer for x in ours.layers)
    hf = new_cache(model)
    hf.layers = [DynamicLayer() for _ in hf.layers]
    for cache in (ours, hf):
        for i, layer in enumerate(cache.layers):
            layer.update(*_kv(9, i))
        compact(cache, 4, [4, 6, 8])
        for i, layer in enumerate(cache.layers):
            layer.update(*_kv(2, 50 + i))
    for a, b in zip(ours.layers, hf.layers):
        _same(a, b)


def test_the_engine_cache_appends_in_place_and_decodes_exactly():
    """The loop's model+cache uses the growing layer (a plain step keeps the storage), and greedy
    decoding through it equals HF's own greedy decoding."""
    model = tiny_model("llama")
    kv = CachedModel(model, model.config.vocab_size)
    with torch.inference_mode():
        kv.prefill([1, 2, 3, 4])
        start = kv.cache.layers[0].keys.data_ptr()
        kv.forward([5], torch.tensor([4]), torch.ones(1, 1, dtype=torch.bool), 4)
    assert kv.cache.layers[0].keys.data_ptr() == start
    ids = torch.tensor([[3, 9, 4, 1, 7]])
    out = dynatree.generate(model, None, ids, "autoregressive", max_new_tokens=40,
                            stopping=StoppingConfig(eos_token_id=()))
    assert torch.equal(out.sequences, hf_greedy(model, ids, 40))


def test_under_autograd_it_copies_like_hfs_layer():
    """An in-place append would overwrite keys a backward pass reads: with gradients it copies."""
    layer, hf = GrowingLayer(), DynamicLayer()
    w = torch.ones((), requires_grad=True)
    loss = torch.zeros(())
    for n in (5, 1, 1):
        k, v = _kv(n, n)
        keys, _ = layer.update(k * w, v * w)
        hf.update(k * w, v * w)
        loss = loss + (keys * keys).sum()  # (the product saves ``keys`` for its backward)
    loss.backward()
    assert torch.equal(layer.keys, hf.keys) and w.grad is not None
