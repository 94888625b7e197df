"""Ctrl-C during `dynatree bench` leaves valid rows on disk; rerunning the same command finishes
the rest without duplicates. Runs the real CLI in a subprocess on tiny models saved to disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tiny import perturbed, tiny_model

VOCAB = 300


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20,
                            trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="dog")
    target = tiny_model("llama", 0, vocab=VOCAB)
    for name, model in (("target", target), ("draft", perturbed(target))):
        model.save_pretrained(root / name)
        fast.save_pretrained(root / name)
    prompts = root / "prompts.txt"
    prompts.write_text("\n\n".join(f"the quick brown fox number {i} jumps over" for i in range(6)))
    return root / "target", root / "draft", prompts


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_ctrl_c_keeps_completed_rows_and_rerun_continues(saved_pair, tmp_path: Path) -> None:
    target, draft, prompts = saved_pair
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "dynatree", "bench", "--target", str(target), "--draft", str(draft),
           "--strategies", "autoregressive,linear:k=3,dynatree", "--dataset", str(prompts),
           "--num-prompts", "3", "--max-prompt-tokens", "16", "--max-new-tokens", "400", "--warmup", "0",
           "--no-progress", "--threads", "1", "--output", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # (SIGINT set back to its default in the child: a suite run in the background inherits it ignored)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Wait for two rows however slow the machine is (the bound only stops a hung run); each row
    # generates 400 tokens, so the run is still going when the signal lands, busy machine or not.
    deadline = time.time() + 900
    while not out.exists() or len(out.read_text().splitlines()) < 2:
        assert proc.poll() is None, f"bench ended before it was interrupted:\n{proc.communicate()[0]}"
        assert time.time() < deadline, "no two rows within 15 minutes: the bench is hung"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 130, output
    assert "rerun the same command to continue" in output
    first = rows(out)  # every line on disk parses: nothing half-written
    assert 2 <= len(first) < 9

    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    final = rows(out)
    keys = [(r["label"], r["prompt_id"]) for r in final]
    assert len(final) == 9 and len(set(keys)) == 9
    assert final[: len(first)] == first  # completed rows were kept, not redone
