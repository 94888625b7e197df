"""The ahead-of-time compiled engine (``engine="aot"``): exact on every strategy and draft kind,
built once and loaded after, refused where it cannot be exact.

Unfrozen packages hold code, not weights, and are keyed by the model's config: the tiny target and
its perturbed draft share them. Frozen ones (the buckets the suite's pinned plan runs on packed
weights: 4 rows and up) hold the weights and are keyed by their digest, so each model has its own.
All are built once for this module (about 10 s a package on a 2-core CPU) in a temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import dynatree
import dynatree.core.verify
from dynatree import STRATEGIES, EngineOptions, StoppingConfig
from dynatree.core.costmodel import ENV_DIR
from dynatree.errors import DynaTreeError
from dynatree.options import LinearPlan
from dynatree.runtime import aot_engine, aot_store, engines
from dynatree.runtime.aot_engine import AOTCachedModel
from tiny import SMALL_TREES, VOCAB, hf_greedy, lazy_head_kernels, perturbed, tiny_model, window_model
from tolerances import logit_atol

BUCKETS = (1, 4, 32)  # (trees of SMALL_TREES take up to 25 rows)
NO_EOS = StoppingConfig(eos_token_id=())


@pytest.fixture(scope="module", autouse=True)
def cache_dir(private_cache_dir: Path) -> Path:
    return private_cache_dir


@pytest.fixture(scope="module")
def llama() -> dict[str, torch.nn.Module]:
    target = tiny_model("llama", 0)
    return {"target": target, "self": target, "random": tiny_model("llama", 7), "perturbed": perturbed(target)}


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def run(models, strategy: str, draft: str, ids: torch.Tensor, n: int, buckets=BUCKETS, **kw):
    return dynatree.generate(models["target"], models[draft], ids, strategy, max_new_tokens=n, stopping=NO_EOS,
                             options=EngineOptions(engine="aot", buckets=buckets), text=False,
                             **{**SMALL_TREES.get(strategy, {}), **kw})


def _plan(model: torch.nn.Module):
    """The few-row plan a run on ``model`` takes (the suite pins the EPYC layout: packed from 4 rows)."""
    return engines.resolve(EngineOptions(engine="aot"), model).linear_plan


def _engine(llama) -> AOTCachedModel:
    """The target's aot engine as runs build it (its packages are built by the first test)."""
    return AOTCachedModel(llama["target"], VOCAB, 8, BUCKETS, cpu_linear=_plan(llama["target"]))


# ------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_equals_hf_greedy(llama, strategy: str) -> None:
    for draft in ("self", "perturbed"):  # (the target as its own draft: every node accepted)
        for length, seed, n in [(1, 0, 24), (13, 2, 33)]:
            ids = prompt(length, seed)
            out = run(llama, strategy, draft, ids, n)
            assert torch.equal(out.sequences, hf_greedy(llama["target"], ids, n)), (strategy, draft, length)


def test_the_lm_head_takes_its_own_bands(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lazy head runs outside the packages with the plan's bands for the head (here oneDNN on
    the weights in place, where the layers' bands say row-major): still HF greedy's output. Fails
    where the head's calls take the layers' bands."""
    seen = lazy_head_kernels(monkeypatch, llama["target"].get_output_embeddings().weight)
    plan = LinearPlan(_plan(llama["target"]).bands, "test", head=((64, "onednn"),))  # (the suite's packages)
    ids = prompt(13, 2)
    out = dynatree.generate(llama["target"], llama["perturbed"], ids, "dynatree", max_new_tokens=33,
                            stopping=NO_EOS, text=False, **SMALL_TREES.get("dynatree", {}),
                            options=EngineOptions(engine="aot", buckets=BUCKETS, linear_plan=plan, lazy_head=True,
                                                  screened_head=False))
    assert torch.equal(out.sequences, hf_greedy(llama["target"], ids, 33))
    assert {k for is_head, k in seen if is_head} == {"onednn"}


def test_text_and_hybrid_drafts_equal_hf_greedy(llama) -> None:
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])
    ref = hf_greedy(llama["target"], ids, 40)
    for draft in (None, llama["perturbed"]):  # the text alone; the draft model and the text in one tree
        out = dynatree.generate(llama["target"], draft, ids, "dynatree", max_new_tokens=40, stopping=NO_EOS,
                                options=EngineOptions(engine="aot", buckets=BUCKETS), text=True)
        assert torch.equal(out.sequences, ref)


def test_prefill_longer_than_every_bucket_runs_eagerly_and_stays_exact(llama) -> None:
    ids = prompt(70, 3)  # 70 > 32: one unpadded eager chunk, then packaged steps
    out = run(llama, "dynatree", "perturbed", ids, 30)
    assert torch.equal(out.sequences, hf_greedy(llama["target"], ids, 30))


def test_prefill_chunks_take_onednn_in_place_where_the_plan_takes_onednn(monkeypatch) -> None:
    """A chunk above the plan's last band: oneDNN on the weights in place where the plan ends on
    oneDNN (packed or not), else ``F.linear``; within the bands, the plan's own kernel. The chunk's
    product goes through oneDNN and equals ``F.linear``'s up to rounding."""
    from dynatree.options import LinearPlan
    from dynatree.runtime.kernels.cpu_linear import SmallBatchLinear

    epyc = LinearPlan(((3, "rowmajor"), (64, "packed")))
    chunk = aot_engine.prefill_layout(epyc, 256)
    assert isinstance(chunk, SmallBatchLinear) and chunk.plan.kernel(256) == "onednn"
    assert aot_engine.prefill_layout(epyc, 40).plan.kernel(40) == "packed"
    for plan in (LinearPlan(((2, "rowmajor"),)), None):  # (a plan that keeps F.linear past 2 rows; none)
        assert not isinstance(aot_engine.prefill_layout(plan, 256), SmallBatchLinear)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a) or real(*a), raising=False)
    x, w = torch.randn(256, 48), torch.randn(24, 48)
    with chunk:
        y = torch.nn.functional.linear(x, w)
    assert calls and torch.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_learned_positions_model_equals_hf_greedy() -> None:
    target = tiny_model("gpt2", 0)
    ids = prompt(9, 4)
    out = run({"target": target, "d": perturbed(target)}, "linear", "d", ids, 40, buckets=(1, 3), k=2)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 40))


