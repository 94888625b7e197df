"""Batches on the ahead-of-time compiled engine (``engine="aot"`` with several prompts): one
package of dynamic batch and row counts runs every call; each row must equal HF's greedy decoding
of its prompt alone, for every strategy and draft kind, with rows of different lengths finishing
at different rounds. Broken variants of the cache (a rejected node's KV left where the accepted one
belongs, a row reading another row's columns) must be caught by the same comparison. The package
is built once for this module (about 30 s on a 2-core CPU) in a temporary folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dynatree
import dynatree.loop.batch as batch_loop
from dynatree import STRATEGIES, DynaTreeError, EngineOptions, StoppingConfig
from dynatree.runtime import aot_batch, aot_engine, engines
from dynatree.runtime.aot_batch import AOTBatchedKV
from dynatree.runtime.batch_cache import BatchedKV
from tiny import SMALL_TREES, VOCAB, hf_greedy, perturbed, tiny_model

LENGTHS = (1, 9, 4)
N = 20


@pytest.fixture(scope="module", autouse=True)
def cache_dir(private_cache_dir: Path) -> Path:
    return private_cache_dir


@pytest.fixture(autouse=True)
def whole_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify cost that does not grow with the rows: every row's whole tree is verified, so the
    checks exercise deep trees and ragged rows (under the CPU's measured costs, the tiny models'
    trees rarely pay and most rounds would be plain)."""
    monkeypatch.setattr(batch_loop, "BATCH_SHARE_COST", {"cpu": {128: ((1, 2), (1.0, 1.0))}})


@pytest.fixture(scope="module")
def llama() -> dict[str, torch.nn.Module]:
    target = tiny_model("llama", 0)
    return {"target": target, "perturbed": perturbed(target)}


def prompts(seed: int, lengths: tuple[int, ...] = LENGTHS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in lengths]


def run(llama, strategy: str, draft: str, rows: list[list[int]], n: int = N, engine: str = "aot", eos=()):
    model = {"perturbed": llama["perturbed"], "text": None, "both": dynatree.TextDraft(model=llama["perturbed"])}[draft]
    return dynatree.generate(llama["target"], model, rows, strategy, max_new_tokens=n,
                             stopping=StoppingConfig(eos_token_id=tuple(eos), pad_token_id=0),
                             options=EngineOptions(engine=engine), text=False, **SMALL_TREES.get(strategy, {}))


def mismatches(llama, strategy: str, draft: str, seed: int = 0, eos=()) -> list[str]:
    """Rows of an aot batch that differ from HF greedy on their prompt alone (empty: exact)."""
    rows = prompts(seed)
    out = run(llama, strategy, draft, rows, eos=eos)
    width, bad = max(map(len, rows)), []
    for b, row in enumerate(rows):
        got = out.sequences[b, width : width + out.stats[b].new_tokens].tolist()
        ref = hf_greedy(llama["target"], torch.tensor([row]), N)[0, len(row):].tolist()
        if eos and eos[0] in ref:
            ref = ref[: ref.index(eos[0]) + 1]
        if got != ref:
            bad.append(f"row {b}: {got} vs {ref}")
    return bad


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_in_a_batch_equals_hf_greedy_row_by_row(llama, strategy: str) -> None:
    for draft in ("perturbed", "text", "both"):
        assert mismatches(llama, strategy, draft) == [], (strategy, draft)


def test_the_batch_runs_on_the_aot_package_and_speculates(llama, monkeypatch) -> None:
    seen: list[tuple[int, int]] = []
    step = AOTBatchedKV._step

    def spy(self, tokens, *args):
        seen.append(tuple(tokens.shape))
        return step(self, tokens, *args)

    monkeypatch.setattr(AOTBatchedKV, "_step", spy)
    monkeypatch.setattr(BatchedKV, "_call", lambda *a, **k: pytest.fail("the eager batch ran"))
    out = run(llama, "dynatree", "perturbed", prompts(1))
    assert any(b == len(LENGTHS) and n > 1 for b, n in seen)  # (a verify of every row's tree)
    assert max(s.mean_committed for s in out.stats) > 1  # (more than one token a round: trees accepted)


