"""kernels/cpu_linear.py: the (W @ x.T).T layout equals F.linear, is used where it should be, and
the engine's output with it on (the CPU default) equals HF greedy decoding -- which a broken layout
would not, since the HF reference never goes through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import dynatree
from dynatree.options import EngineOptions, LinearPlan, StoppingConfig, fixed_plan
from dynatree.runtime.kernels import cpu_linear
from dynatree import tuning
from dynatree.runtime.cache import CachedModel, vocab_size
from dynatree.runtime.kernels.cpu_linear import MAX_ROWS, SmallBatchLinear
from tiny import hf_greedy, perturbed, tiny_model

NO_EOS = StoppingConfig(eos_token_id=())


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 5), min_size=0, max_size=2), rows=st.integers(1, 70),
       fan_in=st.integers(1, 48), fan_out=st.integers(1, 48), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_layout_equals_f_linear(lead: list[int], rows: int, fan_in: int, fan_out: int, bias: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, rows, fan_in, generator=g)
    w = torch.randn(fan_out, fan_in, generator=g)
    b = torch.randn(fan_out, generator=g) if bias else None
    want = F.linear(x, w, b)
    with torch.inference_mode(), SmallBatchLinear():
        got = F.linear(x, w, b)
    assert got.shape == want.shape
    assert got.is_contiguous()  # a column-major result slowed every elementwise op after it (and SDPA)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_mode_routes_only_few_row_cpu_inference_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = cpu_linear.small_batch_linear

    def counting(x, w, b=None, kernel="rowmajor"):
        calls.append(x.numel() // x.shape[-1])
        return real(x, w, b, kernel)

    monkeypatch.setattr(cpu_linear, "small_batch_linear", counting)
    lin = torch.nn.Linear(8, 4)
    with torch.inference_mode(), SmallBatchLinear():
        lin(torch.randn(1, 8))
        lin(torch.randn(2, 3, 8))
        lin(torch.randn(MAX_ROWS + 1, 8))  # a prefill chunk: plain F.linear
    with SmallBatchLinear():
        lin(torch.randn(2, 8, requires_grad=True))  # autograd: plain F.linear
    lin(torch.randn(2, 8))  # outside the mode
    assert calls == [1, 6]


def test_engine_uses_the_layout_on_cpu_by_default_and_not_when_off(monkeypatch: pytest.MonkeyPatch) -> None:
    target = tiny_model("llama", 0)
    draft = perturbed(target)
    ids = torch.randint(2, 90, (1, 6), generator=torch.Generator().manual_seed(3))
    calls: list[int] = []
    real = cpu_linear.small_batch_linear
    monkeypatch.setattr(cpu_linear, "small_batch_linear", lambda x, w, b=None, kernel="rowmajor": calls.append(1) or real(x, w, b, kernel))
    ref = hf_greedy(target, ids, 24, None)
    for engine in ("hf", "static"):
        calls.clear()
        on = dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=24, stopping=NO_EOS,
                               options=EngineOptions(engine=engine), text=False)
        assert calls and torch.equal(on.sequences, ref)
        calls.clear()
        off = dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=24, stopping=NO_EOS,
                                options=EngineOptions(engine=engine, cpu_linear=False), text=False)
        assert not calls and torch.equal(off.sequences, ref)


def test_a_broken_layout_is_caught_by_the_greedy_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: rows returned in the wrong order; the engine must then differ from HF greedy."""
    target = tiny_model("llama", 0)
    draft = perturbed(target)
    ids = torch.randint(2, 90, (1, 6), generator=torch.Generator().manual_seed(3))
    real = cpu_linear.small_batch_linear

    def reversed_rows(x, w, b=None, kernel="rowmajor"):  # rows come back in reverse order: wrong for every tree of 2+ nodes
        out = real(x, w, b, kernel)
        return out.flip(-2) if out.dim() >= 2 and out.shape[-2] > 1 else out

    monkeypatch.setattr(cpu_linear, "small_batch_linear", reversed_rows)
    out = dynatree.generate(target, draft, ids, "linear", max_new_tokens=24, stopping=NO_EOS, k=3, text=False)
    assert not torch.equal(out.sequences, hf_greedy(target, ids, 24, None))


