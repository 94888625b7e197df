"""Damaged model files and racing conversions: a truncated or garbled distilled draft is one line
that names the file and how to get it back; a damaged cached copy of a GGUF model is converted
again by itself; two processes converting the same GGUF file at once both succeed, with one whole
cache between them.

Everything runs on tiny models: a distilled draft saved from a tiny Llama, and the tiny GGUF file
of ``test_models`` (a real GGUF, converted by the real converter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dynatree.drafts import checkpoint
from dynatree.drafts import distilled as R
from dynatree.loading import gguf, models
from dynatree.cli import app
from dynatree.errors import DynaTreeError
from cli_helpers import SRC, error_lines, save_model
from test_models import needs_gguf, write_tiny_llama_gguf
from tiny import tiny_model
from tiny_tok import VOCAB


# --------------------------------------------------------------------------- distilled drafts


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("target"), tiny_model("llama", 0, vocab=VOCAB))


def save_tiny_draft(target: torch.nn.Module, folder: Path) -> Path:
    cfg = R.DraftConfig.from_target(target, name="tiny", layers=1, vocab_subset=list(range(2, 60)))
    draft = R.DistilledDraft(cfg, target.get_input_embeddings())
    draft.init_from_target(target)
    return R.save_draft(draft.eval(), folder)


def truncate(path: Path) -> None:
    """Cut ``path`` to half its size, as a new file: a model loaded from it may still map the old
    one (safetensors are memory-mapped), and shrinking a mapped file under it is a bus error."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 2])


def garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:8] = b"\xff" * 8  # the header length: now far past the end of the file
    path.write_bytes(bytes(data))


