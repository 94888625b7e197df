"""``dynatree bench`` with ``text_cache``: one cross-request suffix cache per spec, across the prompts
of a run, in prompt order (dynatree.bench.runner's docstring).

Two prompts with the same tokens under different ids make the cache visible: the second one's
output is the first one's (greedy), so a text source that sees the first prompt's run drafts the
whole answer in one round, and one that does not needs many. Every row is checked against the
autoregressive output as usual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from dynatree.bench.runner import BenchSettings, Prompt, run_bench
from dynatree.bench.specs import parse_strategies
from dynatree.bench.store import ResultsWriter, load_results
from dynatree.catalog import BENCH_CACHE_TOKENS
from dynatree.cli import app
from dynatree.errors import DynaTreeError

T = 16
SPECS = "dynatree:source=text@plain,dynatree:source=text:text_cache=true@cached"


@pytest.fixture(scope="module")
def twins() -> list[Prompt]:
    """Two prompts with the same tokens (a request asked twice), then a third, different one."""
    g = torch.Generator().manual_seed(0)
    block = tuple(torch.randint(2, 96, (10,), generator=g).tolist())
    other = tuple(torch.randint(2, 96, (10,), generator=g).tolist())
    return [Prompt("a", block), Prompt("b", block), Prompt("c", other)]


def settings(**over: Any) -> BenchSettings:
    base = dict(target="tiny-llama", draft="tiny-llama-perturbed", dataset="random", max_new_tokens=T,
                eos_token_id=())
    base.update(over)
    return BenchSettings(**base)


def by(rows: list[dict], label: str) -> dict[str, dict]:
    return {r["prompt_id"]: r for r in rows if r["label"] == label}


def test_a_cached_spec_drafts_from_the_earlier_prompts_and_equals_autoregressive(llama_pair, twins) -> None:
    specs = parse_strategies(SPECS + ",dynatree:source=hybrid:text_cache=64@hybrid-cached,"
                             "dynatree:source=hybrid@hybrid")
    out = run_bench(*llama_pair, twins, specs, settings(), warmup=0, progress=False)
    assert out.mismatches == [] and len(out.rows) == 15
    assert all(r["greedy_match"] for r in out.rows if not r["reference"])
    plain, cached = by(out.rows, "plain"), by(out.rows, "cached")
    hybrid, hybrid_cached = by(out.rows, "hybrid"), by(out.rows, "hybrid-cached")
    # 'a' runs first: nothing in the cache yet, the same trees as without one
    assert cached["a"]["text_cache"] == {"max_tokens": BENCH_CACHE_TOKENS, "tokens": 0, "sequences": 0}
    assert [r["committed"] for r in cached["a"]["per_round"]] == [r["committed"] for r in plain["a"]["per_round"]]
    # 'b' finds 'a' (its prompt and output) in the cache: its whole answer is drafted at once
    assert cached["b"]["text_cache"] == {"max_tokens": BENCH_CACHE_TOKENS, "tokens": 10 + T, "sequences": 1}
    assert plain["b"]["stats"]["rounds"] > 2 and cached["b"]["stats"]["rounds"] <= 2
    assert hybrid_cached["b"]["stats"]["rounds"] < hybrid["b"]["stats"]["rounds"]
    # the hybrid cache's bound (64 tokens) keeps the last two finished prompts: 'a' is evicted for 'c'
    assert hybrid_cached["c"]["text_cache"] == {"max_tokens": 64, "tokens": 2 * (10 + T), "sequences": 2}
    assert "text_cache" not in plain["b"] and "text_cache" not in out.rows[0]
    for r in out.rows:  # the cached rows' outputs are the autoregressive ones, token for token
        assert r["output_ids"] == by(out.rows, "autoregressive")[r["prompt_id"]]["output_ids"]


def test_a_prompt_never_finds_its_own_answer_from_the_warm_up(llama_pair, twins) -> None:
    """The warm-up runs the first prompts (here 'a' and 'b', whole length) before they are timed:
    they draft against a scratch cache, so the timed 'a' still starts from an empty one and 'b'
    sees only 'a' (not its own warm-up run)."""
    out = run_bench(*llama_pair, twins[:2], parse_strategies(SPECS), settings(), warmup=2, warmup_tokens=T,
                    progress=False)
    assert out.mismatches == []
    plain, cached = by(out.rows, "plain"), by(out.rows, "cached")
    assert cached["a"]["text_cache"]["tokens"] == 0
    assert cached["a"]["stats"]["rounds"] == plain["a"]["stats"]["rounds"] > 2
    assert cached["b"]["text_cache"] == {"max_tokens": BENCH_CACHE_TOKENS, "tokens": 10 + T, "sequences": 1}


def test_a_resumed_run_rebuilds_the_cache_from_the_stored_rows(llama_pair, twins, tmp_path: Path) -> None:
    """Interrupted after prompt 'a', the rerun measures 'b' after replaying 'a''s stored output into
    the cache: the same cache, the same row as an uninterrupted run (bar the timings)."""
    specs = parse_strategies(SPECS)
    whole = run_bench(*llama_pair, twins[:2], specs, settings(), warmup=0, progress=False)

    class Crash(Exception):
        pass

    def crash_after_a(row: dict) -> None:
        if row["prompt_id"] == "a" and row["label"] == "cached":
            raise Crash

    path = tmp_path / "r.jsonl"
    with pytest.raises(Crash), ResultsWriter(path) as w:
        run_bench(*llama_pair, twins[:2], specs, settings(), writer=w, warmup=0, on_row=crash_after_a, progress=False)
    assert len(load_results(path).rows) == 3
    with ResultsWriter(path) as w:
        again = run_bench(*llama_pair, twins[:2], specs, settings(), writer=w, warmup=1, progress=False)
    assert again.resumed_rows == 3 and again.new_rows == 3 and again.mismatches == []
    assert [r["key"] for r in again.rows] == [r["key"] for r in whole.rows]
    resumed, fresh = by(again.rows, "cached")["b"], by(whole.rows, "cached")["b"]
    assert resumed["text_cache"] == fresh["text_cache"] == {"max_tokens": BENCH_CACHE_TOKENS, "tokens": 10 + T,
                                                            "sequences": 1}
    assert resumed["stats"]["rounds"] == fresh["stats"]["rounds"] <= 2
    assert resumed["output_ids"] == fresh["output_ids"]


def test_a_cached_row_has_its_own_key_which_names_the_prompts_before_it(llama_pair, twins) -> None:
    plain, cached, bound, off = parse_strategies(
        SPECS + f",dynatree:source=text:text_cache={BENCH_CACHE_TOKENS}@bound,"
                "dynatree:source=text:text_cache=false@off")[1:]
    assert cached.config["text_cache"] == BENCH_CACHE_TOKENS and "text_cache" not in plain.config
    assert cached.text_cache == bound.config["text_cache"] == BENCH_CACHE_TOKENS  # true is the default bound
    assert cached.config == bound.config  # so the two spellings share their rows' keys
    assert off.text_cache is None and off.config == plain.config  # false: no cache, the plain row's config
    forward = run_bench(*llama_pair, twins[:2], parse_strategies(SPECS), settings(), warmup=0, progress=False)
    backward = run_bench(*llama_pair, twins[1::-1], parse_strategies(SPECS), settings(), warmup=0, progress=False)
    keys = {(r["label"], r["prompt_id"]): r["key"] for r in forward.rows}
    keys_back = {(r["label"], r["prompt_id"]): r["key"] for r in backward.rows}
    assert keys[("plain", "a")] != keys[("cached", "a")]  # cached and uncached rows never collide
    assert keys[("plain", "b")] != keys[("cached", "b")]
    # uncached rows do not depend on the order; a cached one does ('a' first vs 'a' after 'b')
    assert keys[("plain", "a")] == keys_back[("plain", "a")] and keys[("autoregressive", "b")] == \
        keys_back[("autoregressive", "b")]
    assert keys[("cached", "a")] != keys_back[("cached", "a")]
    assert keys[("cached", "b")] != keys_back[("cached", "b")]


def test_text_cache_is_validated_before_anything_runs(tmp_path: Path, monkeypatch) -> None:
    for bad, message in (("dynatree:source=model:text_cache=8", "source=model drafts from the model alone"),
                         ("autoregressive:text_cache=true", "drafts nothing"),
                         ("hf-prompt-lookup:text_cache=true", "takes no"),
                         ("dynatree:source=text:text_cache=0", "text_cache must be true, false or a token count"),
                         ("dynatree:source=text:text_cache=big", "text_cache must be true, false or a token count")):
        with pytest.raises(DynaTreeError, match=message):
            parse_strategies(bad)
    assert parse_strategies("dynatree:source=model:text_cache=false")[1].text_cache is None
    implied, given = parse_strategies("dynatree:text_cache=true,dynatree:source=hybrid:text_cache=true@h")[1:]
    assert implied.source == given.source == "hybrid" and implied.config == given.config  # one row key
    assert implied.without_model().source == "text"  # no draft model: the text alone, with its cache
    from dynatree.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    res = CliRunner().invoke(app, ["bench", "--strategies", "linear:source=model:text_cache=true", "--output",
                                   str(tmp_path / "r.jsonl")])
    assert res.exit_code == 2 and "source=model drafts from the model alone" in res.output, res.output


def test_the_greedy_check_still_catches_a_cached_row_that_differs(llama_pair, twins, monkeypatch) -> None:
    from dynatree.bench import runner as runner_mod

    real = runner_mod.run_engine

    def broken_cache(target, draft, prompt, spec, s, max_new_tokens, **kw):  # off by one with a cache only
        m = real(target, draft, prompt, spec, s, max_new_tokens, **kw)
        if spec.text_cache is None:
            return m
        return runner_mod.Measurement([*m.output_ids[:3], m.output_ids[3] ^ 1, *m.output_ids[4:]], m.stats,
                                      m.per_round)

    monkeypatch.setattr(runner_mod, "run_engine", broken_cache)
    out = run_bench(*llama_pair, twins[:2], parse_strategies(SPECS), settings(), warmup=0, progress=False)
    assert {(r["label"], r["prompt_id"], r["first_mismatch"]) for r in out.mismatches} == {
        ("cached", "a", 3), ("cached", "b", 3)}
