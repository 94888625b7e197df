"""EngineOptions: every engine setting checked in one place, one line per refusal, and generate
running the engine its ``options=`` name. (The deprecated flat keywords, ``engine=`` and the like,
and their clash with ``options=`` are tested in test_generation_config.py.)"""

from __future__ import annotations

import pytest
import torch

import dynatree
from dynatree import DynaTreeError, EngineOptions, StoppingConfig
from dynatree.runtime import engines


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"engine": "fast"}, "unknown engine 'fast': must be 'auto', 'hf', 'static' or 'aot'"),
        ({"engine": "hf", "compile": True}, "compile=True needs engine='static'"),
        ({"engine": "hf", "compile": "max-autotune"}, "compile=True needs engine='static'"),
        ({"compile": ""}, "compile must be True, False, None or a torch.compile mode"),
        ({"compile": 1.5}, "compile must be True, False, None or a torch.compile mode"),
        ({"buckets": ()}, "buckets must be positive integers, got ()"),
        ({"buckets": [1, 0]}, "buckets must be positive integers, got [1, 0]"),
        ({"buckets": [1, 2.0]}, "buckets must be positive integers"),
        ({"buckets": [True]}, "buckets must be positive integers"),
        ({"buckets": "1,2"}, "buckets must be positive integers, got '1,2'"),
        ({"buckets": 8}, "buckets must be positive integers, got 8"),
        ({"cpu_linear": "yes"}, "cpu_linear must be True, False or None, got 'yes'"),
        ({"lazy_head": 1}, "lazy_head must be True, False or None, got 1"),
        ({"screened_head": "on"}, "screened_head must be True, False or None, got 'on'"),
        ({"tree_order": "random"}, "unknown tree_order 'random': must be 'bfs' or 'dfs'"),
        ({"kv_window": 0}, "kv_window must be a positive integer"),
        ({"kv_window": 64, "kv_sinks": -1}, "kv_sinks must be an integer >= 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(DynaTreeError) as err:
        EngineOptions(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_options_are_normalised_and_hashable() -> None:
    a = EngineOptions(engine="static", buckets=[8, 1, 4])
    assert a.buckets == (1, 4, 8) and a == EngineOptions(engine="static", buckets=(1, 4, 8))
    assert len({a, EngineOptions(engine="static", buckets=(4, 8, 1))}) == 1
    assert EngineOptions(kv_sinks=-1).kv_sinks == -1  # sinks only matter (and are checked) with a window
    with pytest.raises(DynaTreeError, match="compile=True needs engine='static'"):
        a.replace(engine="hf", compile=True)  # a copy is checked again


def test_keywords_and_options_merge_or_conflict() -> None:
    opts = EngineOptions(engine="static", tree_order="dfs")
    assert EngineOptions.merge(None, engine="hf") == EngineOptions(engine="hf")
    assert EngineOptions.merge(opts, engine="auto", tree_order="bfs") is opts  # defaults defer to options
    assert EngineOptions.merge(opts, engine="static") is opts  # the same value twice is no conflict
    with pytest.raises(DynaTreeError) as err:
        EngineOptions.merge(opts, engine="hf", kv_sinks=2)
    text = str(err.value)
    assert "engine='hf' vs options.engine='static'" in text and "kv_sinks=2 vs options.kv_sinks=4" in text
    assert "tree_order" not in text and "\n" not in text
    with pytest.raises(DynaTreeError, match="options must be an EngineOptions, got dict"):
        EngineOptions.merge({"engine": "hf"})  # type: ignore[arg-type]


IDS = torch.tensor([[5, 6, 7, 8, 9]])


def test_generate_takes_options(llama_pair) -> None:
    target, draft = llama_pair
    run = dict(max_new_tokens=10, stopping=StoppingConfig(eos_token_id=()))
    opts = EngineOptions(engine="static", tree_order="dfs")
    by_options = dynatree.generate(target, draft, IDS, "linear", k=3, options=opts, **run, text=False)
    reference = dynatree.generate(target, None, IDS, "autoregressive", options=EngineOptions(engine="hf"), **run)
    assert torch.equal(by_options.sequences, reference.sequences)
    assert any(key[2].buckets is None for key in engines.DEFAULT_POOL.entries(target))  # it ran the static engine
    with pytest.raises(DynaTreeError, match="unknown tree_order"):  # refused before any model call
        dynatree.generate(target, draft, IDS, "linear", options=EngineOptions(tree_order="random"), **run, text=False)


def test_precompile_refuses_the_hf_engine(llama_pair) -> None:
    with pytest.raises(DynaTreeError, match="precompile builds the static engine"):
        dynatree.precompile(*llama_pair, 32, EngineOptions(engine="hf"))
    with pytest.raises(DynaTreeError, match="buckets=\\(1, 2\\) vs options.buckets=None"):
        dynatree.precompile(*llama_pair, 32, EngineOptions(engine="static"), buckets=[2, 1])


def test_a_strategy_string_carries_its_options() -> None:
    """generate(..., "linear:k=5") as the bench and the CLI write it; a clash with a keyword is refused."""
    from dynatree.errors import DynaTreeError
    from dynatree.policies import make_policy

    assert make_policy("linear:k=5").config.k == 5
    fixed = make_policy("fixed:depth=3:branch=2", tau=0.2)
    assert (fixed.config.depth, fixed.config.branch, fixed.config.tau) == (3, 2, 0.2)
    for bad, msg in (("linear:k=5", "both in the strategy string"), ("linear:k", "name=value"),
                     ("linear:kk=5", "kk"), ("lineer:k=5", "did you mean 'linear'")):
        with pytest.raises(DynaTreeError, match=msg):
            make_policy(bad, **({"k": 4} if msg.startswith("both") else {}))


def test_precompile_takes_a_text_draft(llama_pair) -> None:
    """`dynatree generate --text --compile` precompiles with a TextDraft as its draft (no module).
    What is tested is that the text draft's model is found and built into the pool; compiling its
    graphs (34 s of the suite) adds nothing here, the compiled engine's own tests compile."""
    from dynatree.drafts.suffix import TextDraft

    target, draft = llama_pair
    opts = EngineOptions(engine="static", buckets=(1, 4), compile=False)
    dynatree.precompile(target, TextDraft(model=draft), 32, opts)
    dynatree.precompile(target, None, 32, opts)
    assert any(key[2].buckets == (1, 4) for key in engines.DEFAULT_POOL.entries(target))
    assert any(key[2].buckets == (1, 4) for key in engines.DEFAULT_POOL.entries(draft))  # the text draft's model
