"""``dynatree bench --batch-size``: batches by task, every spec on the same batch, rows that differ
from our batched autoregressive output counted (a broken variant shows up there), and bad settings
refused in one line before a model loads."""

from __future__ import annotations

from pathlib import Path

import json
import pytest
import torch
from typer.testing import CliRunner

from dynatree import DynaTreeError
from dynatree.bench import batches as B
from dynatree.bench.runner import Prompt
from dynatree.bench.specs import parse_strategies
from dynatree.cli import app
from dynatree.options import EngineOptions
from cli_helpers import error_lines
from tiny import perturbed, tiny_model


def sb(q: int, task: str, n: int, turn: int = 1) -> Prompt:
    return Prompt(id=f"spec-bench:{q}:cat:t{turn}:{task}", ids=tuple(range(3, 3 + n)))


def test_parse_sizes() -> None:
    assert B.parse_sizes("1,4, 16") == [1, 4, 16]
    for bad in ("0", "4,x", "", "-2"):
        with pytest.raises(DynaTreeError, match="--batch-size takes positive integers"):
            B.parse_sizes(bad)


def test_batches_hold_one_task_each_left_padded_and_drop_later_turns_and_short_groups() -> None:
    prompts = [sb(1, "qa", 3), sb(2, "qa", 5), sb(3, "qa", 2), sb(4, "rag", 4), sb(4, "rag", 7, turn=2),
               sb(5, "rag", 1)]
    out = B.batches(prompts, 2, pad_token_id=0)
    assert [(b.task, [p.id for p in b.prompts]) for b in out] == [
        ("qa", [prompts[0].id, prompts[1].id]), ("rag", [prompts[3].id, prompts[5].id])]
    qa = out[0]
    assert qa.ids.tolist() == [[0, 0, 3, 4, 5], [3, 4, 5, 6, 7]]
    assert qa.mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert B.task_of(Prompt(id="instruct:0:3:code", ids=(1,))) == "code"
    assert B.task_of(Prompt(id="pydoc:0:3", ids=(1,))) == "pydoc"
    with pytest.raises(DynaTreeError, match="no task has 3 prompts"):
        B.batches(prompts[3:], 3, pad_token_id=0)


def test_hf_decoders_that_refuse_batches_are_skipped_with_a_note() -> None:
    specs = parse_strategies("autoregressive,dynatree,hf-generate,hf-prompt-lookup,hf-assisted,"
                             "dynatree:source=text:text_cache=true@cached")
    keep, notes = B.check_specs(specs)
    assert [s.label for s in keep] == ["autoregressive", "dynatree", "hf-generate"]
    assert len(notes) == 3 and all("skipped" in n for n in notes)


def test_generated_counts_up_to_the_first_pad_and_differs_counts_rows() -> None:
    new = torch.tensor([[5, 6, 0, 0], [5, 6, 7, 8]])
    assert B.generated(new, 0) == 3 + 4
    other = new.clone()
    assert B.differs(new, other) == 0
    other[1, 3] = 9
    assert B.differs(new, other) == 1
    assert B.differs(new[:, :3], other) == 0  # only the tokens both hold


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model("llama", 0)
    return target, perturbed(target)


def _prompts() -> list[Prompt]:
    g = torch.Generator().manual_seed(0)
    return [Prompt(id=f"spec-bench:{i}:c:t1:{task}", ids=tuple(torch.randint(3, 60, (n,), generator=g).tolist()))
            for i, (task, n) in enumerate([("qa", 5), ("qa", 9), ("rag", 4), ("rag", 7)])]


def test_every_spec_runs_on_every_batch_and_reproduces_the_batched_autoregressive_output(pair, tmp_path) -> None:
    target, draft = pair
    specs = parse_strategies("autoregressive,dynatree,dynatree:source=text@text,dynatree:source=hybrid@hybrid,"
                             "hf-generate")
    out = tmp_path / "b.jsonl"
    rows = B.run_batches(target, draft, _prompts(), specs, [1, 2], max_new_tokens=6, pad_token_id=0,
                         options=EngineOptions(), output=out, meta={"m": 1}, progress=lambda line: None)
    assert len(rows) == (4 + 2) * 5 == len(out.read_text().splitlines())
    assert {r["mismatched_rows"] for r in rows} == {0}
    assert all(r["new_tokens"] > 0 and r["m"] == 1 for r in rows)
    assert {r["speedup_vs_hf"] for r in rows if r["label"] == "hf-generate"} == {1.0}
    assert {r["speedup_vs_ar"] for r in rows if r["label"] == "autoregressive"} == {1.0}
    table = B.tables(json.loads(line) for line in out.read_text().splitlines())
    assert "**B = 1**" in table and "**B = 2**" in table and "| hybrid |" in table


def test_a_broken_variant_shows_as_mismatched_rows(pair, tmp_path, monkeypatch) -> None:
    target, draft = pair
    real = B.run_one

    def broken(target, draft, spec, batch, *args):  # the text variant's second row drifts by one token
        new, sec, extra = real(target, draft, spec, batch, *args)
        if spec.label == "text" and new.shape[0] > 1:
            new = new.clone()
            new[1, -1] += 1
        return new, sec, extra

    monkeypatch.setattr(B, "run_one", broken)
    rows = B.run_batches(target, draft, _prompts(), parse_strategies("autoregressive,dynatree:source=text@text"),
                         [2], max_new_tokens=4, pad_token_id=0, options=EngineOptions(), output=tmp_path / "b.jsonl",
                         meta={}, progress=lambda line: None)
    assert [r["mismatched_rows"] for r in rows if r["label"] == "text"] == [1, 1]


