"""``engine="auto"``: which engine a call with no engine arguments gets, decided without compiling."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model

import dynatree
from dynatree.runtime import engines
from dynatree.runtime.engines import CPU_AUTO_BUCKETS, resolve as resolve_options
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig


@pytest.fixture
def model() -> torch.nn.Module:
    return tiny_model("llama", 0)


def resolve(model: torch.nn.Module, **options) -> tuple:
    r = resolve_options(EngineOptions(**options), model)
    return r.engine, r.compile, r.buckets


def test_tiny_model_stays_eager(model) -> None:
    assert resolve(model) == ("hf", False, None)


def test_real_model_compiles_only_with_graphs_or_on_request(model, monkeypatch) -> None:
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    monkeypatch.setattr(engines, "_can_compile", lambda device: True)
    assert resolve(model) == ("hf", False, None)  # CPU, nothing compiled yet: eager hf
    assert resolve(model, compile=True) == ("static", True, CPU_AUTO_BUCKETS)
    assert resolve(model, compile=True, buckets=(1, 4)) == ("static", True, (1, 4))
    with pytest.raises(DynaTreeError, match="compile=True needs engine='static'"):
        resolve(model, compile=True, kv_window=64)  # eviction runs on the hf engine only
    pool = engines.StaticPool()
    monkeypatch.setattr(pool, "compiled_buckets", lambda m: (1, 8))
    assert resolve(model, pool=pool) == ("static", True, (1, 8))  # graphs exist: use them, not new buckets
    assert resolve(model, pool=pool, compile=False) == ("hf", False, None)  # --no-compile
    monkeypatch.setattr(engines, "_can_compile", lambda device: False)
    assert resolve(model, pool=pool) == ("hf", False, None)


def test_the_default_pool_never_decides_the_engine(model, monkeypatch) -> None:
    """What earlier calls compiled into the process's default pool spares recompiling, nothing more:
    a call without an explicit pool is decided the same whatever ran before it."""
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    monkeypatch.setattr(engines, "_can_compile", lambda device: True)
    monkeypatch.setattr(engines.DEFAULT_POOL, "compiled_buckets", lambda m: (1, 8))
    assert resolve(model) == ("hf", False, None)
    with pytest.raises(DynaTreeError, match="StaticPool"):
        resolve(model, pool={})


def test_explicit_engines_are_kept(model) -> None:
    assert resolve(model, engine="static") == ("static", False, None)
    assert resolve(model, engine="static", compile=True) == ("static", True, None)
    assert resolve(model, engine="hf") == ("hf", False, None)
    with pytest.raises(DynaTreeError, match="unknown engine"):
        resolve(model, engine="fast")


def test_resolving_decides_every_field_and_twice_changes_nothing(model, monkeypatch) -> None:
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    monkeypatch.setattr(engines, "_can_compile", lambda device: True)
    given = EngineOptions(compile=True, tree_order="dfs")
    once = resolve_options(given, model)
    assert not given.resolved and once.resolved and once.cpu_linear is True  # CPU model: the few-row layout
    assert resolve_options(once, model) == once and once.tree_order == "dfs"
    key = once.cache_options("cpu")
    assert key == once.replace(tree_order="bfs", kv_sinks=2).cache_options("cpu")  # same pooled engine
    assert key.compile_mode is None and once.cache_options("cuda").compile_mode == "reduce-overhead"
    with pytest.raises(DynaTreeError, match="resolve"):
        given.cache_options("cpu")


def test_default_generate_is_exact(model) -> None:
    ids = torch.randint(2, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    no_eos = StoppingConfig(eos_token_id=())
    out = dynatree.generate(model, model, ids, max_new_tokens=12, stopping=no_eos, text=False)
    ref = dynatree.generate(model, None, ids, "autoregressive", options=EngineOptions(engine="hf"), max_new_tokens=12,
                            stopping=no_eos)
    assert torch.equal(out.sequences, ref.sequences)


class _Tok:
    """Token ids are characters (mod the tiny vocabulary), enough for the CLI's encode/decode."""

    def __call__(self, text: str, return_tensors: str = "pt"):
        class Out:
            input_ids = torch.tensor([[2 + ord(c) % 90 for c in text]])

        return Out()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(65 + int(i) % 26) for i in ids)


def test_cli_compare_prints_both_speeds(model, monkeypatch) -> None:
    from typer.testing import CliRunner

    from dynatree.loading import models
    from dynatree.cli import app

    monkeypatch.setattr(models, "load_model", lambda *a, **k: (model, _Tok()))
    monkeypatch.setattr(models, "resolve_draft", lambda *a, **k: model)
    result = CliRunner().invoke(app, ["generate", "--prompt", "hello", "--max-new-tokens", "6", "--compare",
                                      "-o", "max_nodes=2"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("[compare]"))
    assert "dynatree" in line and "autoregressive" in line and "x speedup" in line and "same output" in line
    assert "hf engine" in line  # a tiny model: auto keeps the eager engine
