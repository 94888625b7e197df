"""Greedy exactness: every strategy's output equals HF ``generate(do_sample=False)`` token for token.

Tiny fp32 random models of four architectures (RoPE: Llama, Qwen2, GPTNeoX with partial rotary;
learned positions: GPT-2), three kinds of draft (the target itself, an unrelated random model,
a perturbed copy so acceptance is partial), several prompt lengths including 1, EOS inside an
accepted path, and max_new_tokens hit mid-path. Strategies come from the registry, so every
strategy added later is covered without touching this file.
"""

from __future__ import annotations

import functools

import pytest
import torch

import dynatree
from dynatree import STRATEGIES, EngineOptions, StoppingConfig
from dynatree.errors import DynaTreeError
from tiny import ARCHS, SMALL_TREES, VOCAB, hf_greedy, perturbed, tiny_model

OPTIONS = SMALL_TREES
DRAFTS = ("self", "random", "perturbed")
NO_EOS = StoppingConfig(eos_token_id=())


@functools.lru_cache(maxsize=None)
def models(arch: str, attn: str = "sdpa") -> dict[str, torch.nn.Module]:
    target = tiny_model(arch, 0, attn=attn)
    return {
        "target": target,
        "self": target,
        "random": tiny_model(arch, 7, attn=attn),
        "perturbed": perturbed(target),
    }


def prompt(length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (1, length), generator=g)


def run(arch: str, strategy: str, draft: str, ids: torch.Tensor, n: int, eos=(), attn: str = "sdpa"):
    m = models(arch, attn)
    return dynatree.generate(m["target"], m[draft], ids, strategy, max_new_tokens=n,
                             stopping=StoppingConfig(eos_token_id=tuple(eos)), **OPTIONS.get(strategy, {}), text=False)


@functools.lru_cache(maxsize=None)
def reference(arch: str, length: int, seed: int, n: int, eos: int | None = None, attn: str = "sdpa") -> torch.Tensor:
    return hf_greedy(models(arch, attn)["target"], prompt(length, seed), n, eos)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("draft", DRAFTS)
def test_greedy_equals_target(arch: str, strategy: str, draft: str) -> None:
    for length, seed, n in [(1, 0, 24), (5, 1, 40), (13, 2, 33)]:
        out = run(arch, strategy, draft, prompt(length, seed), n)
        assert torch.equal(out.sequences, reference(arch, length, seed, n)), (arch, strategy, draft, length)
        assert out.stats.new_tokens == n


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["fixed", "dynatree", "linear"])
def test_greedy_equals_target_eager_attention(arch: str, strategy: str) -> None:
    out = run(arch, strategy, "perturbed", prompt(6, 3), 30, attn="eager")
    assert torch.equal(out.sequences, reference(arch, 6, 3, 30, attn="eager"))


def test_perturbed_draft_is_partially_accepted() -> None:
    """Guards the test setup: the perturbed pair must exercise multi-token accepted paths."""
    for arch in ARCHS:
        s = run(arch, "dynatree", "perturbed", prompt(5, 1), 40).stats
        assert 1.3 < s.mean_committed and 0.0 < s.acceptance < 1.0, (arch, s.summary())


