"""Block counts of the verify mask (32 x 32 tiles) in BFS vs DFS order, for the trees the policies
actually build on the offline pair at their default (GPU-sized) budgets.

A block-skipping kernel does work proportional to the non-empty tiles (DySpec App. C, Table 5).
Tree shapes do not depend on timing, so this runs anywhere; written to tree_blocks.json.

    python benchmarks/cpu/tree_blocks.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

import dynatree.loop.generate as engine
from dynatree import generate
from dynatree.loading import models
from dynatree.bench.datasets import load_prompt_ids
from dynatree.runtime.kernels.tree_attention import tree_block_counts

POLICIES = {  # default budgets, as a GPU would run them
    "fixed": {},  # D=8, B=3, tau=0.1, N_max=256
    "dynatree": {"max_nodes": 64},
    "dyspec": {},  # 64 nodes
    "dyspec-threshold": {},  # threshold 0.001, up to 768 nodes
}


def main() -> None:
    torch.set_num_threads(2)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft(models.DEFAULT_DRAFT, target)
    prompts = load_prompt_ids("licenses", tok, 3, 128, 0)
    trees: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = engine.tree_forward

    def spy(kv, tree, *args, **kwargs):
        trees.append((tree.parent.clone(), tree.depth.clone()))
        return real(kv, tree, *args, **kwargs)

    engine.tree_forward = spy
    out = {}
    for name, opts in POLICIES.items():
        rows = []
        for ids in prompts:
            trees.clear()
            generate(target, draft, ids[:128], name, text=False, max_new_tokens=24, seed=0, **opts)
            for parent, depth in trees:
                whole = tree_block_counts(parent, depth, prefix_len=len(ids[:128]))
                tree_only = tree_block_counts(parent, depth, prefix_len=0)
                rows.append({"nodes": int(parent.numel()), "whole": whole, "tree": tree_only})
        big = [r for r in rows if r["nodes"] > 32] or rows
        out[name] = {
            "rounds": len(rows),
            "mean_nodes": statistics.mean(r["nodes"] for r in rows),
            "tree_blocks_bfs": statistics.mean(r["tree"]["bfs"] for r in big),
            "tree_blocks_dfs": statistics.mean(r["tree"]["dfs"] for r in big),
            "tree_blocks_dense": statistics.mean(r["tree"]["dense"] for r in big),
            "whole_blocks_bfs": statistics.mean(r["whole"]["bfs"] for r in big),
            "whole_blocks_dfs": statistics.mean(r["whole"]["dfs"] for r in big),
            "rounds_over_32_nodes": sum(r["nodes"] > 32 for r in rows),
        }
        print(name, json.dumps(out[name]))
    Path(__file__).with_name("tree_blocks.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
