"""kernels/grouped_kv.py: our multi-row CPU calls of a grouped-query model read the KV cache in
place (no per-head copy), one-row calls keep HF's packed path, the switch never leaks out of our
calls, and the logits and greedy outputs are those of the copying path. A control with the key
heads mis-grouped shows the comparison would catch a wrong grouping."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import dynatree
import dynatree.runtime.cache as C
from dynatree.core.tree import TreeBuilder
from dynatree.core.verify import tree_forward
from dynatree.options import StoppingConfig
from dynatree.runtime.kernels import grouped_kv
from tiny import hf_greedy, perturbed, tiny_model

NO_EOS = StoppingConfig(eos_token_id=())
pytestmark = pytest.mark.skipif(not grouped_kv.SUPPORTED, reason="SDPA without enable_gqa (torch < 2.5)")


def _chain(root: int, tokens: list[int]):
    b = TreeBuilder(root)
    p = 0
    for t in tokens:
        p = b.add(p, t, 0.0)
    return b.freeze()


def _spy(monkeypatch: pytest.MonkeyPatch, *, misgroup: bool = False) -> list[tuple[int, int, bool]]:
    """Record (query heads, key heads, enable_gqa) of every SDPA call; ``misgroup`` swaps the key
    heads of grouped calls (a wrong grouping, for the control)."""
    seen: list[tuple[int, int, bool]] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        gqa = bool(kwargs.get("enable_gqa", False))
        seen.append((q.shape[1], k.shape[1], gqa))
        if misgroup and gqa:
            k, v = k.flip(1), v.flip(1)
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def _verify_logits(model: torch.nn.Module, inplace: bool, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    monkeypatch.setattr(C, "grouped_kv_applies", grouped_kv.applies if inplace else (lambda device, rows: False))
    kv = C.CachedModel(model, C.vocab_size(model))
    with torch.inference_mode():
        kv.prefill([5, 9, 17, 3, 44, 21, 8, 30, 2, 11])
        return tree_forward(kv, _chain(7, [12, 40, 3, 19, 60]), "bfs")[0]


def test_multi_row_calls_read_the_cache_in_place_and_one_row_calls_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(grouped_kv.ENV, raising=False)
    model = tiny_model("llama", 3)  # 4 query heads on 2 KV heads
    seen = _spy(monkeypatch)
    kv = C.CachedModel(model, C.vocab_size(model))
    with torch.inference_mode():
        kv.prefill([5, 9, 17, 3])
        assert seen and all(s == (4, 2, True) for s in seen)  # prefill: several rows, cache read in place
        seen.clear()
        tree_forward(kv, _chain(7, [12, 40]), "bfs")
        assert seen and all(s == (4, 2, True) for s in seen)
        seen.clear()
        switch: list[str | None] = []
        real = F.scaled_dot_product_attention  # (the spy above)

        def note_switch(*args, **kwargs):
            switch.append(grouped_kv._FORCED.get() or os.environ.get(grouped_kv.ENV))
            return real(*args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", note_switch)
        tree_forward(kv, _chain(7, []), "bfs")  # one row: HF's own path (no mask, as its generate
        assert seen and switch and not any(switch)  # steps), our switch left unset
    assert grouped_kv.ENV not in os.environ


def test_the_switch_holds_in_this_thread_only_and_never_touches_the_environment(monkeypatch) -> None:
    """Inside the block HF's decision says yes to a masked call in this thread; another thread
    running at the same time gets HF's own answer, and the process's environment (which HF also
    reads) is never written: the user's value stays whatever it was."""
    import threading

    from transformers.integrations import sdpa_attention

    monkeypatch.setenv(grouped_kv.ENV, "0")
    mask, key = torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 8)
    answers: dict[str, bool] = {}
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait()
        answers["other thread"] = sdpa_attention.use_gqa_in_sdpa(mask, key, key)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with grouped_kv.grouped_kv(True):
        answers["inside"] = sdpa_attention.use_gqa_in_sdpa(mask, key, key)
        assert os.environ[grouped_kv.ENV] == "0"
        inside.set()
        done.wait(10)
    t.join()
    answers["after"] = sdpa_attention.use_gqa_in_sdpa(mask, key, key)
    assert answers == {"inside": True, "other thread": False, "after": False}
    with pytest.raises(ValueError), grouped_kv.grouped_kv(True):
        raise ValueError
    assert not grouped_kv._FORCED.get() and os.environ[grouped_kv.ENV] == "0"