def round_ends(stats) -> list[int]:
    ends, total = [], 0
    for r in stats.rounds:
        total += r.committed
        ends.append(total)
    return ends


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["linear", "fixed", "dynatree"])
def test_max_new_tokens_mid_path(arch: str, strategy: str) -> None:
    ids = prompt(4, 5)
    full = run(arch, strategy, "self", ids, 40)
    ends = round_ends(full.stats)
    # the first budget that stops strictly inside a multi-token round
    cut = next(e - 1 for s, e in zip([0] + ends, ends) if e - s >= 2)
    out = run(arch, strategy, "self", ids, cut)
    assert torch.equal(out.sequences, reference(arch, 4, 5, cut))
    assert out.stats.new_tokens == cut


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["linear", "fixed", "dynatree"])
def test_eos_inside_accepted_path(arch: str, strategy: str) -> None:
    ids = prompt(4, 6)
    full = run(arch, strategy, "self", ids, 40)
    new = full.sequences[0, 4:].tolist()
    ends = set(round_ends(full.stats))
    # a position that is not the last token of its round and whose token has not occurred before
    pos = next(i for i in range(1, len(new)) if (i + 1) not in ends and new[i] not in new[:i])
    eos = new[pos]
    out = run(arch, strategy, "self", ids, 40, eos=[eos])
    assert torch.equal(out.sequences, reference(arch, 4, 6, 40, eos))
    assert out.sequences[0, -1].item() == eos and out.stats.new_tokens == pos + 1


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_long_generation(arch: str) -> None:
    ids = prompt(9, 8)
    for strategy in ("linear", "dynatree"):
        out = run(arch, strategy, "perturbed", ids, 300)
        assert torch.equal(out.sequences, reference(arch, 9, 8, 300)), strategy


def test_eos_default_comes_from_generation_config() -> None:
    """eos_token_id=None behaves like HF generate: the model's generation_config decides."""
    m = models("llama")
    ids = prompt(3, 9)
    new = reference("llama", 3, 9, 30)[0, 3:].tolist()
    eos = new[10]
    m["target"].generation_config.eos_token_id = eos
    try:
        out = dynatree.generate(m["target"], m["self"], ids, "linear", max_new_tokens=30, k=4, text=False)
    finally:
        m["target"].generation_config.eos_token_id = 1
    assert out.sequences[0, 3:].tolist() == new[: new.index(eos) + 1]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_static_engine_equals_target(arch: str, strategy: str) -> None:
    """The pre-allocated, bucket-padded cache path is exact like the dynamic one."""
    m = models(arch)
    for length, seed, n in [(1, 0, 24), (13, 2, 33)]:
        out = dynatree.generate(m["target"], m["perturbed"], prompt(length, seed), strategy, max_new_tokens=n,
                                stopping=NO_EOS, options=EngineOptions(engine="static"), **OPTIONS.get(strategy, {}), text=False)
        assert torch.equal(out.sequences, reference(arch, length, seed, n)), (arch, strategy, length)


def test_compiled_static_engine_equals_target() -> None:
    """torch.compile'd steps (one graph per bucket): precompile builds them all, runs add none."""
    from torch._dynamo.utils import counters

    m = models("llama")
    buckets = (1, 4, 8)
    dynatree.precompile(m["target"], m["perturbed"], 64, buckets=buckets)
    graphs = counters["stats"]["unique_graphs"]
    for seed in (1, 2):
        out = dynatree.generate(m["target"], m["perturbed"], prompt(5, seed), "linear", max_new_tokens=20,
                                stopping=NO_EOS, options=EngineOptions(engine="static", compile=True, buckets=buckets),
                                k=3, text=False)
        assert torch.equal(out.sequences, reference("llama", 5, seed, 20))
    assert counters["stats"]["unique_graphs"] == graphs, "a timed run compiled a new graph"


def test_every_bucket_keeps_its_graph_past_dynamos_recompile_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Target and draft compile one method into 2 x 6 = 12 graphs, past dynamo's default limit of 8
    graphs per code object (beyond it the step would run uncompiled, silently), on top of the
    graphs earlier tests left on the same method. The limit is raised only during the engine's own
    calls: the process-wide setting is left as it was. Dynamo's ``eager`` backend traces the same
    graphs without inductor's minutes of code generation."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: real(fn, backend="eager", **kw))
    target = tiny_model("llama", 11)  # fresh models: no graph of an earlier test can be reused
    draft = perturbed(target)
    buckets = (1, 2, 3, 5, 6, 7)
    limit = torch._dynamo.config.recompile_limit
    before = counters["stats"]["unique_graphs"]
    dynatree.precompile(target, draft, 48, buckets=buckets)
    assert counters["stats"]["unique_graphs"] - before >= 2 * len(buckets), "a bucket runs uncompiled"
    assert torch._dynamo.config.recompile_limit == limit, "the process-wide recompile limit was changed"
    out = dynatree.generate(target, draft, prompt(5, 3), "fixed", max_new_tokens=12, stopping=NO_EOS,
                            options=EngineOptions(engine="static", compile=True, buckets=buckets),
                            depth=2, branch=2, max_nodes=6, text=False)
    assert torch.equal(out.sequences, hf_greedy(target, prompt(5, 3), 12, None))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("engine", ["hf", "static"])
