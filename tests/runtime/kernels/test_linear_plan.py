"""The few-row linear kernels are chosen by this CPU's timings: the decision logic with fake
timings (both outcomes), its on-disk cache, its switches, and a plan mixing all three kernels run
end to end (greedy output equal to HF greedy)."""

from __future__ import annotations

import pytest
import torch
from tiny import hf_greedy, lazy_head_kernels, llama_pair, tiny_model

import dynatree
from dynatree.options import EngineOptions
from dynatree.runtime.kernels import cpu_linear, linear_plan
from dynatree.options import LinearPlan, fixed_plan
from dynatree.runtime.kernels.linear_plan import choose

ROWS = (1, 2, 4, 8, 16, 32, 64)


def timings(linear: dict[int, float], rowmajor: dict[int, float], packed: dict[int, float] | None = None):
    return {r: {"linear": linear[r], "rowmajor": rowmajor[r], **({"packed": packed[r]} if packed else {})} for r in ROWS}


# Per-call times as measured on the two CPUs the project has met (us, SmolLM2-135M's layer shapes,
# 2 threads): on the Intel Sapphire Rapids F.linear is ~2x faster for 1-3 rows and the row-major
# layout wins from ~16; on the AMD EPYC the layout won from one row.
INTEL = timings({1: 174, 2: 175, 4: 338, 8: 360, 16: 620, 32: 700, 64: 900},
                {1: 384, 2: 363, 4: 503, 8: 419, 16: 416, 32: 650, 64: 1000},
                {1: 377, 2: 372, 4: 331, 8: 393, 16: 473, 32: 520, 64: 700})
# The embedded target's LM head alone on the 2-core Intel Xeon (Emerald Rapids), ms: packed from 4 rows.
HEAD = timings({1: 5.2, 2: 5.5, 4: 10.5, 8: 16.9, 16: 12.1, 32: 20.0, 64: 30.0},
               {1: 13.2, 2: 13.4, 4: 13.4, 8: 13.7, 16: 14.7, 32: 22.0, 64: 32.0},
               {1: 5.0, 2: 5.4, 4: 5.8, 8: 6.9, 16: 8.4, 32: 12.0, 64: 19.0})
EPYC = timings({1: 200, 2: 400, 4: 420, 8: 500, 16: 800, 32: 1000, 64: 1400},
               {1: 110, 2: 120, 4: 200, 8: 300, 16: 500, 32: 700, 64: 1200},
               {1: 300, 2: 300, 4: 180, 8: 220, 16: 330, 32: 450, 64: 700})


def test_one_row_stays_on_f_linear_where_f_linear_is_faster() -> None:
    """Intel-like timings: autoregressive steps (one row) keep HF's own kernel; wide verify calls
    take the faster layouts."""
    plan = choose(INTEL)
    assert [plan.kernel(r) for r in (1, 2, 3, 4, 8)] == ["linear"] * 5
    assert plan.kernel(16) == "rowmajor" and plan.kernel(32) == "packed" and plan.kernel(64) == "packed"
    assert plan.kernel(65) == "linear" and plan.active


def test_the_layout_is_chosen_where_it_is_faster() -> None:
    plan = choose(EPYC)
    assert [plan.kernel(r) for r in (1, 2, 4, 8, 16, 64)] == ["rowmajor", "rowmajor", "packed", "packed", "packed",
                                                              "packed"]


def test_a_kernel_must_beat_f_linear_by_the_margin() -> None:
    """Within MARGIN of F.linear (noise in a short measurement) F.linear stays: the safe default."""
    close = timings({r: 100.0 for r in ROWS}, {r: 95.0 for r in ROWS}, {r: 92.0 for r in ROWS})
    plan = choose(close)
    assert not plan.active and plan.bands == ()
    assert choose(close, margin=0.95).kernel(1) == "packed"  # the control: a looser margin switches


def test_rows_between_probes_take_the_next_probe_up() -> None:
    plan = choose({1: {"linear": 1, "rowmajor": 2}, 4: {"linear": 2, "rowmajor": 1}})
    assert [plan.kernel(r) for r in (1, 2, 3, 4, 5)] == ["linear", "rowmajor", "rowmajor", "rowmajor", "linear"]


def test_plan_validation_and_description() -> None:
    with pytest.raises(ValueError, match="ascending"):
        LinearPlan(((4, "rowmajor"), (2, "packed")))
    with pytest.raises(ValueError, match="kernel"):
        LinearPlan(((4, "fast"),))
    plan = LinearPlan(((1, "linear"), (3, "rowmajor"), (8, "rowmajor"), (9, "linear")), "measured")
    assert plan.bands == ((1, "linear"), (8, "rowmajor"))  # merged, trailing F.linear dropped
    assert plan.describe() == "1 row F.linear, 2-8 rows rowmajor, then F.linear (measured)"
    assert plan == LinearPlan(((1, "linear"), (8, "rowmajor")), "other origin")  # origin is not identity
    assert LinearPlan.from_json(plan.to_json()) == plan
    assert plan.without_packing() == plan
    assert fixed_plan().without_packing().bands == ((3, "rowmajor"), (64, "onednn"))