def test_the_frozen_package_serves_the_packed_rows_within_the_memory_budget(llama, monkeypatch) -> None:
    from dynatree.runtime.kernels import cpu_linear

    plan = _plan(llama["target"])
    # (the pinned plan packs from 4 rows: the 4-row bucket's calls, 2-4 rows, and all above)
    assert aot_engine.package_layout(llama["target"], BUCKETS, plan) == ((1,), 2)
    assert aot_engine.package_layout(llama["target"], (1, 2, 8, 16), plan) == ((1, 2), 3)
    size = sum(p.numel() * p.element_size() for p in llama["target"].parameters())
    monkeypatch.setattr(cpu_linear, "packing_budget", lambda already=0: size)  # room for one copy
    assert aot_engine.package_layout(llama["target"], BUCKETS, plan) == ((1,), 2)
    monkeypatch.setattr(cpu_linear, "packing_budget", lambda already=0: size - 1)  # none
    assert aot_engine.package_layout(llama["target"], BUCKETS, plan) == (BUCKETS, None)
    assert aot_engine.package_layout(llama["target"], BUCKETS, None) == (BUCKETS, None)


def test_a_bucket_is_frozen_where_the_plan_packs_at_fewer_rows_too(llama) -> None:
    """A plan measured near its crossing flips (the embedded target's on the EPYC: packed at 3 rows,
    row-major at 4): the 4-row bucket serves 3-row calls, and packing gains with rows, so it is
    frozen; the 2-row bucket, row-major at 1-2 rows, is not."""
    plan = LinearPlan(((2, "rowmajor"), (3, "packed"), (4, "rowmajor"), (64, "packed")))
    assert aot_engine.package_layout(llama["target"], (1, 2, 4, 8, 16), plan) == ((1, 2), 3)


def test_the_frozen_package_serves_three_rows_and_more_wherever_the_plan_packs(llama) -> None:
    """The frozen package beats a traced bucket at 3-4 rows even where the plan, timing each
    product alone, takes ``F.linear`` there (its products are fused with their neighbours): a plan
    that packs from 5 rows still freezes from 3, not from 5; one that packs nowhere up to the
    largest bucket freezes nothing, and a dynamic package that starts lower keeps its start."""
    late = LinearPlan(((4, "linear"), (64, "packed")))
    assert aot_engine.package_layout(llama["target"], (1, 2, 4, 8, 16), late) == ((1, 2), 3)
    assert aot_engine.package_layout(llama["target"], (1, 2, 4), late) == ((1, 2, 4), None)
    assert aot_engine.package_layout(llama["target"], (1, 2), LinearPlan(((1, "linear"), (64, "packed")))) == ((1,), 2)


def test_the_frozen_package_multiplies_the_products_of_one_input_at_once(llama) -> None:
    """A layer's q, k and v read one input, and so do its gate and up: the frozen package runs
    each group as one oneDNN product (``FROZEN_INDUCTOR``), so a layer makes 2 plain calls (and 2
    with the residual's add), not 5. Read off the package's generated code."""
    import re
    import zipfile

    run(llama, "autoregressive", "self", prompt(3, 1), 4)  # (built here if not yet)
    plan = _plan(llama["target"])
    low = aot_engine.package_layout(llama["target"], BUCKETS, plan)[1]
    path = aot_store.path_for(aot_engine.package_key(llama["target"], low, True, plan, frozen=True))
    with zipfile.ZipFile(path) as archive:
        code = "".join(archive.read(n).decode() for n in archive.namelist() if n.endswith("wrapper.cpp"))
    layers = llama["target"].config.num_hidden_layers
    assert len(re.findall(r"_linear_pointwise\(", code)) == 2 * layers
    assert len(re.findall(r"_linear_pointwise_binary\(", code)) == 2 * layers