@pytest.mark.parametrize("strategy", ["fixed", "dynatree", "dyspec"])
def test_dfs_tree_order_equals_target(arch: str, engine: str, strategy: str) -> None:
    """Verifying the tree in depth-first order (for the block-sparse kernel) changes nothing."""
    m = models(arch)
    out = dynatree.generate(m["target"], m["perturbed"], prompt(7, 4), strategy, max_new_tokens=30,
                            stopping=NO_EOS, options=EngineOptions(engine=engine, tree_order="dfs"),
                            **OPTIONS.get(strategy, {}), text=False)
    assert torch.equal(out.sequences, reference(arch, 7, 4, 30))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("lazy_head", [False, True])
@pytest.mark.parametrize("engine", ["hf", "static"])
def test_lazy_and_full_lm_head_equal_target(arch: str, lazy_head: bool, engine: str) -> None:
    """Applying the LM head to every node (GPU default) or only to the nodes read (CPU default)."""
    m = models(arch)
    out = dynatree.generate(m["target"], m["perturbed"], prompt(6, 5), "dynatree", max_new_tokens=30,
                            stopping=NO_EOS, options=EngineOptions(lazy_head=lazy_head, engine=engine),
                            **OPTIONS["dynatree"], text=False)
    assert torch.equal(out.sequences, reference(arch, 6, 5, 30))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", ["autoregressive", "dynatree"])
def test_the_screened_head_equals_target(arch: str, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy acceptance through the head's int8 screen (the CPU default): HF greedy's tokens, with
    the screen deciding the rows it reads (counted), on plain decoding and on trees."""
    from dynatree.runtime.kernels.screened_head import ScreenedHead

    calls: list[int] = []
    real = ScreenedHead.argmax
    monkeypatch.setattr(ScreenedHead, "argmax", lambda self, h, full: calls.append(h.shape[0]) or real(self, h, full))
    m = models(arch)
    draft = None if strategy == "autoregressive" else m["perturbed"]
    out = dynatree.generate(m["target"], draft, prompt(6, 5), strategy, max_new_tokens=30, stopping=NO_EOS,
                            options=EngineOptions(screened_head=True), **OPTIONS.get(strategy, {}), text=False)
    assert torch.equal(out.sequences, reference(arch, 6, 5, 30))
    assert len(calls) >= (29 if draft is None else 1)


def test_screened_head_needs_the_lazy_head() -> None:
    m = models("llama")
    with pytest.raises(DynaTreeError, match="screened_head=True needs the lazy head"):
        dynatree.generate(m["target"], None, prompt(6, 5), "autoregressive", max_new_tokens=3,
                          options=EngineOptions(lazy_head=False, screened_head=True))


def test_static_engine_prefills_prompts_longer_than_the_largest_bucket() -> None:
    m = models("llama")
    ids = prompt(40, 12)
    out = dynatree.generate(m["target"], m["perturbed"], ids, "linear", max_new_tokens=10, stopping=NO_EOS,
                            options=EngineOptions(engine="static", buckets=(1, 2, 4, 8)), k=3, text=False)
    assert torch.equal(out.sequences, reference("llama", 40, 12, 10))
