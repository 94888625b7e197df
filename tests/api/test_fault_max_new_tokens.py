"""A ``max_new_tokens`` far past the model's positions (10**9) is one line that says what fits,
raised before anything is printed, compiled or allocated for the run: the compiled static engine
sizes its cache by prompt + new tokens, so a late check meant an allocation of gigabytes first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import dynatree
from dynatree import DynaTreeError
from dynatree.loop import precompile as precompile_mod
from dynatree.runtime import engines
from dynatree.bench import runner as runner_mod
from dynatree.cli import app
from cli_helpers import error_lines
from tiny import tiny_model


HUGE = 10**9
NO_EOS = dynatree.StoppingConfig(eos_token_id=())


def test_generate_refuses_a_run_past_the_positions_and_says_what_fits() -> None:
    target, draft = tiny_model("llama", 0, max_positions=64), tiny_model("llama", 1, max_positions=64)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(DynaTreeError) as info:
        dynatree.generate(target, draft, ids, "linear", k=4, max_new_tokens=HUGE, text=False)
    assert str(info.value) == (
        f"prompt (3) + max_new_tokens ({HUGE}) + tree depth (4) = {HUGE + 7} positions exceeds LlamaForCausalLM's "
        f"maximum of 64 by {HUGE + 7 - 64}; max_new_tokens (--max-new-tokens) can be at most 57 here, or pass "
        "options=EngineOptions(kv_window=N) (--kv-window) for StreamingLLM-style KV eviction")
    out = dynatree.generate(target, draft, ids, "linear", k=4, max_new_tokens=57, stopping=NO_EOS, text=False)
    assert out.stats.new_tokens == 57  # the number the message gives does fit
    with pytest.raises(DynaTreeError, match="can be at most 59 here"):  # truncating keeps 1 prompt token
        dynatree.generate(target, draft, ids, "linear", k=4, max_new_tokens=HUGE, truncate_prompt=True, text=False)


def test_precompile_never_sizes_a_cache_past_the_positions() -> None:
    target = tiny_model("llama", 0, max_positions=64)
    precompile_mod.precompile(target, None, HUGE, compile=False)  # would allocate HUGE cache rows
    (kv,) = engines.DEFAULT_POOL.entries(target).values()
    assert kv.capacity <= 2 * (256 + kv.buckets[-1])


def test_cli_generate_refuses_before_printing_or_compiling(model_dirs, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(precompile_mod, "precompile", lambda *args, **kwargs: calls.append(1))
    for extra in ([], ["--engine", "static", "--compile"]):
        res = CliRunner().invoke(app, ["generate", "--target", model_dirs[0], "--draft", model_dirs[1],
                                       "--prompt", "the fox", "--max-new-tokens", str(HUGE), *extra])
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
        assert error_lines(res.stderr) == [
            # depth 32: the text's proposals (--text, the default) reach deeper than the policy's 9
            f"error: prompt (3) + max_new_tokens ({HUGE}) + tree depth (32) = {HUGE + 35} positions exceeds "
            f"LlamaForCausalLM's maximum of 1024 by {HUGE + 35 - 1024}; max_new_tokens (--max-new-tokens) can be at "
            "most 989 here, or pass options=EngineOptions(kv_window=N) (--kv-window) for StreamingLLM-style KV eviction"]
        assert res.stdout == ""  # not even the prompt: the run never started
    assert calls == []  # nothing compiled (nor a cache allocated) for it


def test_cli_bench_refuses_before_compiling_or_running(model_dirs, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(runner_mod, "precompile", lambda *args, **kwargs: calls.append("precompile"))
    monkeypatch.setattr(runner_mod, "generate", lambda *args, **kwargs: calls.append("generate"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the quick fox\n\nthe lazy dog\n")
    res = CliRunner().invoke(app, ["bench", "--target", model_dirs[0], "--draft", model_dirs[1], "--dataset",
                                   str(prompts), "--num-prompts", "2", "--max-new-tokens", str(HUGE),
                                   "--strategies", "autoregressive,linear:k=3:engine=static:compile=true",
                                   "--output", str(tmp_path / "r.jsonl"), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    [line] = error_lines(res.stderr)
    assert f"max_new_tokens ({HUGE}) + tree depth (0)" in line and "can be at most" in line
    assert calls == []


@pytest.mark.parametrize("strategy,options", [("linear", {"k": 2}), ("dynatree", {})])
def test_the_early_check_counts_what_generate_counts_for_the_text_source(strategy: str, options: dict) -> None:
    """draft=None drafts from the text itself, whose own tree depth counts towards the positions:
    the check run before any work raises the very error generate raises, and passes what it runs."""
    from dynatree.loop.generate import check_positions
    from dynatree.policies import make_policy

    target = tiny_model("llama", 0, max_positions=64)
    ids = torch.tensor([[5, 6, 7]])
    for new in (8, 20, 40, 60):
        try:
            dynatree.generate(target, None, ids, strategy, max_new_tokens=new, stopping=NO_EOS, **options)
            ran = None
        except DynaTreeError as err:
            ran = str(err)
        try:
            check_positions(3, new, make_policy(strategy, **options), target, None)
            checked = None
        except DynaTreeError as err:
            checked = str(err)
        assert checked == ran