def test_default_follows_the_measured_plan_and_explicit_values_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """None: whatever this CPU's measured plan says (on only where it leaves F.linear); True: the
    EPYC-tuned layout; False: off. (The rule it replaced, on from two threads, made autoregressive
    decoding 0.42x HF's speed on an Intel Sapphire Rapids.)"""
    from dynatree.runtime import engines
    from dynatree.runtime.kernels import linear_plan

    model = tiny_model("llama", 0)
    plain = LinearPlan((), "measured: F.linear wins")
    mixed = LinearPlan(((1, "linear"), (64, "rowmajor")), "measured")
    monkeypatch.setattr(linear_plan, "plan_for", lambda m, log=None: plain)
    assert engines.resolve_cpu_linear(model, None) == (False, None)
    assert engines.resolve_cpu_linear(model, True) == (True, fixed_plan())
    monkeypatch.setattr(linear_plan, "plan_for", lambda m, log=None: mixed)
    assert engines.resolve_cpu_linear(model, None) == (True, mixed)
    assert engines.resolve_cpu_linear(model, False) == (False, None)
    assert engines.resolve_cpu_linear(model, None, plain) == (False, None)  # a pinned plan wins


# ----------------------------------------------------------------------------- packed weights
needs_packing = pytest.mark.skipif(not cpu_linear.packing_available(), reason="torch built without oneDNN")


@needs_packing
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 70), fan_in=st.integers(1, 48), fan_out=st.integers(1, 48), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_packed_layout_equals_f_linear(rows: int, fan_in: int, fan_out: int, bias: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, rows, fan_in, generator=g)[1]  # (a view: rows of a larger tensor)
    w = torch.randn(fan_out, fan_in, generator=g)
    b = torch.randn(fan_out, generator=g) if bias else None
    want = F.linear(x, w, b)
    with torch.inference_mode(), SmallBatchLinear(packed=True):
        got = F.linear(x, w, b)
    assert got.shape == (rows, fan_out) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert hasattr(w, cpu_linear._PACKED_ATTR) == (tuning.CPU_PACKED_MIN_ROWS <= rows <= MAX_ROWS)