def test_the_cost_profile_is_timed_at_the_buckets_and_keyed_by_the_build(llama, tmp_path, monkeypatch) -> None:
    """A call runs at its bucket's rows (every row count from the dynamic package's up), so the
    target's cost profile is timed at those and read stepwise (not a line through 1, 2, 4, 6, ...
    rows, whose sizes between buckets were timed as their bucket and interpolated); and a profile
    timed on other packages is not reused."""
    import itertools

    from dynatree.core import costmodel

    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(costmodel.ENV_SWITCH, "measure")
    real, ticks, calls = costmodel.measure, itertools.count(), []

    def fake(kv, sizes, lazy_head, **kw):  # (the engine's own calls, a fake clock)
        calls.append(tuple(sizes))
        return real(kv, sizes, lazy_head, reps=1, clock=lambda: float(next(ticks)))

    monkeypatch.setattr(costmodel, "measure", fake)
    kv = _engine(llama)
    with torch.inference_mode():
        p = costmodel.profile_for(kv, llama["target"], "aot", False, True)
        sizes = (1,) + tuple(range(2, 33))  # (the fixed bucket 1; the dynamic package from 2 to 32 rows)
        assert kv.buckets == sizes and p.rows == sizes and p.stepwise and calls == [sizes]
        assert costmodel.profile_for(kv, llama["target"], "aot", False, True) == p and len(calls) == 1  # (from disk)
        kv.build = {**kv.build, "grouped_kv": False}  # (packages built otherwise)
        costmodel.profile_for(kv, llama["target"], "aot", False, True)
    assert len(calls) == 2


def test_a_frozen_package_serves_only_the_weights_it_holds(llama, monkeypatch) -> None:
    """Two models of one config: each runs on its own frozen packages and equals its own greedy
    output. Control: with the weights left out of the key, the second model runs on the first
    one's weights and the check fails."""
    ids, buckets = prompt(6, 4), (1, 32)  # (2-32 rows: frozen; the target as its own draft: no draft packages)
    other = tiny_model("llama", 11)
    out = run({"target": other, "self": other}, "fixed", "self", ids, 30, buckets=buckets)
    assert torch.equal(out.sequences, hf_greedy(other, ids, 30))
    monkeypatch.setattr(aot_engine, "weights_digest", lambda model: "the same for every model")
    aot_engine.forget()
    run({"target": other, "self": other}, "fixed", "self", ids, 4, buckets=buckets)  # (built under the shared key)
    third = tiny_model("llama", 12)
    out = run({"target": third, "self": third}, "fixed", "self", ids, 30, buckets=buckets)
    assert not torch.equal(out.sequences, hf_greedy(third, ids, 30))
    aot_engine.forget()


def test_a_second_engine_on_the_same_weights_reuses_the_bound_packages(llama, monkeypatch) -> None:
    """Each generate opens an engine: on the same model and weights it takes the packages the
    last one bound, without keys or binding; a weight changed in place, or replaced, makes it key
    and bind them again (and stay HF greedy's). Fails where the stamp misses either change."""
    target = perturbed(llama["target"], noise=0.0, seed=5)  # (a copy: the module's own stays as it is)
    _engine({"target": target})
    keyed: list[int] = []
    real_key = aot_engine.package_key
    monkeypatch.setattr(aot_engine, "package_key", lambda *a, **k: keyed.append(1) or real_key(*a, **k))
    first = _engine({"target": target})
    assert keyed == []
    weight = target.get_output_embeddings().weight
    with torch.no_grad():
        weight.mul_(1.0)  # (same values, a new version: it is keyed again)
    second = _engine({"target": target})
    assert keyed and first._packages.keys() == second._packages.keys()
    keyed.clear()
    target.get_output_embeddings().weight = torch.nn.Parameter(weight.detach().clone())  # (replaced)
    _engine({"target": target})
    assert keyed
    ids = prompt(9, 3)
    out = run({"target": target, "self": target}, "fixed", "self", ids, 12)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 12))


def test_the_weights_stamp_sees_a_shared_embedding_the_model_does_not_own() -> None:
    """A distilled draft reads its target's input embedding: the stamp that lets a second engine
    reuse the bound packages must change with it too. Fails on a stamp over the model's own
    parameters only."""
    model, owner = tiny_model("llama", 14), tiny_model("llama", 15)
    shared = owner.get_input_embeddings()
    model.get_input_embeddings = lambda: shared  # (an embedding the model reads but does not own)
    before = aot_engine._stamp(model)
    assert aot_engine._stamp(model) == before
    with torch.no_grad():
        shared.weight.add_(0.0)
    assert aot_engine._stamp(model) != before


