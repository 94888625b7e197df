"""Exactness on a target bigger than one device: tensor parallelism and accelerate's device_map.

Tensor parallelism: ``torchrun`` launches two gloo processes on CPU (one thread each,
``tp_worker.py``); each loads the same tiny random Llama with ``tp_plan="auto"`` (weights as
DTensors, every layer ending in a collective) and a replicated draft, and runs every strategy.
Greedy output must equal the unsharded model's HF greedy output on every rank; seeded sampled
output must be the same on every rank and equal to the unsharded run with the same seed (same
random stream, logits equal up to rounding). The mutant run (the few-row CPU layout forced onto the
sharded target) must *differ*, which shows the comparison can fail.

device_map: one layer offloaded to disk through accelerate, so its weights live on the meta
device and an accelerate hook moves them in for every call (the only split a CPU-only machine
can run; a multi-GPU split goes through the same hooks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import hf_greedy, perturbed, tiny_model
from tp_worker import FUSED_STRATEGIES, NEW, OPTIONS, PROMPT, SAMPLED_OPTIONS, SEED, TEMPERATURE, fused_head_run

import dynatree
from dynatree import EngineOptions, SamplingConfig, StoppingConfig

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
# tp_worker.py (tests/) imports test_feature_draft (tests/drafts/), which imports test_distill
# (tests/training/)
WORKER_PATH = [SRC, TESTS, TESTS / "drafts", TESTS / "training"]
NO_EOS = StoppingConfig(eos_token_id=())


def _target() -> torch.nn.Module:
    return tiny_model("llama", 0, max_positions=256)


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both ranks' results of one 2-process torchrun (gloo, CPU)."""
    root = tmp_path_factory.mktemp("tp")
    model_dir, out = root / "model", root / "out"
    out.mkdir()
    _target().save_pretrained(model_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(map(str, WORKER_PATH)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(TESTS / "tp_worker.py"), str(model_dir), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def unsharded() -> dict[str, torch.nn.Module]:
    target = _target()
    return {"target": target, "draft": perturbed(target)}


def _reference(models: dict) -> list[int]:
    return hf_greedy(models["target"], torch.tensor([PROMPT]), NEW)[0].tolist()


def test_target_is_really_sharded(tp_results: list[dict]) -> None:
    assert [r["sharded"] for r in tp_results] == [True, True]


@pytest.mark.parametrize("strategy", sorted(OPTIONS))
def test_tp_greedy_equals_unsharded_hf_greedy(tp_results: list[dict], unsharded: dict, strategy: str) -> None:
    ref = _reference(unsharded)
    assert len(ref) == len(PROMPT) + NEW
    for rank, res in enumerate(tp_results):
        assert res[f"greedy/{strategy}"] == ref, (rank, strategy)


def test_tp_static_engine_and_unseeded_dyspec_are_exact(tp_results: list[dict], unsharded: dict) -> None:
    ref = _reference(unsharded)
    for res in tp_results:
        assert res["greedy-static/dynatree"] == ref
        assert res["unseeded/dyspec"] == ref


def test_tp_default_hybrid_draft_is_exact_and_ranks_agree(tp_results: list[dict], unsharded: dict) -> None:
    """The default draft (the model and the text in one tree) on a sharded target: greedy equals
    unsharded HF greedy on every rank, and a seeded sampled run draws the same on both ranks as
    unsharded."""
    ref = _reference(unsharded)
    for res in tp_results:
        assert res["greedy-hybrid/dynatree"] == ref
    r0, r1 = (res["sampled-hybrid/dyspec"] for res in tp_results)
    one = dynatree.generate(unsharded["target"], unsharded["draft"], torch.tensor([PROMPT]), "dyspec",
                            max_new_tokens=NEW, stopping=NO_EOS, sampling=SamplingConfig(temperature=TEMPERATURE),
                            seed=SEED, options=EngineOptions(cpu_linear=False), **SAMPLED_OPTIONS["dyspec"])
    assert r0 == r1 == one.sequences[0].tolist()


@pytest.mark.parametrize("strategy", sorted(OPTIONS))
def test_tp_sampling_ranks_agree_with_unsharded_seeded_run(tp_results: list[dict], unsharded: dict,
                                                          strategy: str) -> None:
    r0, r1 = (res[f"sampled/{strategy}"] for res in tp_results)
    assert r0 == r1
    one = dynatree.generate(unsharded["target"], unsharded["draft"], torch.tensor([PROMPT]), strategy,
                            max_new_tokens=NEW, stopping=NO_EOS, sampling=SamplingConfig(temperature=TEMPERATURE),
                            seed=SEED, options=EngineOptions(cpu_linear=False), **SAMPLED_OPTIONS[strategy], text=False)
    assert r0 == one.sequences[0].tolist()


def test_tp_unseeded_sampling_ranks_agree(tp_results: list[dict]) -> None:
    """Different global streams per rank: rank 0's is shared, so the tokens agree."""
    r0, r1 = (res["unseeded-sampled/dyspec"] for res in tp_results)
    assert len(r0) == len(PROMPT) + NEW and r0 == r1


def test_tp_refuses_cpu_linear_and_the_mutant_is_caught(tp_results: list[dict], unsharded: dict) -> None:
    for res in tp_results:
        assert "cpu_linear=True is not supported on a tensor-parallel" in res["cpu_linear_true"]
        assert res["mutant-cpu-linear/autoregressive"] != _reference(unsharded)


def test_tp_fused_feature_head_is_exact_and_reads_the_same_features(tp_results: list[dict], unsharded: dict) -> None:
    """A feature head reading a middle layer of the sharded target: exact, and the same drafts
    every round as on the unsharded target; a head fed zeros instead drafts differently."""
    ref = _reference(unsharded)
    for strategy in FUSED_STRATEGIES:
        one = fused_head_run(unsharded["target"], strategy)
        assert one["tokens"] == ref and any(one["drafts"])
        for res in tp_results:
            assert res[f"fused-head/{strategy}"] == one, strategy
    one = fused_head_run(unsharded["target"], "dynatree")
    for res in tp_results:
        mutant = res["mutant-zero-features/dynatree"]
        assert mutant["tokens"] == ref and mutant["drafts"] != one["drafts"]


def test_device_map_with_offloaded_layer_is_exact(tmp_path: Path, unsharded: dict) -> None:
    pytest.importorskip("accelerate")
    from transformers import LlamaForCausalLM

    unsharded["target"].save_pretrained(tmp_path / "model")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    target = LlamaForCausalLM.from_pretrained(tmp_path / "model", device_map=device_map,
                                              offload_folder=str(tmp_path / "offload"))
    assert target.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # really offloaded
    ref = _reference(unsharded)
    ids = torch.tensor([PROMPT])
    for strategy, opts in OPTIONS.items():
        out = dynatree.generate(target, unsharded["draft"], ids, strategy, max_new_tokens=NEW, stopping=NO_EOS, **opts, text=False)
        assert out.sequences[0].tolist() == ref, strategy
    sampled = SamplingConfig(temperature=TEMPERATURE)
    out = dynatree.generate(target, unsharded["draft"], ids, "dyspec", max_new_tokens=NEW, stopping=NO_EOS,
                            sampling=sampled, seed=SEED, **OPTIONS["dyspec"], text=False)
    one = dynatree.generate(unsharded["target"], unsharded["draft"], ids, "dyspec", max_new_tokens=NEW,
                            stopping=NO_EOS, sampling=sampled, seed=SEED, **OPTIONS["dyspec"], text=False)
    assert torch.equal(out.sequences, one.sequences)


def test_dyspec_threshold_defaults_fit_a_short_model() -> None:
    """4-token prompt + 30 new tokens on a 256-position model: the default max_nodes=768 used to be
    counted as the tree depth and the run refused; the depth is now bounded by max_new_tokens."""
    target = _target()
    out = dynatree.generate(target, perturbed(target), torch.tensor([PROMPT]), "dyspec-threshold",
                            max_new_tokens=NEW, stopping=NO_EOS, text=False)
    assert out.sequences[0].tolist() == hf_greedy(target, torch.tensor([PROMPT]), NEW)[0].tolist()
    assert max(r.depth for r in out.stats.rounds) <= NEW


def test_tp_flag_needs_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from dynatree.cli import app

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    result = CliRunner().invoke(app, ["generate", "--tp", "--max-new-tokens", "4"])
    assert result.exit_code == 2
    assert "torchrun --nproc-per-node N -m dynatree" in result.output


def test_tp_plan_replicates_attention_only_when_heads_do_not_split() -> None:
    from transformers import LlamaConfig

    from dynatree.runtime.distributed import tp_plan

    smollm2 = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3)
    assert tp_plan(smollm2, 3) == "auto"
    plan = tp_plan(smollm2, 2)
    assert plan != "auto" and set(plan.values()) == {"replicate"}
    assert sorted(plan) == [f"model.layers.*.self_attn.{p}_proj" for p in "koqv"]