@needs_packing
def test_a_packed_copy_follows_changes_to_its_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-place change (a fine-tuning step, ``load_state_dict``) must not leave a stale copy;
    the control, a cache that ignores the weight's version, returns the old product."""
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(6, 16)
    with torch.inference_mode(), SmallBatchLinear(packed=True):
        lin(x)
    with torch.no_grad():
        lin.weight.mul_(2.0)
        want = F.linear(x, lin.weight, lin.bias)  # (outside the mode)
    with torch.inference_mode(), SmallBatchLinear(packed=True):
        got = lin(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    stale = getattr(lin.weight, cpu_linear._PACKED_ATTR)[1]
    with torch.no_grad():
        lin.weight.mul_(0.5)
        want = F.linear(x, lin.weight, lin.bias)
    monkeypatch.setattr(cpu_linear, "packed_weight", lambda weight: stale)  # the control: never repacked
    with torch.inference_mode(), SmallBatchLinear(packed=True):
        got = lin(x)
    assert not torch.allclose(got, want, atol=1e-3)


@needs_packing
def test_a_weight_made_in_inference_mode_is_never_packed_stale() -> None:
    """Inference tensors have no version counter: an in-place change to one (new weights copied in
    under ``torch.inference_mode()``, as an RL loop does between calls) cannot be detected, so such
    a weight is never packed and every call reads its current values."""
    with torch.inference_mode():
        lin = torch.nn.Linear(16, 8)
        x = torch.randn(6, 16)
        with SmallBatchLinear(packed=True):
            lin(x)
        lin.weight.copy_(lin.weight * 2.0)
        want = x @ lin.weight.t() + lin.bias
        with SmallBatchLinear(packed=True):
            got = lin(x)
    assert lin.weight.is_inference()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    model = tiny_model("llama", 0)
    with torch.inference_mode():
        frozen = tiny_model("llama", 0)
    assert CachedModel(model, vocab_size(model), cpu_linear=True).packed_linear
    assert not CachedModel(frozen, vocab_size(frozen), cpu_linear=True).packed_linear


@needs_packing
def test_packing_only_for_onednn_dtypes_within_the_memory_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model("llama", 0)
    assert CachedModel(model, vocab_size(model), cpu_linear=True).packed_linear
    assert not CachedModel(model, vocab_size(model), cpu_linear=False).packed_linear
    monkeypatch.setattr(tuning, "CPU_PACKED_MAX_BYTES", 1000)  # a model too large for a second copy
    assert not CachedModel(model, vocab_size(model), cpu_linear=True).packed_linear
    monkeypatch.undo()
    half = tiny_model("llama", 0).to(torch.bfloat16)
    bf16 = torch.bfloat16 in cpu_linear.onednn_dtypes()  # (CPUs with bf16 instructions)
    assert CachedModel(half, vocab_size(half), cpu_linear=True).packed_linear == bf16
    fp16 = tiny_model("llama", 0).to(torch.float16)
    assert not CachedModel(fp16, vocab_size(fp16), cpu_linear=True).packed_linear


@needs_packing
def test_packing_follows_the_memory_available_and_counts_copies_already_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy may take at most CPU_PACKED_MEMORY_SHARE of the memory available; once made, a
    model's copies count as granted, so the decision does not flip on the next call because the
    copies themselves took that memory (the plan would then be measured anew for every call)."""
    model = tiny_model("llama", 0)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    share = tuning.CPU_PACKED_MEMORY_SHARE
    monkeypatch.setattr(cpu_linear, "available_memory", lambda: int(size / share) + 1)
    assert cpu_linear.packing_applies(model)
    monkeypatch.setattr(cpu_linear, "available_memory", lambda: int(size / share) - 4096)
    assert not cpu_linear.packing_applies(model)
    for w in (m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)):
        cpu_linear.packed_weight(w)  # (the copies now exist: they took that memory)
    assert cpu_linear.packing_applies(model)
    monkeypatch.setattr(cpu_linear, "available_memory", lambda: None)  # (unknown: the fixed cap)
    assert cpu_linear.packing_applies(model)
    cpu_linear.drop_packed(model.parameters())


@needs_packing
@pytest.mark.parametrize("strategy", ["linear", "dynatree", "dyspec"])
def test_greedy_output_with_packed_weights_equals_hf_greedy(strategy: str) -> None:
    """The suite's tiny models get packed weights by default; here every verify pass is wide
    enough to use them (and the draft's wide levels too)."""
    target = tiny_model("qwen2", 7, layers=3)
    draft = perturbed(target, 0.05)
    ids = torch.tensor([[3, 17, 42, 8, 29, 11, 5]])
    seen: list[int] = []
    real = cpu_linear.small_batch_linear

    def spy(x, w, b=None, kernel="rowmajor"):
        if kernel == "packed" and x.numel() // x.shape[-1] >= tuning.CPU_PACKED_MIN_ROWS:
            seen.append(1)
        return real(x, w, b, kernel)

    opts = {"linear": {"k": 6}, "dynatree": {"max_nodes": 12}, "dyspec": {"max_nodes": 12}}[strategy]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_linear, "small_batch_linear", spy)
        got = dynatree.generate(target, draft, ids, strategy, max_new_tokens=40, stopping=NO_EOS, **opts, text=False)
    assert seen and torch.equal(got.sequences, hf_greedy(target, ids, 40, None))
