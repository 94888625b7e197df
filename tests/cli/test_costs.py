"""``dynatree random-model`` and ``dynatree costs``: a model of a given shape with random weights,
written as a folder that ``--target`` takes, and its costs as the defaults would read them."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from dynatree.bench import shapes
from dynatree.cli.main import app
from dynatree.core import costmodel
from dynatree.errors import DynaTreeError
from tiny_tok import VOCAB, tiny_tokenizer

TINY_SHAPE = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB + 8, "tie_word_embeddings": True}


def test_named_shapes_are_the_published_models_sizes() -> None:
    """Parameter counts of the shapes against the models' published sizes (a wrong field shows)."""
    want = {"qwen2.5-0.5b": 0.49e9, "qwen2.5-1.5b": 1.54e9, "llama-3.2-1b": 1.24e9, "llama-3.1-8b": 8.03e9}
    for name, params in want.items():
        c = shapes.shape_config(name)
        h, i, n, v = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
        kv = h // c.num_attention_heads * c.num_key_value_heads
        count = n * (2 * h * h + 2 * h * kv + 3 * h * i) + v * h * (1 if c.tie_word_embeddings else 2)
        assert abs(count - params) / params < 0.02, (name, count)


def test_unknown_shapes_and_bad_configs_are_refused(tmp_path) -> None:
    with pytest.raises(DynaTreeError, match="unknown shape 'qwen-9000'"):
        shapes.shape_config("qwen-9000")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(DynaTreeError, match="model_type"):
        shapes.shape_config(bad)
    with pytest.raises(DynaTreeError, match="no such config file"):
        shapes.shape_config(tmp_path / "missing.json")


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path) -> None:
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**TINY_SHAPE, "vocab_size": 16}))
    with pytest.raises(DynaTreeError, match="more than the shape's vocabulary"):
        shapes.save_random_model(small, tmp_path / "m", tiny_tokenizer())


def test_random_model_then_costs_from_the_folder(tmp_path, monkeypatch) -> None:
    """The folder loads as a target; ``costs`` measures its plan and curve (once: the second call
    reads the cache) and prints the budget the defaults would take."""
    monkeypatch.setenv(costmodel.ENV_SWITCH, "measure")
    monkeypatch.setenv(costmodel.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv("DYNATREE_LINEAR_PLAN", raising=False)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_SHAPE))
    folder = tmp_path / "shaped"
    monkeypatch.setattr("dynatree.loading.models.load_tokenizer", lambda name: tiny_tokenizer())
    made = CliRunner().invoke(app, ["random-model", str(folder), "--like", str(config)])
    assert made.exit_code == 0, made.output
    assert "random weights" in made.output and (folder / "config.json").is_file()
    from dynatree.loading.models import load_model

    model, _ = load_model(str(folder))
    assert model.config.hidden_size == 64 and model.config.vocab_size == VOCAB + 8
    first = CliRunner().invoke(app, ["costs", "--target", str(folder), "--draft", str(folder)])
    assert first.exit_code == 0, first.output
    assert "| rows verified | ms |" in first.output and "tree budget (DynaTree, DySpec):" in first.output
    assert "draft model: a call costs" in first.output
    profiles = list((tmp_path / "cache" / "costmodel").glob("*.json"))
    assert len(profiles) == 2  # the target's and the draft's
    stamps = [p.stat().st_mtime_ns for p in profiles]
    again = CliRunner().invoke(app, ["costs", "--target", str(folder)])
    assert again.exit_code == 0 and [p.stat().st_mtime_ns for p in profiles] == stamps  # read, not re-measured
    target_profile = next(p for p in profiles if '"role"' not in p.read_text())
    fresh = CliRunner().invoke(app, ["costs", "--target", str(folder), "--fresh"])
    assert fresh.exit_code == 0 and target_profile.stat().st_mtime_ns != stamps[profiles.index(target_profile)]


def test_costs_refuses_when_the_cost_model_is_off(model_dirs, monkeypatch) -> None:
    monkeypatch.setenv(costmodel.ENV_SWITCH, "off")
    out = CliRunner().invoke(app, ["costs", "--target", model_dirs[0]])
    assert out.exit_code == 2 and "DYNATREE_COST_MODEL=off" in out.output
