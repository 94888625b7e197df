"""The GPU instruct-draft script (benchmarks/distill/gpu_instruct.sh) in its smoke mode on CPU: the
same steps as on a GPU (build requests, label, time steps, size the run to the budget, label and
train, write weights in files under the size limit), a tiny random target and tiny sizes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "distill" / "gpu_instruct.py"


@pytest.fixture(scope="module")
def kit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_instruct", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_instruct"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    out, work = tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("work")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "distill" / "gpu_instruct.sh"), "--smoke", "--out", str(out),
                           "--work", str(work)], env=env, capture_output=True, text=True, timeout=600)
    return out, work, proc


def test_smoke_run_writes_the_draft_metrics_and_log(smoke) -> None:
    out, work, proc = smoke
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["smoke"] and metrics["device"].startswith("CPU")
    for phase in ("load_target", "build_requests", "label_eval", "time_steps", "label_train_and_train"):
        assert phase in metrics["phases_s"]
    assert metrics["label_rate"]["positions_per_s"] > 0 and metrics["train_positions"] > 0
    assert metrics["config"]["data"] == "instruct" and metrics["eval"]["positions"] > 0
    assert set(metrics["train_sequences_by_kind"]) >= {"math", "follow-up"}
    assert [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()] == \
        list(range(1, metrics["config"]["steps"] + 1))
    assert (out / "run.log").read_text().count("== plan:") == 1


def test_weights_come_in_files_under_the_limit_and_join_to_the_final_draft(kit, smoke) -> None:
    out, work, _ = smoke
    metrics = json.loads((out / "metrics.json").read_text())
    shards = sorted((out / "draft").glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and all(b < 0.015e6 for b in metrics["file_bytes"].values())
    joined = kit.join_weights(out / "draft")
    a, b = load_file(str(joined)), load_file(str(work / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_plan_fits_the_budget(kit) -> None:
    from dynatree.training.config import DistillConfig

    cfg = DistillConfig(data="instruct", steps=2000, train_sequences=16384, batch=48, seq_len=512)
    n, steps = kit.plan(400.0, 0.05, 0.01, cfg, 0.35)
    assert steps == 2000 and n == 16384  # everything fits: 115 s of training, 180 s of labelling
    n, steps = kit.plan(400.0, 0.2, 0.05, cfg, 0.35)
    assert steps * 0.2 * 1.15 <= 140 and n * 0.05 * 1.1 + steps * 0.2 * 1.15 <= 400
    assert kit.plan(-5.0, 0.2, 0.05, cfg, 0.35) == (48, 1)  # out of time: the least that still trains


def test_no_gpu_is_one_line_exit_2(kit, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kit.main(["--out", "unused"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_feature_kind_smoke_run_writes_a_fused_head_that_loads(kit, tmp_path: Path) -> None:
    """``--kind feature --feature-layers auto``: the same steps for the feature head (its step timed
    with the target's features), the weights in shards under the limit, and a head that loads."""
    from dynatree.drafts.checkpoint import load_distilled_draft
    from dynatree.drafts.feature_head import FeatureDraft

    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "distill" / "gpu_instruct.sh"), "--smoke", "--out", str(out),
                           "--work", str(work), "--kind", "feature", "--feature-layers", "auto", "--steps", "4"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["kind"] == "feature" and metrics["config"]["feature_layers"] == "auto"
    assert metrics["eval"]["positions"] > 0 and all(b < 0.015e6 for b in metrics["file_bytes"].values())
    kit.join_weights(out / "draft")
    target, _, _ = kit.load_target(kit.parse(["--smoke", "--out", str(out)]))
    draft = load_distilled_draft(target, out / "draft")
    assert isinstance(draft, FeatureDraft) and draft.feature_layers == (1, 2)


def test_feature_cap_bounds_the_training_side(kit) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from dynatree.training.config import DistillConfig

    target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=30,
                                          num_attention_heads=4, num_key_value_heads=2))
    cfg = DistillConfig(data="instruct", kind="feature", feature_layers="auto", batch=4)
    per_seq = cfg.sequence_length() * 32 * 3 * 2  # three fused layers, fp16
    assert kit.feature_cap(target, cfg, 1.0) == int(1e9 // per_seq)
    assert kit.feature_cap(target, cfg, 0.0) == 4  # never below one batch