def test_logits_equal_the_copying_path_and_a_wrong_grouping_would_show(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama", 4, layers=3)
    copying = _verify_logits(model, False, monkeypatch)
    inplace = _verify_logits(model, True, monkeypatch)
    torch.testing.assert_close(inplace, copying, rtol=1e-5, atol=1e-5)
    _spy(monkeypatch, misgroup=True)
    wrong = _verify_logits(model, True, monkeypatch)
    assert not torch.allclose(wrong, copying, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("strategy", ["linear", "dynatree", "dyspec"])
def test_greedy_output_equals_hf_greedy_with_the_cache_read_in_place(arch: str, strategy: str) -> None:
    target = tiny_model(arch, 5, layers=3)
    draft = perturbed(target, 0.05)
    ids = torch.tensor([[3, 17, 42, 8, 29, 11, 5]])
    got = dynatree.generate(target, draft, ids, strategy, max_new_tokens=40, stopping=NO_EOS, text=False)
    assert torch.equal(got.sequences, hf_greedy(target, ids, 40, None))


def _batch_logits(model: torch.nn.Module, inplace: bool, monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    import dynatree.runtime.batch_cache as BC

    monkeypatch.setattr(BC, "grouped_kv_applies", grouped_kv.applies if inplace else (lambda device, rows: False))
    kv = BC.BatchedKV(model, C.vocab_size(model))
    with torch.inference_mode():
        kv.prefill([[5, 9, 17, 3, 44, 21], [8, 30, 2]])
        return kv.verify([_chain(7, [12, 40, 3]), _chain(11, [6])])


def test_a_batchs_tree_calls_read_the_cache_in_place_and_its_plain_steps_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's verify of trees (several query rows per batch row) reads grouped keys in place;
    a plain batched step (one query row per batch row) keeps HF's packed path, the one HF's own
    batched generate takes; the logits equal the copying path's, and a wrong grouping would show."""
    import dynatree.runtime.batch_cache as BC

    monkeypatch.delenv(grouped_kv.ENV, raising=False)
    model = tiny_model("llama", 4, layers=3)  # 4 query heads on 2 KV heads
    seen = _spy(monkeypatch)
    kv = BC.BatchedKV(model, C.vocab_size(model))
    with torch.inference_mode():
        kv.prefill([[5, 9, 17, 3], [8, 30]])
        kv.verify([_chain(7, [12, 40]), _chain(11, [6])])
        assert seen and all(s == (4, 2, True) for s in seen)
        kv.commit([[0], [0]])
        seen.clear()
        kv.verify([_chain(7, []), _chain(11, [])])
        assert seen and not any(gqa for _, _, gqa in seen)
    assert grouped_kv.ENV not in os.environ
    copying = _batch_logits(model, False, monkeypatch)
    inplace = _batch_logits(model, True, monkeypatch)
    torch.testing.assert_close(inplace, copying, rtol=1e-5, atol=1e-5)
    _spy(monkeypatch, misgroup=True)
    assert not torch.allclose(_batch_logits(model, True, monkeypatch), copying, rtol=1e-3, atol=1e-3)


def test_packed_grouped_attention_is_sdpa_with_grouped_heads() -> None:
    """Packing the query heads of each KV head as rows computes SDPA's ``enable_gqa`` attention
    (float rounding apart), with a mask that differs from row to row; a tiling that pairs rows
    with the wrong mask rows (``repeat_interleave``) is told apart by the same comparison."""
    from dynatree.runtime.kernels.grouped_kv import PackedGroupedAttention, packed_grouped_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((6, 5), (2, 40), (2, 40)))
    mask = torch.zeros(1, 1, 5, 40).masked_fill_(torch.rand(1, 1, 5, 40, generator=g) < 0.4, torch.finfo(torch.float32).min)
    mask[..., 0] = 0  # (no row fully masked)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    assert torch.allclose(packed_grouped_attention(q, k, v, mask, 0.3), ref, atol=1e-6, rtol=1e-5)
    with PackedGroupedAttention():
        assert torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True), ref,
                              atol=1e-6, rtol=1e-5)
    wrong = q.reshape(1, 2, 15, 16) @ k.transpose(-1, -2) * 0.3 + mask.repeat_interleave(3, dim=2)
    wrong = (torch.softmax(wrong, -1) @ v).reshape(1, 6, 5, 16)
    assert not torch.allclose(wrong, ref, atol=1e-3)