@pytest.fixture()
def measuring(tmp_path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """plan_for with the real cache logic in a temporary folder and a fake measurement: INTEL's
    timings over the layers' weights, HEAD's over the LM head's alone; the list names each
    measurement ("layers", "head")."""
    monkeypatch.setenv("DYNATREE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(linear_plan.ENV_SWITCH, "measure")
    monkeypatch.setattr(linear_plan, "_DECIDED", type(linear_plan._DECIDED)())
    calls: list[str] = []

    def fake_measure(weights, kernels, rows=linear_plan.PROBE_ROWS, reps=3, clock=None):
        head = len(calls) % 2 == 1  # (plan_for measures the layers, then the head)
        calls.append("head" if head else "layers")
        return {r: {k: v for k, v in (HEAD if head else INTEL)[r].items() if k in kernels} for r in ROWS}

    monkeypatch.setattr(linear_plan, "measure", fake_measure)
    return calls


def test_measured_once_per_machine_and_shape_then_read_from_disk(measuring, monkeypatch) -> None:
    model = tiny_model("llama", 0)
    first = linear_plan.plan_for(model)
    assert first.bands == choose(INTEL).bands and "measured on" in first.why
    assert first.head == choose(HEAD).bands == ((2, "linear"), (64, "packed")) and first.head_plan().kernel(4) == "packed"
    assert measuring == ["layers", "head"]
    monkeypatch.setattr(linear_plan, "_DECIDED", type(linear_plan._DECIDED)())  # a new process
    assert linear_plan.plan_for(tiny_model("llama", 1)) == first and len(measuring) == 2  # same shapes: disk
    linear_plan.plan_for(tiny_model("llama", 0, layers=3))  # same shapes, more of them: weighed anew
    assert measuring.count("layers") == 2


def test_a_plan_cached_without_the_heads_bands_gets_them_and_keeps_its_layers(measuring) -> None:
    """A plan cached before plans had the head's own bands: only the head is measured and the
    layers' bands are kept (measured again they could flip near a crossing, and the aot engine's
    packages with them); then it is read from disk."""
    model = tiny_model("llama", 0)
    shapes = linear_plan.weight_shapes(model)
    key = linear_plan.plan_key(shapes, torch.float32, cpu_linear.packing_applies(model))
    old = LinearPlan(((3, "rowmajor"), (64, "onednn")), "measured earlier")
    linear_plan.save(key, old)
    plan = linear_plan.plan_for(model)
    assert plan.bands == old.bands and plan.why == old.why and plan.head is not None and len(measuring) == 1
    linear_plan._DECIDED.clear()
    assert linear_plan.plan_for(model) == plan and len(measuring) == 1


def test_another_thread_count_or_shape_is_measured_anew(measuring, monkeypatch) -> None:
    linear_plan.plan_for(tiny_model("llama", 0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    linear_plan.plan_for(tiny_model("llama", 0))
    assert measuring.count("layers") == 2
    linear_plan.plan_for(tiny_model("gpt2", 0))
    assert measuring.count("layers") == 3


def test_switches_pin_the_plan(measuring, monkeypatch) -> None:
    model = tiny_model("llama", 0)
    monkeypatch.setenv(linear_plan.ENV_SWITCH, "off")
    assert not linear_plan.plan_for(model).active
    monkeypatch.setenv(linear_plan.ENV_SWITCH, "fixed")
    assert linear_plan.plan_for(model) == fixed_plan()
    assert measuring == []


def test_measure_passes_over_the_models_own_weights_in_forward_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timed pass calls its kernel on every linear weight of the model, the tensors
    themselves, in module order (a step reads them so: from memory, each once); a measurement that
    reused one weight per shape (cached: it chose F.linear for one row on the AMD EPYC, where a
    real step ran 2.2x slower on it) would fail here."""
    model = tiny_model("llama", 0, layers=3)
    weights = linear_plan.linear_weights(model)
    expected = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(weights) == len(expected) and all(a is b for a, b in zip(weights, expected))
    calls: list[tuple[str, int, int]] = []

    def spy_linear(x, w, b=None):
        calls.append(("linear", x.shape[0], id(w)))
        return x @ w.t()

    def spy_layout(x, w, b=None, kernel="rowmajor"):
        calls.append((kernel, x.shape[0], id(w)))
        return x @ w.t()

    monkeypatch.setattr(torch.nn.functional, "linear", spy_linear)
    monkeypatch.setattr(linear_plan, "small_batch_linear", spy_layout)
    ticks = iter(range(10**6))
    out = linear_plan.measure(weights, ("linear", "rowmajor", "onednn", "packed"), rows=(1, 4), reps=3,
                              clock=lambda: float(next(ticks)))
    assert set(out) == {1, 4} and all(set(v) == {"linear", "rowmajor", "onednn", "packed"} for v in out.values())
    ids = [id(w) for w in weights]
    passes = [calls[i: i + len(ids)] for i in range(0, len(calls), len(ids))]
    assert len(passes) == 2 * 4 * (3 + 1)  # rows x kernels x (reps + the untimed first pass)
    for p in passes:
        assert [c[2] for c in p] == ids and len({(c[0], c[1]) for c in p}) == 1
    assert out[4]["packed"] == 1.0  # (the fake clock ticks once per pass start and end)


def test_a_big_model_is_measured_over_its_first_weights() -> None:
    model = tiny_model("llama", 0, layers=3)
    weights = linear_plan.linear_weights(model)
    some = linear_plan.linear_weights(model, max_bytes=sum(w.nbytes for w in weights[:5]))
    assert len(some) == 5 and all(a is b for a, b in zip(some, weights))
    assert len(linear_plan.linear_weights(model, max_bytes=1)) == 1  # (at least one)


def test_packed_copies_the_plan_does_not_read_are_dropped(measuring, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measurement packs every weight; a plan without packed kernels frees those copies (they
    double an fp32 model's weight memory), a plan with them keeps them for its calls."""
    model = tiny_model("llama", 0)
    weights = linear_plan.linear_weights(model)
    for w in weights:
        cpu_linear.packed_weight(w)
    monkeypatch.setattr(linear_plan, "packing_applies", lambda m: True)
    assert linear_plan.plan_for(model).kernel(64) == "packed"  # (INTEL's timings: packed from 24 rows)
    assert all(hasattr(w, cpu_linear._PACKED_ATTR) for w in weights)
    monkeypatch.setattr(linear_plan, "_DECIDED", type(linear_plan._DECIDED)())
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # (a new key: measured anew)
    no_packed = {r: {"linear": 1.0, "rowmajor": 0.5, "packed": 0.7} for r in ROWS}
    monkeypatch.setattr(linear_plan, "measure", lambda *a, **k: no_packed)
    assert "packed" not in {k for _, k in linear_plan.plan_for(model).bands}
    assert not any(hasattr(w, cpu_linear._PACKED_ATTR) for w in weights)


def test_where_only_the_head_takes_packed_weights_the_layers_copies_are_dropped(
        measuring, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers' measurement packs every weight; a plan whose layers take no packed kernel but
    whose LM head does keeps the head's copy only (the layers' would double their memory unread)."""
    model = tiny_model("llama", 0)
    monkeypatch.setattr(linear_plan, "packing_applies", lambda m: True)
    layers = {r: {"linear": 1.0, "rowmajor": 0.5, "packed": 0.7} for r in ROWS}
    head = {r: {"linear": 1.0, "rowmajor": 0.8, "packed": 0.5} for r in ROWS}

    def fake(weights, kernels, **_):
        for w in weights:
            cpu_linear.packed_weight(w)
        return head if len(weights) == 1 else layers

    monkeypatch.setattr(linear_plan, "measure", fake)
    plan = linear_plan.plan_for(model)
    assert not any(k == "packed" for _, k in plan.bands) and plan.head_plan().kernel(4) == "packed"
    lm_head = linear_plan.head_weight(model)
    assert lm_head is model.get_output_embeddings().weight and hasattr(lm_head, cpu_linear._PACKED_ATTR)
    assert not any(hasattr(w, cpu_linear._PACKED_ATTR) for w in linear_plan.linear_weights(model) if w is not lm_head)


def test_resolved_options_carry_the_measured_plan(measuring) -> None:
    from dynatree.runtime.engines import resolve

    target, _ = llama_pair()
    resolved = resolve(EngineOptions(), target)
    assert resolved.cpu_linear is True and resolved.linear_plan == LinearPlan(choose(INTEL).bands, "", choose(HEAD).bands)
    assert resolve(EngineOptions(cpu_linear=False), target).linear_plan is None


MIXED = LinearPlan(((1, "linear"), (2, "rowmajor"), (3, "onednn"), (64, "packed")), "test: every kernel")


@pytest.mark.parametrize("strategy", ["linear", "dynatree", "dyspec"])
def test_a_plan_of_all_four_kernels_is_exact(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """F.linear for one row, the row-major layout for 2, oneDNN in place for 3, packed weights
    from 4: greedy output equals HF greedy, and every kernel ran."""
    target, draft = llama_pair()
    ids = torch.tensor([[3, 17, 42, 8, 29, 11, 5]])
    seen: set[str] = set()
    real = cpu_linear.small_batch_linear

    def spy(x, w, b=None, kernel="rowmajor"):
        seen.add(kernel)
        return real(x, w, b, kernel)

    linear_calls = []
    real_kernel = LinearPlan.kernel

    def kernel(self, rows):
        out = real_kernel(self, rows)
        if out == "linear":
            linear_calls.append(rows)
        return out

    monkeypatch.setattr(cpu_linear, "small_batch_linear", spy)
    monkeypatch.setattr(LinearPlan, "kernel", kernel)
    options = EngineOptions(linear_plan=MIXED)
    out = dynatree.generate(target, draft, ids, strategy, max_new_tokens=24, options=options,
                            **({"max_nodes": 12} if strategy != "linear" else {"k": 2}), text=False)
    assert out.sequences.tolist() == hf_greedy(target, ids, 24).tolist()
    assert seen == {"rowmajor", "onednn", "packed"} and linear_calls and set(linear_calls) == {1}


def test_calls_the_plan_leaves_on_f_linear_run_without_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode's Python dispatch sees every torch call of a forward: a one-row step the plan keeps
    on F.linear must not pay it (it made the default 0.62x HF's speed on the Intel CPU)."""
    from dynatree.runtime.cache import CachedModel

    model = tiny_model("llama", 0)
    entered: list[int] = []
    real = cpu_linear.SmallBatchLinear.__enter__

    def enter(self):
        entered.append(1)
        return real(self)

    monkeypatch.setattr(cpu_linear.SmallBatchLinear, "__enter__", enter)
    kv = CachedModel(model, 96, cpu_linear=LinearPlan(((1, "linear"), (64, "rowmajor"))))
    with torch.inference_mode():
        kv.prefill([3, 4, 5])  # 3 rows: the mode
        assert len(entered) == 1
        kv.forward([6], torch.tensor([3]), torch.ones(1, 1, dtype=torch.bool), 3)  # 1 row: F.linear, no mode
        assert len(entered) == 1
        kv.forward([7, 8], torch.tensor([4, 5]), torch.ones(2, 2, dtype=torch.bool).tril(), 4)
    assert len(entered) == 2


def test_a_one_row_call_that_sees_everything_passes_no_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like HF's own generate: no additive mask for an autoregressive step or a causal chain after
    the cache (a prefill; HF's causal mask, a faster kernel); a row that must not see some cached
    rows, or a tree whose branches must not see each other, still gets its mask."""
    from dynatree.runtime.cache import CachedModel

    model = tiny_model("llama", 0)
    masks: list[object] = []
    base = type(model.base_model)  # (a prefill without logits calls the base model alone)
    real = base.forward

    def spy(self, *args, **kwargs):
        masks.append(kwargs.get("attention_mask"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(base, "forward", spy)
    kv = CachedModel(model, 96)
    with torch.inference_mode():
        kv.prefill([3, 4, 5])
        kv.forward([6], torch.tensor([3]), torch.ones(1, 1, dtype=torch.bool), 3)
        kv.forward([7], torch.tensor([4]), torch.tensor([[False, True]]), 3)  # does not see row 3
        chain = torch.ones(2, 2, dtype=torch.bool).tril()
        kv.forward([8, 9], torch.tensor([5, 6]), chain, 5)
        kv.forward([8, 9], torch.tensor([7, 7]), torch.eye(2, dtype=torch.bool), 7)  # two siblings
    assert masks[0] is None and masks[1] is None and masks[2] is not None
    assert masks[3] is None and masks[4] is not None


def test_the_lm_head_takes_its_own_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lazy head (acceptance's call of the LM head on final hidden states) takes the plan's
    bands for the head, the layers theirs: greedy output still equals HF greedy. Fails where the
    head's calls take the layers' bands (the head's kernel was the layers' choice before, and on
    the Intel Xeon that was F.linear at 14 rows: 28.3 ms against 8.1 packed). The aot engine's
    twin is in tests/runtime/test_aot_engine.py. (The fp32 head: the screened head reads the
    head's rows only where its screen cannot decide.)"""
    target, draft = llama_pair()
    ids = torch.tensor([[3, 17, 42, 8, 29, 11, 5]])
    seen = lazy_head_kernels(monkeypatch, target.get_output_embeddings().weight)
    plan = LinearPlan(((64, "rowmajor"),), "test", head=((64, "onednn"),))
    out = dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=24, text=False, max_nodes=12,
                            options=EngineOptions(linear_plan=plan, lazy_head=True, screened_head=False))
    assert out.sequences.tolist() == hf_greedy(target, ids, 24).tolist()
    assert {k for is_head, k in seen if is_head} == {"onednn"}
    assert "rowmajor" in {k for is_head, k in seen if not is_head}