def test_repetitions_interleave_rotate_and_take_the_median() -> None:
    specs = parse_strategies("autoregressive,dynatree:source=text@text,hf-generate")
    order, times = [], iter([5.0, 2.0, 9.0, 4.0, 1.0, 8.0, 6.0, 3.0, 7.0])

    def run(spec):
        order.append(spec.label)
        return torch.zeros(1, 1), next(times), {}

    runs = B.interleaved(run, specs, 3)
    assert order == ["autoregressive", "text", "hf-generate", "text", "hf-generate", "autoregressive",
                     "hf-generate", "autoregressive", "text"]
    assert {k: [x for _, x, _ in v] for k, v in runs.items()} == {
        "autoregressive": [5.0, 8.0, 3.0], "text": [2.0, 4.0, 7.0], "hf-generate": [9.0, 1.0, 6.0]}
    assert [B.median_seconds(runs[k]) for k in runs] == [5.0, 4.0, 6.0]
    assert B.median_seconds(runs["text"][:2]) == 3.0


def test_repeated_runs_time_by_the_median_and_check_every_repetition(pair, tmp_path, monkeypatch) -> None:
    target, draft = pair
    real, calls = B.run_one, []

    def scripted(target, draft, spec, batch, *args):  # the text variant drifts in its second repetition only
        new, _, extra = real(target, draft, spec, batch, *args)
        if batch.ids.shape[1] <= 8:  # (a warm-up call)
            return new, 0.0, extra
        calls.append(spec.label)
        mine = calls.count(spec.label)
        if spec.label == "text" and mine == 2:
            new = new.clone()
            new[0, -1] += 1
        return new, {"autoregressive": [4.0, 2.0, 3.0], "text": [1.0, 9.0, 2.0]}[spec.label][mine - 1], extra

    monkeypatch.setattr(B, "run_one", scripted)
    rows = B.run_batches(target, draft, _prompts()[:2], parse_strategies("autoregressive,dynatree:source=text@text"),
                         [2], max_new_tokens=4, pad_token_id=0, options=EngineOptions(), output=tmp_path / "b.jsonl",
                         meta={}, repeats=3, progress=lambda line: None)
    ar, text = rows
    assert (ar["seconds"], text["seconds"], text["seconds_each"], ar["repeats"]) == (3.0, 2.0, [1.0, 9.0, 2.0], 3)
    assert text["speedup_vs_ar"] == 1.5
    assert (ar["mismatched_rows"], text["mismatched_rows"]) == (0, 1)
    with pytest.raises(DynaTreeError, match="repeats must be an integer >= 1"):
        B.run_batches(target, draft, _prompts(), parse_strategies("autoregressive"), [2], max_new_tokens=4,
                      pad_token_id=0, options=EngineOptions(), output=tmp_path / "c.jsonl", meta={}, repeats=0)


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "2", "--repeats", "0"], "error: --repeats must be >= 1, got 0"),
    (["--repeats", "3"], "error: --repeats applies to batched runs (--batch-size); a per-prompt run repeats over its prompts"),
    (["--batch-size", "0"], "error: --batch-size takes positive integers separated by commas, e.g. 4 or 1,4,8,16; got '0'"),
    (["--batch-size", "2", "--temperature", "0.5"], "error: --batch-size runs greedy, on one process: drop --tp and --temperature"),
])
def test_bad_batch_settings_are_refused_before_a_model_loads(argv, message, tmp_path) -> None:
    res = CliRunner().invoke(app, ["bench", "--target", str(tmp_path / "no-such-model"), *argv,
                                   "--output", str(tmp_path / "r.jsonl")])
    assert res.exit_code == 2
    assert error_lines(res.stderr) == [message]


def test_the_cli_prints_the_table_by_batch_size(model_dirs, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("the fox jumps\n\na dog runs far away\n\nthe cat\n\nbirds fly over the hill\n")
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["bench", "--target", model_dirs[0], "--draft", model_dirs[1], "--dataset",
                                   str(prompts), "--num-prompts", "4", "--max-new-tokens", "4", "--batch-size", "2",
                                   "--strategies", "autoregressive,dynatree,hf-generate,hf-assisted",
                                   "--output", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "**B = 2**" in res.stdout and "| dynatree |" in res.stdout
    assert "hf-assisted: skipped" in res.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 3 and {r["task"] for r in rows} == {"p.txt"}


@pytest.mark.parametrize("draft", ["model", "none"])
def test_the_default_batch_line_up_is_what_generate_runs(draft: str, model_dirs, tmp_path: Path) -> None:
    """Without --strategies a batch bench runs what generate does by default (the text alone; with
    a draft model, the draft and the text in one tree) against our batched autoregressive decoding
    and HF's batched generate: not the per-prompt line-up, whose specs draft from the model alone."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the fox jumps\n\na dog runs far away\n")
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(app, ["bench", "--target", model_dirs[0], "--draft",
                                   model_dirs[1] if draft == "model" else "none", "--dataset", str(prompts),
                                   "--num-prompts", "2", "--max-new-tokens", "4", "--batch-size", "2",
                                   "--output", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    labels = [json.loads(line)["label"] for line in out.read_text().splitlines()]
    assert labels == (["autoregressive", "text", "hybrid", "hf-generate"] if draft == "model"
                      else ["autoregressive", "text", "hf-generate"])