def test_a_weight_changed_in_place_gets_its_own_package(monkeypatch) -> None:
    model = tiny_model("llama", 13)
    before = aot_engine.weights_digest(model)
    assert aot_engine.weights_digest(model) == before
    with torch.no_grad():
        next(model.parameters()).add_(0.5)
    assert aot_engine.weights_digest(model) != before


def test_prefill_chunks_are_even_and_read_exactly_the_columns_they_fill(llama, monkeypatch) -> None:
    """A prompt of several chunks: even chunks (no short tail), each run on a cache of exactly
    the columns it fills once the first allocation is outgrown (a package reads every column);
    the output stays HF greedy's."""
    monkeypatch.setattr(aot_engine, "PREFILL_CHUNK", 40)  # (the buckets end at 32: chunks of 40)
    seen: list[tuple[int, int, int]] = []
    run_step = AOTCachedModel._run

    def spy(self, tokens, *args, **kw):
        seen.append((len(tokens), self.length, self.capacity))
        return run_step(self, tokens, *args, **kw)

    monkeypatch.setattr(AOTCachedModel, "_run", spy)
    kv = _engine(llama)
    kv.prefill(prompt(129, 4)[0].tolist())
    assert [q for q, _, _ in seen] == [33, 33, 33, 30]
    assert [cap for _, _, cap in seen] == [64, 66, 99, 129]  # (the first allocation holds the first chunk)
    seen.clear()
    ids = prompt(130, 4)
    out = run(llama, "dynatree", "perturbed", ids, 30)
    assert seen[0][0] == 33 and torch.equal(out.sequences, hf_greedy(llama["target"], ids, 30))


def test_a_prompts_chunks_read_the_lm_head_for_the_last_row_only(llama, monkeypatch) -> None:
    """A prompt of several chunks: only the last chunk's last row needs logits (and none where no
    logits are asked), so the head's product over the vocabulary runs once, not once a chunk."""
    monkeypatch.setattr(aot_engine, "PREFILL_CHUNK", 40)  # (the buckets end at 32: chunks of 40)
    heads: list[int] = []
    apply_head = AOTCachedModel.apply_head
    monkeypatch.setattr(AOTCachedModel, "apply_head", lambda self, h: heads.append(h.shape[0]) or apply_head(self, h))
    ids = prompt(129, 4)[0].tolist()
    kv = _engine(llama)
    logits = kv.prefill(ids, logits=True)
    assert heads == [1]
    expected = llama["target"](torch.tensor([ids])).logits[0, -1]
    assert torch.allclose(logits, expected, rtol=0, atol=logit_atol(expected))
    heads.clear()
    _engine(llama).prefill(ids)
    assert heads == []


def test_the_cache_grows_past_its_first_allocation(llama) -> None:
    """A run longer than the first 64 columns reallocates the cache (same package: the cache's
    length is a dynamic dimension) and stays exact."""
    ids = prompt(5, 5)
    out = run(llama, "dynatree", "perturbed", ids, 150)
    assert torch.equal(out.sequences, hf_greedy(llama["target"], ids, 150))


def test_the_cache_grows_by_an_eighth_in_whole_steps() -> None:
    """Every package reads the cache's whole capacity, so it grows by an eighth, not by doubling."""
    for needed in (1, 65, 128, 129, 1000, 1025, 5000, 70_000):
        cols = aot_engine.grown_columns(needed)
        assert cols >= needed and cols % 128 == 0 and cols <= needed + needed // 8 + 128, (needed, cols)


def _exported_attention(model: torch.nn.Module, monkeypatch) -> list[torch.Size]:
    """The shapes of the attention scores' softmax in the program ``build_package`` exports for 2
    rows (stopped before packaging); empty where attention runs as SDPA."""
    seen = {}

    class Stop(Exception):
        pass

    def grab(program, **_: object):
        seen["program"] = program
        raise Stop

    monkeypatch.setattr(aot_engine.torch._inductor, "aoti_compile_and_package", grab)
    with pytest.raises(Stop):
        aot_engine.build_package("unused.pt2", model, 2, True, None)
    return [n.meta["val"].shape for n in seen["program"].graph.nodes if "softmax" in str(n.target)]


def test_packages_read_shared_kv_heads_in_place(llama, monkeypatch) -> None:
    """The tiny llama has 4 query heads on 2 KV heads: its packages attend with the 2 query heads
    of each KV head stacked as 2 x 2 rows of one product (scores [1, 2, 4, S]), not through HF's
    copy of the cache per query head (which HF's own one-row shortcut skips only outside a
    compiler). Control: exported without the flag, attention is SDPA on the copy, and the check fails."""
    shapes = _exported_attention(llama["target"], monkeypatch)
    assert shapes and all(tuple(s[:3]) == (1, 2, 4) for s in shapes)
    monkeypatch.setattr(aot_engine, "GROUPED_KV", False)
    assert not _exported_attention(llama["target"], monkeypatch)