def wrong_shapes(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    name = next(k for k in state if k.endswith("head.weight"))
    state[name] = state[name][:-1]  # one row short
    save_file(state, str(path))


def garble_config(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


DAMAGE = {
    "truncated weights": (R.WEIGHTS_FILE, truncate, "cannot read the draft weights {file} (Error while deserializing "
                                                    "header"),
    "garbled header": (R.WEIGHTS_FILE, garble_header, "cannot read the draft weights {file} (Error while "
                                                      "deserializing header"),
    "wrong shapes": (R.WEIGHTS_FILE, wrong_shapes, "{file} holds tensors whose shapes do not match its config"),
    "cut config": (R.CONFIG_FILE, garble_config, "{file} is not a valid draft config"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_draft_is_one_line_naming_the_file_and_the_fix(target_dir: Path, tmp_path: Path,
                                                                 damage: str) -> None:
    target, _ = models.load_model(str(target_dir))
    folder = save_tiny_draft(target, tmp_path / "draft")
    checkpoint.load_distilled_draft(target, folder)  # intact, it loads
    name, harm, expected = DAMAGE[damage]
    harm(folder / name)
    with pytest.raises(DynaTreeError) as info:
        checkpoint.load_distilled_draft(target, folder)
    message = str(info.value)
    assert "\n" not in message
    assert expected.format(file=folder / name) in message
    assert message.endswith(f"distil the draft again (dynatree distill) or copy {folder} again")


def test_a_damaged_shipped_draft_says_reinstall(target_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft inside the installed package comes back with the package, so the fix is a reinstall."""
    target, _ = models.load_model(str(target_dir))
    package = tmp_path / "site-packages" / "dynatree"
    folder = save_tiny_draft(target, package / "assets" / "drafts" / "tiny")
    truncate(folder / R.WEIGHTS_FILE)
    monkeypatch.setattr(checkpoint, "resources", types.SimpleNamespace(files=lambda name: package))
    with pytest.raises(DynaTreeError) as info:
        checkpoint.load_distilled_draft(target, folder)
    assert str(info.value).endswith("the file is truncated or damaged; reinstall dynatree "
                                    "(pip install --force-reinstall --no-deps dynatree)")


def test_cli_with_a_damaged_draft_preset(target_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``dynatree generate`` prints when the preset draft's weights are cut short."""
    target, _ = models.load_model(str(target_dir))
    folder = save_tiny_draft(target, tmp_path / "draft")
    truncate(folder / R.WEIGHTS_FILE)
    monkeypatch.setitem(models.SHIPPED_DRAFTS, "tiny-distilled", str(folder))
    res = CliRunner().invoke(app, ["generate", "--target", str(target_dir), "--draft", "tiny-distilled",
                                   "--prompt", "the fox", "--max-new-tokens", "4"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert error_lines(res.stderr) == [
        f"error: cannot read the draft weights {folder / R.WEIGHTS_FILE} (Error while deserializing header: "
        "incomplete metadata, file not fully covered): the file is truncated or damaged; distil the draft "
        f"again (dynatree distill) or copy {folder} again"]


# ------------------------------------------------------------------------- the GGUF model cache


def break_weights(cached: Path) -> None:
    truncate(cached / "model.safetensors")


def break_tokenizer(cached: Path) -> None:
    (cached / "tokenizer.json").write_text('{"version": "1.0", "truncated', encoding="utf-8")


def lose_config(cached: Path) -> None:
    (cached / "config.json").unlink()


@needs_gguf
@pytest.mark.parametrize("harm", [break_weights, break_tokenizer, lose_config])
def test_a_damaged_cached_copy_is_converted_again(tmp_path: Path, capsys: pytest.CaptureFixture[str], harm) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    cache = tmp_path / "cache"
    model, tokenizer = models.load_gguf(path, cache_root=cache)
    cached = gguf.gguf_cache_path(path, cache)
    harm(cached)
    capsys.readouterr()

    again, tokenizer_again = models.load_gguf(path, cache_root=cache)
    notice = capsys.readouterr().err
    assert f"dynatree: the cached copy of tiny.gguf in {cached} cannot be loaded (" in notice
    assert "converting it again" in notice
    ids = tokenizer("the cat in a hat", return_tensors="pt").input_ids
    assert ids.tolist() == tokenizer_again("the cat in a hat", return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    models.load_gguf(path, cache_root=cache)  # the new copy is whole: no third conversion
    assert "converting" not in capsys.readouterr().err
    assert [p.name for p in cache.joinpath("models").iterdir()] == [cached.name]  # the damaged copy is gone


@needs_gguf
def test_cli_generate_repairs_a_damaged_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    monkeypatch.setenv("DYNATREE_CACHE", str(tmp_path / "cache"))
    argv = ["generate", "--target", str(path), "--strategy", "autoregressive", "--prompt", "the cat",
            "--max-new-tokens", "6"]
    first = CliRunner().invoke(app, argv)
    assert first.exit_code == 0, first.output
    break_weights(gguf.gguf_cache_path(path))
    second = CliRunner().invoke(app, argv)
    assert second.exit_code == 0, second.output
    assert "converting it again" in second.stderr and "Traceback" not in second.output
    assert second.stdout == first.stdout  # the same text as before the damage


# A child process: wait until every racer is ready (a barrier on files, so the conversions start
# together however the machine schedules the processes), then load the GGUF model through the cache
# and print a digest of its logits. The converter is wrapped only to log each conversion.
RACER = textwrap.dedent("""
    import hashlib, os, sys, time
    from pathlib import Path
    import torch
    from dynatree.loading import gguf, models

    gguf_file, cache, log, me, racers, locked = sys.argv[1:7]
    real = gguf._convert_gguf
    def logged(*args):
        with open(log, "a") as fh:
            fh.write(f"{me}\\n")
        real(*args)
    gguf._convert_gguf = logged
    if locked == "0":  # as on a file system without locks: only the atomic rename protects the cache
        import contextlib
        gguf._conversion_lock = lambda destination: contextlib.nullcontext()
    Path(cache, f"ready-{me}").parent.mkdir(parents=True, exist_ok=True)
    Path(cache, f"ready-{me}").touch()
    deadline = time.monotonic() + 600  # only a guard against a hung sibling
    while len(list(Path(cache).glob("ready-*"))) < int(racers):
        assert time.monotonic() < deadline, "the other racer never started"
        time.sleep(0.01)
    model, tok = models.load_gguf(Path(gguf_file), cache_root=Path(cache))
    with torch.no_grad():
        logits = model(tok("the cat in a hat", return_tensors="pt").input_ids).logits
    print(hashlib.sha256(logits.numpy().tobytes()).hexdigest())
""")


@needs_gguf
@pytest.mark.slow
@pytest.mark.parametrize("locked", [True, False], ids=["locked", "no-lock-support"])
def test_two_processes_converting_at_once_both_succeed(tmp_path: Path, locked: bool) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path)
    cache, log = tmp_path / "cache", tmp_path / "conversions.log"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(cache), str(log), str(i), "2",
                                "1" if locked else "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
              for i in range(2)]
    results = [racer.communicate(timeout=900) for racer in racers]
    for racer, (out, err) in zip(racers, results):
        assert racer.returncode == 0, err
    digests = {out.strip() for out, _ in results}
    assert len(digests) == 1  # both loaded the same model

    conversions = log.read_text().split()
    if locked:
        assert len(conversions) == 1  # the other process waited and used that copy
    else:
        assert 1 <= len(conversions) <= 2  # maybe both converted; one rename won, the other gave way
    cached = gguf.gguf_cache_path(path, cache)
    assert list(cached.parent.iterdir()) == [cached]  # no staging folder left behind
    config = json.loads((cached / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and "quantization_config" not in config
    model, tok = models.load_gguf(path, cache_root=cache)  # the cache is whole: it loads without converting
    assert log.read_text().split() == conversions
