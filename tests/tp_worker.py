"""One rank of the tensor-parallel exactness test (launched by ``test_distributed.py`` via torchrun).

Loads the saved tiny Llama with transformers' ``tp_plan="auto"`` (gloo, one thread), the draft replicated (the
perturbed copy from ``tiny.py``, rebuilt identically on every rank), runs every strategy greedy and
sampled, and writes what it got to ``<out>/rank<R>.json`` for the test to compare with the
unsharded model. Not a test module itself (no ``test_`` prefix).

Usage: tp_worker.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from test_feature_draft import feature_draft
from tiny import perturbed, tiny_model
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

import dynatree
from dynatree import EngineOptions, SamplingConfig, StoppingConfig
from dynatree.runtime import cache, distributed
from dynatree.runtime import engines
from dynatree.options import fixed_plan
from dynatree.runtime.kernels import cpu_linear, linear_plan
from dynatree.errors import DynaTreeError

ROW_MAJOR = cpu_linear.small_batch_linear

PROMPT = [5, 17, 33, 8]
NEW = 30
SEED = 3
TEMPERATURE = 0.8
# Small trees for speed, except dyspec-threshold's default max_nodes=768: what used to be refused on
# this 256-position model.
OPTIONS: dict[str, dict] = {
    "autoregressive": {},
    "linear": {"k": 4},
    "fixed": {"depth": 4, "branch": 2, "tau": 0.0, "max_nodes": 24},
    "dynatree": {"tau": 0.0, "d0": 3, "d_max": 5, "max_nodes": 24, "window": 2},
    "dyspec": {"max_nodes": 24},
    "dyspec-threshold": {"threshold": 0.01},
}
# Sampled runs (also repeated unsharded by the test): a small threshold tree keeps them quick.
SAMPLED_OPTIONS = {**OPTIONS, "dyspec-threshold": {"threshold": 0.01, "max_nodes": 24}}
# The fused feature head (EAGLE-3) reads this decoder layer's output of the (2-layer) target.
FUSED = (1,)
FUSED_STRATEGIES = ("linear", "dynatree")


def fused_head_run(target: torch.nn.Module, strategy: str) -> dict[str, list[int]]:
    """A fused feature head (built from the unsharded twin, identically on every rank) drafting for
    ``target``: its output tokens, and the tokens it drafted each round. Equal drafts sharded and
    unsharded say the head read the same features of the target (the head is untrained, so its
    drafts are rarely accepted; what it drafts still depends on every feature it reads)."""
    head = feature_draft(tiny_model("llama", 0, max_positions=256), layers=FUSED)
    drafts: list[list[int]] = []
    out = dynatree.generate(target, head, torch.tensor([PROMPT]), strategy, max_new_tokens=NEW,
                            stopping=StoppingConfig(eos_token_id=()), on_round=lambda ev: drafts.append(
                                ev.tree.tokens[1:].tolist()), **OPTIONS[strategy], text=False)
    return {"tokens": out.sequences[0].tolist(), "drafts": drafts}


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # here, not at import: the test module imports the constants above
    rank = int(os.environ["RANK"])
    # = from_pretrained(model_dir, tp_plan="auto"), the older spelling
    target = AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=DistributedConfig(tp_plan="auto")).eval()
    draft = perturbed(tiny_model("llama", 0, max_positions=256))
    ids = torch.tensor([PROMPT])

    def run(strategy: str, sampling: SamplingConfig | None = None, text: bool = False, **kw: object) -> list[int]:
        opts = SAMPLED_OPTIONS if sampling is not None and sampling.temperature else OPTIONS
        out = dynatree.generate(target, draft, ids, strategy, max_new_tokens=NEW, sampling=sampling,
                                stopping=StoppingConfig(eos_token_id=()), **opts[strategy], **kw, text=text)
        return out.sequences[0].tolist()

    res: dict[str, object] = {"sharded": distributed.is_sharded(target)}
    for strategy in OPTIONS:
        res[f"greedy/{strategy}"] = run(strategy)
        res[f"sampled/{strategy}"] = run(strategy, SamplingConfig(temperature=TEMPERATURE), seed=SEED)
    res["greedy-static/dynatree"] = run("dynatree", options=EngineOptions(engine="static"))
    # the library's default draft: the model and the text in one tree
    res["greedy-hybrid/dynatree"] = run("dynatree", text=True)
    res["sampled-hybrid/dyspec"] = run("dyspec", SamplingConfig(temperature=TEMPERATURE), text=True, seed=SEED)
    # No seed and different global streams per rank: DySpec used to draw different children on
    # each rank and hang; the ranks must now share rank 0's stream.
    torch.manual_seed(100 + rank)
    res["unseeded/dyspec"] = run("dyspec")
    res["unseeded-sampled/dyspec"] = run("dyspec", SamplingConfig(temperature=TEMPERATURE))
    for strategy in FUSED_STRATEGIES:
        res[f"fused-head/{strategy}"] = fused_head_run(target, strategy)
    # Mutant: the head reads zeros instead of the target's layer outputs (what a layer read wrong on
    # a sharded target would amount to). The test requires its drafts to differ.
    real = cache.CachedModel.forward_features
    cache.CachedModel.forward_features = lambda self, *a, **k: (lambda h, f: (h, f * 0))(*real(self, *a, **k))
    res["mutant-zero-features/dynatree"] = fused_head_run(target, "dynatree")
    cache.CachedModel.forward_features = real
    try:
        run("autoregressive", options=EngineOptions(cpu_linear=True))
        res["cpu_linear_true"] = "accepted"
    except DynaTreeError as err:
        res["cpu_linear_true"] = str(err)
    # Mutant: the few-row CPU layout forced onto the sharded target (both guards defeated), as it
    # was before its results were copied to row-major order. The test requires this to differ
    # from the unsharded output, i.e. that the comparison can fail.
    distributed.resolve_cpu_linear = lambda model, cpu_linear: None
    distributed.layout_allowed = lambda model: True
    linear_plan.plan_for = lambda model, log=None: fixed_plan()  # (whatever this CPU measures)
    cpu_linear.small_batch_linear = strided_layout
    res["mutant-cpu-linear/autoregressive"] = run("autoregressive")
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))



def strided_layout(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   kernel: str = "rowmajor") -> torch.Tensor:
    """The few-row layout's values returned as a strided view (last-dim stride 2), as its one-row
    calls returned them before the results were copied to row-major order: a sharded layer's
    collectives do not handle such a view."""
    out = ROW_MAJOR(x, weight, bias)
    return torch.stack((out, out), dim=-1)[..., 0]

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