def _detected(llama, monkeypatch, name: str, owner, replacement) -> bool:
    monkeypatch.setattr(owner, name, replacement)
    ids = prompt(6, 4)
    ref = hf_greedy(llama["target"], ids, 40)
    return any(not torch.equal(run(llama, s, "perturbed", ids, 40).sequences, ref) for s in ("fixed", "dynatree", "linear"))


def test_control_a_kv_row_left_in_place_after_a_rejected_branch_is_caught(llama, monkeypatch) -> None:
    compact = AOTCachedModel.compact

    def broken(self, start, keep):  # the accepted rows are not gathered: rejected siblings' rows stay
        keep = list(keep)
        self._length = start + len(keep)

    assert _detected(llama, monkeypatch, "compact", AOTCachedModel, broken)
    monkeypatch.setattr(AOTCachedModel, "compact", compact)


def test_control_a_mask_that_lets_a_node_see_its_sibling_is_caught(llama, monkeypatch) -> None:
    def sees_siblings(parent: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        return torch.ones(parent.numel(), parent.numel(), dtype=torch.bool).tril()

    assert _detected(llama, monkeypatch, "ancestor_matrix", dynatree.core.verify, sees_siblings)


# ------------------------------------------------------------------------------- the store
def test_packages_are_built_once_and_then_loaded(llama) -> None:
    run(llama, "dynatree", "perturbed", prompt(3, 1), 8)
    plan = _plan(llama["target"])
    fixed, low = aot_engine.package_layout(llama["target"], BUCKETS, plan)
    packages = [aot_store.path_for(aot_engine.package_key(llama["target"], b, True, plan, b == low))
                for b in fixed + (low,)]
    assert all(aot_store.intact(p) for p in packages)
    assert aot_engine.all_cached(llama["target"], BUCKETS, plan)
    assert aot_engine.all_cached(llama["target"], BUCKETS + (64,), plan)  # (the dynamic package's rows)
    assert not aot_engine.all_cached(llama["target"], (1, 2) + BUCKETS[1:], plan)  # (a 2-row bucket: one more)
    stamps = [p.stat().st_mtime_ns for p in packages]
    run(llama, "linear", "self", prompt(3, 1), 8, k=4)
    assert [p.stat().st_mtime_ns for p in packages] == stamps
    records = aot_engine.loaded_records(llama["target"])  # (what the bench reports as built)
    assert {r["bucket"] for r in records} >= {*fixed, low} and all(r["build_s"] > 0 for r in records)


def test_a_second_process_loads_the_packages_without_building(llama, cache_dir: Path) -> None:
    run(llama, "autoregressive", "self", prompt(3, 1), 4)  # (built here if not yet)
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        import dynatree
        from dynatree import EngineOptions, StoppingConfig
        from tiny import tiny_model, hf_greedy
        t = tiny_model("llama", 0)
        ids = torch.tensor([[3, 4, 5]])
        out = dynatree.generate(t, t, ids, "dynatree", max_new_tokens=12, stopping=StoppingConfig(eos_token_id=()),
                                options=EngineOptions(engine="aot", buckets={BUCKETS}), text=False,
                                tau=0.0, max_nodes=24)
        print("EQUAL", torch.equal(out.sequences, hf_greedy(t, ids, 12)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, ENV_DIR: str(cache_dir)}, timeout=600)
    assert "EQUAL True" in done.stdout, done.stderr[-2000:]
    assert "building the aot engine" not in done.stderr


def _fake(tmp_path: Path, monkeypatch) -> tuple[dict, list]:
    monkeypatch.setattr(aot_store, "cache_dir", lambda: tmp_path)
    built: list[str] = []

    def build(path: str) -> None:
        built.append(path)
        Path(path).write_bytes(b"package " + str(len(built)).encode())

    return {"model": "m", "bucket": 1}, built, build


def test_a_corrupt_package_is_rebuilt_never_trusted(tmp_path: Path, monkeypatch) -> None:
    key, built, build = _fake(tmp_path, monkeypatch)
    read = lambda p: Path(p).read_bytes()  # noqa: E731
    assert aot_store.obtain(key, build, read) == (b"package 1", True)
    assert aot_store.obtain(key, build, read) == (b"package 1", False)
    path = aot_store.path_for(key)
    path.write_bytes(b"package 1 with a flipped bit")  # bytes changed after the build: checksum fails
    assert aot_store.obtain(key, build, read) == (b"package 2", True)
    path.write_bytes(path.read_bytes()[:3])  # torn
    assert aot_store.obtain(key, build, read) == (b"package 3", True)


def test_a_package_that_fails_to_load_is_rebuilt(tmp_path: Path, monkeypatch) -> None:
    key, built, build = _fake(tmp_path, monkeypatch)
    aot_store.obtain(key, build, lambda p: p)
    calls = []

    def load(path: str) -> str:
        calls.append(path)
        if len(calls) <= 2:  # (the check outside the lock and the one inside it)
            raise RuntimeError("not a package")
        return "ok"

    assert aot_store.obtain(key, build, load) == ("ok", True)
    assert len(built) == 2


def test_a_package_that_fails_to_load_for_want_of_temporary_room_is_kept(tmp_path: Path, monkeypatch) -> None:
    """torch unpacks a package into the temporary folder to load it: with less room there than
    the package, a failed load says nothing about the package, so it is kept (not rebuilt, which
    would delete it and fail on the same full disk) and the error says what to do, in one line."""
    import shutil

    key, built, build = _fake(tmp_path, monkeypatch)
    aot_store.obtain(key, build, lambda p: p)
    path = aot_store.path_for(key)

    def load(path: str) -> str:
        raise RuntimeError("could not unpack the package\nmore lines")

    room = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: room._replace(free=1))
    with pytest.raises(DynaTreeError, match="less free space") as err:
        aot_store.obtain(key, build, load)
    assert "\n" not in str(err.value) and "TMPDIR" in str(err.value)
    assert len(built) == 1 and aot_store.intact(path)