def test_rows_finishing_at_different_rounds_leave_the_batch(llama, monkeypatch) -> None:
    """EOS inside accepted paths: rows end at different rounds, the cache keeps the rest."""
    rows = prompts(0)
    eos = hf_greedy(llama["target"], torch.tensor([rows[1]]), N)[0, len(rows[1]) + 3].item()
    kept: list[int] = []
    select = AOTBatchedKV._select

    def spy(self, idx, start, end):
        kept.append(len(idx))
        return select(self, idx, start, end)

    monkeypatch.setattr(AOTBatchedKV, "_select", spy)
    assert mismatches(llama, "dynatree", "perturbed", eos=(eos,)) == []
    assert kept and min(kept) < len(LENGTHS)


def test_control_a_kv_row_left_after_a_rejected_branch_is_caught(llama, monkeypatch) -> None:
    assert mismatches(llama, "fixed", "perturbed") == []
    monkeypatch.setattr(AOTBatchedKV, "_move", lambda self, rows, src, dst: None)
    assert mismatches(llama, "fixed", "perturbed") != []


def test_control_a_row_reading_another_rows_columns_is_caught(llama, monkeypatch) -> None:
    step = AOTBatchedKV._step

    def leaky(self, tokens, positions, allowed, start, keys, values):
        if allowed.shape[0] > 1:
            allowed = allowed | allowed.roll(1, dims=0)
        return step(self, tokens, positions, allowed, start, keys, values)

    monkeypatch.setattr(AOTBatchedKV, "_step", leaky)
    assert mismatches(llama, "dynatree", "perturbed") != []


def test_auto_takes_the_aot_batch_only_once_its_package_is_built(llama, monkeypatch) -> None:
    built: list[bool] = []
    monkeypatch.setattr(aot_engine, "build_package", lambda *a, **k: built.append(True) or pytest.fail("built"))
    monkeypatch.setattr(aot_batch, "cached", lambda *a, **k: False)
    monkeypatch.setattr(engines, "AUTO_MIN_PARAMS", 1)
    monkeypatch.setattr(aot_engine, "all_cached", lambda *a, **k: True)  # (the single-prompt packages)
    made: list[str] = []
    init = BatchedKV.__init__

    def spy(self, *a, **k):
        made.append(type(self).engine)
        init(self, *a, **k)

    monkeypatch.setattr(BatchedKV, "__init__", spy)
    run(llama, "autoregressive", "perturbed", prompts(2), n=4, engine="auto")
    assert made == ["hf"]
    monkeypatch.setattr(aot_batch, "cached", lambda *a, **k: True)
    run(llama, "autoregressive", "perturbed", prompts(2), n=4, engine="auto")
    assert made[-1] == "aot" and not built


def test_a_non_cpu_target_is_refused_in_one_line(llama, monkeypatch) -> None:
    monkeypatch.setattr(BatchedKV, "__init__", lambda self, *a, **k: setattr(self, "device", torch.device("meta")))
    with pytest.raises(DynaTreeError) as err:
        AOTBatchedKV(llama["target"], VOCAB)
    assert "runs on a CPU" in str(err.value) and "\n" not in str(err.value)


def test_prepare_builds_the_package_generate_loads(llama, monkeypatch) -> None:
    target, other = llama["target"], llama["perturbed"]
    aot_batch.prepare(target)
    plan = engines.resolve(EngineOptions(engine="aot"), target).linear_plan
    assert aot_batch.cached(target, plan or False)
    assert not aot_batch.cached(other, plan or False)  # (frozen: keyed by the weights it holds)
    monkeypatch.setattr(aot_engine, "build_package", lambda *a, **k: pytest.fail("rebuilt"))
    run(llama, "autoregressive", "perturbed", prompts(3), n=4)


def test_weights_over_the_packing_budget_are_refused_in_one_line(llama, monkeypatch) -> None:
    from dynatree.runtime.kernels import cpu_linear

    monkeypatch.setattr(cpu_linear, "packing_budget", lambda already=0: 1024)
    monkeypatch.setattr(aot_engine, "build_package", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(DynaTreeError) as err:
        run(llama, "autoregressive", "perturbed", prompts(4), n=4)
    assert "packed copy" in str(err.value) and "\n" not in str(err.value)
