"""The GPU benchmark's smoke mode: every section of benchmarks/gpu/gpu_bench.py runs on CPU.

Same code as on a GPU, tiny shapes: fp16 on CPU, the Triton kernel under its interpreter, and a
stand-in for CUDA graphs (outputs replayed into buffers the graph owns, moved static inputs
counted), so the first GPU run can only fail on what is truly GPU-specific.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_bench.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bench"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("gpu-smoke")
    threads = torch.get_num_threads()
    rc = bench.main(["--smoke", "--out", str(out)])
    assert torch.get_num_threads() == threads  # the smoke run's single thread must not leak into other tests
    return out, rc


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_section_runs_without_error(bench: ModuleType, smoke: tuple[Path, int]) -> None:
    out, rc = smoke
    costs = rows(out / "costs.jsonl")
    assert [r["error"] for r in costs if "error" in r] == []
    assert rc == 0
    done = [r["section"] for r in costs if "done_s" in r]
    assert done == list(bench.SECTIONS)
    assert {r["section"] for r in costs if "done_s" not in r} == set(bench.SECTIONS) - {"report"}
    assert all(r["device"].startswith("CPU") for r in costs)


def test_costs_cover_every_engine_variant_and_size(bench: ModuleType, smoke: tuple[Path, int]) -> None:
    plan = bench.smoke_plan()
    costs = [r for r in rows(smoke[0] / "costs.jsonl") if r["section"] == "costs" and "ms" in r]
    for role, sizes in (("target", plan.verify_sizes), ("draft", plan.level_sizes)):
        got = {(r["variant"], r["rows"]) for r in costs if r["role"] == role}
        assert got == {(v, n) for v in ("hf-eager", "hf-sdpa", "static", "static-compiled") for n in sizes}
    compiled = [r for r in costs if r["variant"] == "static-compiled"]
    assert all(r["compile_backend"] == "cuda-graph-emulation" and r["graphs"] > 0 for r in compiled)
    # A static input (weight, KV cache) that moved between replays would make CUDA graphs re-record.
    assert all(r["rerecords"] == 0 for r in compiled)
    assert all(r["ms"] > 0 and r["read_bytes"] > 0 for r in costs)


def test_e2e_rows_speedups_and_greedy_match(bench: ModuleType, smoke: tuple[Path, int]) -> None:
    out = smoke[0]
    labels = [s.rsplit("@", 1)[1] for s in bench.e2e_specs().split(",")]
    bench_rows = rows(out / "e2e.jsonl")
    assert sorted({r["label"] for r in bench_rows}) == sorted(labels)
    summary = {r["label"]: r for r in rows(out / "costs.jsonl") if r["section"] == "e2e" and "label" in r}
    assert sorted(summary) == sorted(labels)
    for r in summary.values():
        assert r["speedup_vs_ar_hf_eager"] is not None and r["speedup_vs_ar_compiled"] is not None
        # Deterministic tiny models, and compiled outputs replayed into reused buffers: an engine that
        # kept a graph output without copying it would diverge here.
        assert r["greedy_match_rate"] == 1.0 and r["token_match_rate"] == 1.0, r["label"]
    assert summary["ar-compiled"]["engine"] == {"engine": "static", "compile": True, "cpu_linear": False,
                                                  "linear_plan": None}
    drafted = {json.loads(line)["label"] for line in (out / "trees.jsonl").read_text().splitlines()}
    assert drafted == {label for label in labels if not label.startswith("ar-") and not label.endswith("-compiled")}


def test_kernel_matches_sdpa_on_policy_trees(smoke: tuple[Path, int]) -> None:
    kernel = [r for r in rows(smoke[0] / "costs.jsonl") if r["section"] == "kernel" and "tree" in r]
    assert {r["order"] for r in kernel} == {"bfs", "dfs"}
    assert any(":" in r["tree"] for r in kernel)  # a tree a policy built, not only synthetic ones
    assert all(r["max_abs_err"] < 1e-2 for r in kernel)  # fp16
    in_model = [r for r in rows(smoke[0] / "costs.jsonl") if r["section"] == "kernel_in_model" and "ms" in r]
    assert {r["attn"] for r in in_model} == {"sdpa", "dynatree_tree"}


def test_report_files(smoke: tuple[Path, int]) -> None:
    out = smoke[0]
    text = (out / "costs.md").read_text()
    for heading in ("## target", "## draft", "## Triton kernel", "## Whole verify", "## End to end"):
        assert heading in text
    assert (out / "costs.png").stat().st_size > 0 and (out / "kernel.png").stat().st_size > 0


def test_emulated_graph_reuses_its_output_buffer(bench: ModuleType) -> None:
    """The stand-in must behave like a CUDA-graph replay, or the smoke run could not catch a missing copy."""
    fn = torch.compile(lambda x: x * 2, backend=bench.cuda_graph_emulation, dynamic=False)
    first = fn(torch.ones(3))
    second = fn(torch.full((3,), 5.0))
    assert first is second  # the same buffer, now holding the second result
    assert torch.equal(first, torch.full((3,), 10.0))


def test_missing_gpu_is_one_line_exit_2(bench: ModuleType, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    assert bench.main(["--device", "cuda", "--out", "unused"]) == 2
    assert "error: --device cuda: this torch" in capsys.readouterr().err