def test_a_changed_library_or_cpu_is_another_key() -> None:
    a = aot_store.path_for({"torch": "2.13.0", "cpu": "EPYC"})
    assert a != aot_store.path_for({"torch": "2.14.0", "cpu": "EPYC"})
    assert a != aot_store.path_for({"torch": "2.13.0", "cpu": "Xeon"})


def test_two_processes_building_at_once_build_it_once(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from dynatree.runtime import aot_store
        aot_store.cache_dir = lambda: Path({str(tmp_path)!r})
        def build(path):
            with open({str(tmp_path / 'builds.log')!r}, "a") as f:
                f.write("build\\n")
            time.sleep(1.0)
            Path(path).write_bytes(b"the package")
        print(aot_store.obtain({{"k": 1}}, build, lambda p: Path(p).read_bytes())[0])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all("the package" in o for o in outs), outs
    assert (tmp_path / "builds.log").read_text().count("build") == 1


def _package(name: str, **key) -> tuple[dict, Path]:
    """A package of a few bytes built through the store, keyed like a real one on this machine."""
    key = {"model": name, **aot_store.machine(), **key}
    aot_store.obtain(key, lambda path: Path(path).write_bytes(name.encode()), lambda path: path)
    return key, aot_store.path_for(key)


def _age(path: Path, days: float) -> None:
    then = __import__("time").time() - days * 86400
    for f in (path, path.with_suffix(".json"), path.with_suffix(".sha256")):
        os.utime(f, (then, then))


def test_prune_removes_what_cannot_load_here_and_what_is_unused_if_asked(tmp_path: Path, monkeypatch) -> None:
    import json

    monkeypatch.setattr(aot_store, "cache_dir", lambda: tmp_path)
    live_key, live = _package("live")
    _, other_torch = _package("old torch", torch="0.0.1")
    _, other_cpu = _package("other cpu", cpu="another CPU")
    _, corrupt = _package("corrupt")
    corrupt.write_bytes(b"a flipped bit")
    _, unrecorded = _package("no record")
    unrecorded.with_suffix(".json").unlink()
    _, old_format = _package("old format")
    record = json.loads(old_format.with_suffix(".json").read_text())
    old_format.with_suffix(".json").write_text(json.dumps({**record, "format": aot_store.FORMAT + 1}))
    unused_key, unused = _package("unused")
    _age(unused, 10)
    _, building = _package("being rebuilt", torch="0.0.2")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_tmp, live_tmp = tmp_path / f"x.{gone.pid}.tmp.pt2", tmp_path / f"y.{os.getpid()}.tmp.pt2"
    dead_tmp.write_bytes(b"half")
    live_tmp.write_bytes(b"half")

    dead = {other_torch, other_cpu, corrupt, unrecorded, old_format, building}
    assert {e.path for e in aot_store.entries(verify=True) if e.stale} == dead
    assert {e.path for e in aot_store.entries() if e.stale} == dead - {corrupt}  # (the checksum only if asked)
    with aot_store.locked(building):  # (another process rebuilding it holds its lock)
        removed, freed = aot_store.prune()
    assert {e.path for e in removed} == dead - {building}
    assert freed == sum(e.size for e in removed) + len(b"half")
    assert not any(p.exists() or p.with_suffix(".json").exists() for p in dead - {building})
    assert building.exists() and live.exists() and unused.exists() and live_tmp.exists() and not dead_tmp.exists()

    assert aot_store.obtain(unused_key, lambda p: None, lambda p: "loaded") == ("loaded", False)  # a load is a use
    assert [e.path for e in aot_store.prune(unused_days=5)[0]] == [building]  # (its lock released)
    _age(unused, 10)
    assert [e.path for e in aot_store.prune(unused_days=5)[0]] == [unused]
    assert aot_store.obtain(live_key, lambda p: None, lambda p: "loaded") == ("loaded", False)


def test_the_build_estimate_scales_by_what_this_machine_took(llama, tmp_path: Path, monkeypatch) -> None:
    import json

    monkeypatch.setattr(aot_store, "cache_dir", lambda: tmp_path)
    model = llama["target"]
    one = aot_engine.BUILD_S_FIXED + aot_engine.BUILD_S_PER_LAYER * aot_engine.kv_shape(model)[0]
    assert aot_engine.build_pace() == 1.0  # (nothing built here yet: the constants)
    assert aot_engine.expected_build_s(model, 2, 1) == pytest.approx(one * (2 + aot_engine.BUILD_FROZEN_FACTOR))

    def took(name: str, layers: int, frozen: bool, seconds: float, **key) -> None:
        _, path = _package(name, config=json.dumps({"num_hidden_layers": layers}), **({"frozen": True} if frozen else {}),
                           **key)
        record = json.loads(path.with_suffix(".json").read_text())
        path.with_suffix(".json").write_text(json.dumps({**record, "build_s": seconds}))

    slow = 3.0
    took("a", 30, False, slow * (aot_engine.BUILD_S_FIXED + 30 * aot_engine.BUILD_S_PER_LAYER))
    took("b", 2, True, slow * (aot_engine.BUILD_S_FIXED + 2 * aot_engine.BUILD_S_PER_LAYER)
         * aot_engine.BUILD_FROZEN_FACTOR)
    took("c", 30, False, 1e6, torch="0.0.1")  # (another torch's build: not this environment's pace)
    assert aot_engine.build_pace() == pytest.approx(slow)
    assert aot_engine.expected_build_s(model, 2, 1) == pytest.approx(slow * one * (2 + aot_engine.BUILD_FROZEN_FACTOR))
    took("d", 30, False, 1e6)
    assert aot_engine.build_pace() == 4.0  # (bounded: one odd build does not make it absurd)


def test_engine_cache_lists_and_prunes_from_the_command_line(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from dynatree.cli.main import app

    monkeypatch.setattr(aot_store, "cache_dir", lambda: tmp_path)
    _, live = _package("live")
    _, old = _package("old", torch="0.0.1")
    listed = CliRunner().invoke(app, ["engine-cache"])
    assert listed.exit_code == 0, listed.output
    assert "2 package(s)" in listed.output and "1 can never load here" in listed.output
    assert "built for torch 0.0.1" in listed.output and "loads here" in listed.output
    pruned = CliRunner().invoke(app, ["engine-cache", "--prune"])
    assert pruned.exit_code == 0 and f"removed {old.name}" in pruned.output and "1 package(s) removed" in pruned.output
    assert live.exists() and not old.exists()
    refused = CliRunner().invoke(app, ["engine-cache", "--unused-days", "3"])
    assert refused.exit_code == 2 and refused.output.strip() == "error: --unused-days 3 needs --prune and a number of days >= 0"


# ------------------------------------------------------------------------------- choices
def test_auto_takes_aot_once_its_packages_are_built(llama, monkeypatch) -> None:
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    model = llama["target"]
    options = EngineOptions(buckets=BUCKETS)
    monkeypatch.setattr(aot_engine, "all_cached", lambda m, b, p: False)
    assert engines.resolve(options, model).engine == "hf"
    monkeypatch.setattr(aot_engine, "all_cached", lambda m, b, p: True)
    assert engines.resolve(options, model).engine == "aot"
    assert engines.resolve(options.replace(kv_window=64), model).engine == "hf"


def test_auto_builds_for_a_call_that_repays_the_build_and_else_says_how_once(llama, monkeypatch, capsys) -> None:
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    monkeypatch.setattr(engines, "_HINTED", __import__("weakref").WeakSet())
    model = llama["target"]
    options = EngineOptions(buckets=BUCKETS)
    monkeypatch.setattr(aot_engine, "all_cached", lambda m, b, p: False)
    plan = engines.resolve(options, model).linear_plan
    assert engines.resolve(options, model).engine == "hf"
    hint = capsys.readouterr().err
    assert hint.count("dynatree build-engine") == 1, hint  # once per model, not per call
    repaid = engines.aot_repaid_tokens(model, BUCKETS, plan)
    # the break-even: at least one package's expected build time over each token's saving
    layers = aot_engine.kv_shape(model)[0]
    assert repaid >= aot_engine.expected_build_s(model, 1) / (engines.AOT_SAVING_S_PER_LAYER_TOKEN * layers)
    assert engines.resolve(options, model, tokens=repaid - 1).engine == "hf"
    assert "build" not in capsys.readouterr().err
    assert engines.resolve(options, model, tokens=repaid).engine == "aot"
    assert "builds it" in capsys.readouterr().err
    monkeypatch.setattr(engines, "AOT_SAVING_S_PER_LAYER_TOKEN", engines.AOT_SAVING_S_PER_LAYER_TOKEN / 2)
    assert engines.resolve(options, model, tokens=repaid).engine == "hf"  # a smaller saving repays later
    monkeypatch.setattr(aot_engine, "all_cached", lambda m, b, p: True)
    assert engines.resolve(options, model, tokens=1).engine == "aot"  # built: taken whatever the length
    assert "build-engine" not in capsys.readouterr().err


def test_refusals_are_one_line(llama) -> None:
    cases = [
        (lambda: EngineOptions(engine="aot", compile=True), "engine='aot' is compiled ahead of time"),
        (lambda: EngineOptions(engine="aot", kv_window=64), "kv_window) works with engine='hf' only"),
        (lambda: AOTCachedModel(window_model("mistral"), VOCAB, 8, BUCKETS), "sliding-window layers"),
        (lambda: _engine(llama).call([1], torch.arange(1), torch.ones(1, 1, dtype=torch.bool), 0),
         "runs plain steps only"),
        (lambda: _engine(llama).forward_features(
            [1], torch.arange(1), torch.ones(1, 1, dtype=torch.bool), 0, layers=(0,)), "need the hf engine"),
    ]
    for make, message in cases:
        with pytest.raises(DynaTreeError) as err:
            make()
        assert message in str(err.value) and "\n" not in str(err.value)


def test_a_sharded_model_is_refused_and_never_picked_by_auto(llama, monkeypatch) -> None:
    from dynatree.runtime import distributed

    monkeypatch.setattr(distributed, "is_sharded", lambda model: True)
    with pytest.raises(DynaTreeError, match="tensor-parallel"):
        _engine(llama)
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    monkeypatch.setattr(aot_engine, "all_cached", lambda m, b, p: True)
    assert engines.resolve(EngineOptions(buckets=BUCKETS), llama["target"]).engine != "aot"


def test_a_tree_larger_than_every_bucket_is_refused(llama) -> None:
    kv = _engine(llama)
    kv.prefill([2, 3])
    visible = torch.eye(40, dtype=torch.bool)  # 40 roots: a tree, not a causal chain
    with pytest.raises(DynaTreeError, match="exceeds the aot engine's largest bucket"):
        kv.forward(list(range(40)), torch.full((40,), 2), visible, 2)


# ------------------------------------------------------------------------------- sampling
def _aot_pvalues(biased: bool, monkeypatch) -> tuple[list[float], float]:
    """The sampling suite's chi-square check (tests/exactness/test_sampling.py: the first tokens'
    counts over seeded runs against the target's exact marginals) with DySpec on the aot engine
    (``F.linear`` kept: unfrozen packages, shared by the target and its draft)."""
    from dynatree.core import verify
    from dynatree.core.sampling import SamplingConfig
    from exactness.test_sampling import POSITIONS, PROMPT, RUNS, T_MAIN, V, chi_square_pvalue, exact_marginals

    target = tiny_model("llama", 3, vocab=V, layers=1, init=0.3)
    draft = perturbed(target, 0.2, 7)
    if biased:  # control: the residual skipped after a rejection biases the output towards drafted tokens
        monkeypatch.setattr(verify, "residual", lambda r, d, x: r)
    cfg = SamplingConfig(T_MAIN)
    counts, deep = torch.zeros(POSITIONS, V), 0
    for seed in range(RUNS):
        out = dynatree.generate(target, draft, PROMPT, "dyspec", max_new_tokens=POSITIONS + 1, stopping=NO_EOS,
                                sampling=cfg, seed=seed, max_nodes=8, text=False,
                                options=EngineOptions(engine="aot", buckets=(1, 16), cpu_linear=False))
        tokens = out.sequences[0, len(PROMPT):len(PROMPT) + POSITIONS]
        counts[torch.arange(POSITIONS), tokens] += 1
        deep += out.stats.rounds[0].committed >= POSITIONS
    exact = exact_marginals(target, cfg, POSITIONS)
    return [chi_square_pvalue(counts[i], exact[i])[2] for i in range(POSITIONS)], deep / RUNS


def test_sampled_tokens_follow_the_target_distribution(monkeypatch) -> None:
    from exactness.test_sampling import ALPHA

    ps, deep = _aot_pvalues(False, monkeypatch)
    assert min(ps) >= ALPHA, f"p-values {ps}"
    assert deep >= 0.25, f"only {deep:.0%} of runs produced the last compared token inside the first tree"


def test_control_a_biased_verifier_on_the_aot_engine_is_caught(monkeypatch) -> None:
    from exactness.test_sampling import ALPHA

    ps, _ = _aot_pvalues(True, monkeypatch)
    assert min(ps) < ALPHA, f"biased verifier not detected: p-values {ps}"


def test_auto_asks_no_weights_digest_where_the_engine_was_never_built(monkeypatch) -> None:
    """``engine="auto"`` asks on every CPU call whether the packages exist: where they do not, the
    answer must not cost a pass over the weights (the digest of a frozen package's key)."""
    model = tiny_model("llama", 0, layers=3)  # (a config no test builds)

    def digest(model):
        raise AssertionError("the weights were hashed")

    monkeypatch.setattr(aot_engine, "weights_digest", digest)
    assert not aot_engine.all_cached(model, BUCKETS, _plan(model))
