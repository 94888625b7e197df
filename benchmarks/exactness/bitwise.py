"""Are tree-verify logits bit for bit the one-token logits? Measured per engine configuration.

For each configuration the defaults can pick (hf / static / compiled static engine, SDPA / eager
attention, the few-row CPU linear layout on / off, the lazy LM head on / off) this runs ONE
tree-masked target forward over a root and drafted nodes (``verify.tree_forward``) and, for every
node, the root-to-node path fed one token per call (what the autoregressive strategy runs), and
records: whether every node's logits are equal bit for bit, the largest absolute difference, that
difference relative to the largest |logit|, whether every node's argmax agrees, and the smallest
top-2 margin of the one-token logits (a difference that large could flip an argmax).

Models: the tiny random models of the test suite (``tests/tiny.py``; what ``tests/exactness/test_bitwise.py``
asserts) and the embedded target SmolLM2-135M-Instruct, with 1 and 2 torch threads. Trees are
random tokens in fixed shapes (the question is about summation order, not about what a draft
proposes): "small" (4 rows, the lazy head's one-call size), "mid" (12 rows, siblings at every
level) and, for the tiny models, "wide" (72 rows, more than the few-row layout's 64).

    PYTHONPATH=src:tests python benchmarks/exactness/bitwise.py --out benchmarks/exactness/bitwise.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dynatree.core import verify
from dynatree.runtime.cache import CachedModel, StaticCachedModel
from dynatree.core.tree import TokenTree, TreeBuilder, leaf_paths

HERE = Path(__file__).resolve().parent
SHAPES: dict[str, list[int]] = {
    "small": [0, 1, 0],
    "mid": [0, 0, 0, 1, 1, 2, 4, 4, 6, 6, 8],
    "wide": [0, 0, 0, *[(i - 1) // 3 for i in range(4, 72)]],
}


def build_tree(shape: str, seed: int, vocab: int, prompt: list[int] | None = None) -> tuple[list[int], TokenTree]:
    g = torch.Generator().manual_seed(seed)
    prompt = prompt or torch.randint(2, vocab, (9,), generator=g).tolist()
    builder = TreeBuilder(prompt[-1])
    for parent in SHAPES[shape]:
        builder.add(parent, int(torch.randint(2, vocab, (1,), generator=g)), 0.0)
    return prompt, builder.freeze()


def new_kv(model: torch.nn.Module, vocab: int, cfg: dict[str, Any]) -> CachedModel:
    if cfg["engine"] == "hf":
        return CachedModel(model, vocab, cpu_linear=cfg["cpu_linear"])
    buckets = (1, 4, 16) if cfg["compile"] else None  # compiled: one graph per bucket, three buckets
    return StaticCachedModel(model, vocab, 256, compile=cfg["compile"], buckets=buckets, cpu_linear=cfg["cpu_linear"])


@torch.inference_mode()
def compare(model: torch.nn.Module, vocab: int, cfg: dict[str, Any], prompt: list[int], tree: TokenTree
            ) -> dict[str, Any]:
    kv = new_kv(model, vocab, cfg)
    kv.prefill(prompt[:-1])
    logits, _ = verify.tree_forward(kv, tree, "bfs", lazy_head=cfg["lazy_head"])
    got = torch.stack([logits[i] for i in range(tree.size)])
    want = torch.empty_like(got)
    for path in leaf_paths(tree):
        kv = new_kv(model, vocab, cfg)
        kv.prefill(prompt[:-1])
        for node in path:
            one, _ = verify.tree_forward(kv, TreeBuilder(int(tree.tokens[node])).freeze(), "bfs",
                                         lazy_head=cfg["lazy_head"])
            want[node] = one[0]
    diff = float((got - want).abs().max())
    top2 = want.topk(2, dim=-1).values
    return {"nodes": tree.size, "bitwise": bool(torch.equal(got, want)),
            "equal_nodes": int(sum(torch.equal(got[i], want[i]) for i in range(tree.size))),
            "max_abs_diff": diff, "max_rel_diff": diff / float(want.abs().max()),
            "argmax_agree": bool(torch.equal(got.argmax(-1), want.argmax(-1))),
            "min_top2_margin": float((top2[:, 0] - top2[:, 1]).min())}


def configs(compile_too: bool) -> list[dict[str, Any]]:
    out = [{"engine": e, "compile": False, "attn": a, "cpu_linear": c, "lazy_head": lz}
           for e, a, c, lz in itertools.product(("hf", "static"), ("sdpa", "eager"), (False, True), (False, True))]
    if compile_too:
        out += [{"engine": "static", "compile": True, "attn": "sdpa", "cpu_linear": c, "lazy_head": True}
                for c in (False, True)]
    return out


def summary(rows: list[dict[str, Any]]) -> str:
    """Markdown table per (model, threads, configuration) over every architecture and tree shape."""
    from collections import defaultdict

    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        model = "tiny (5 architectures)" if r["model"].startswith("tiny-") else r["model"]
        engine = "static compiled" if r["compile"] else r["engine"]
        groups[(model, r["threads"], engine, r["attn"], r["cpu_linear"], r["lazy_head"])].append(r)
    lines = ["| model | threads | engine | attention | cpu_linear | lazy head | nodes | bit-equal nodes "
             "| max abs diff | max diff / max logit | argmax agrees | smallest top-2 margin |",
             "|---|---:|---|---|---|---|---:|---:|---:|---:|---|---:|"]
    for (model, threads, engine, attn, lin, lazy), rs in groups.items():
        lines.append(f"| {model} | {threads} | {engine} | {attn} | {'on' if lin else 'off'} | {'on' if lazy else 'off'} "
                     f"| {sum(r['nodes'] for r in rs)} | {sum(r['equal_nodes'] for r in rs)} "
                     f"| {max(r['max_abs_diff'] for r in rs):.1e} | {max(r['max_rel_diff'] for r in rs):.1e} "
                     f"| {'yes' if all(r['argmax_agree'] for r in rs) else 'NO'} "
                     f"| {min(r['min_top2_margin'] for r in rs):.2g} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "bitwise.jsonl")
    ap.add_argument("--what", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="torch threads for SmolLM2")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--summary", action="store_true", help="print the table from --out and exit")
    args = ap.parse_args()
    if args.summary:
        print(summary([json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]))
        return
    meta = {"machine": f"{platform.node()} {platform.machine()}", "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "time": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    with args.out.open("a") as out:
        def record(row: dict[str, Any]) -> None:
            row.update(meta)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps({k: v for k, v in row.items() if k not in meta}), flush=True)

        if "tiny" in args.what:
            from tiny import VOCAB, tiny_model

            torch.set_num_threads(1)
            for arch in ("llama", "gpt2", "neox", "qwen2", "mistral"):
                models: dict[tuple[str, bool], torch.nn.Module] = {}
                for cfg in configs(args.compile and arch in ("llama", "gpt2")):
                    # a compiled engine's graphs are tied to its model: a fresh one per compiled config
                    key = (cfg["attn"], cfg["compile"])
                    m = models.setdefault(key, tiny_model(arch, 0, attn=cfg["attn"])) if not cfg["compile"] \
                        else tiny_model(arch, 0, attn=cfg["attn"])
                    for seed, shape in enumerate(SHAPES):
                        if cfg["compile"] and shape == "wide":
                            continue
                        prompt, tree = build_tree(shape, seed, VOCAB)
                        record({"model": f"tiny-{arch}", "threads": 1, **cfg, "shape": shape,
                                **compare(m, VOCAB, cfg, prompt, tree)})
        if "smollm2" in args.what:
            from dynatree.loading import models as zoo
            from dynatree.bench.datasets import load_prompt_ids

            for attn in ("sdpa", "eager"):
                target, tok = zoo.load_model(zoo.DEFAULT_TARGET, attn_implementation=attn)
                vocab = zoo.vocab_size(target)
                prompt = load_prompt_ids("pydoc", tok, 1, 64)[0]
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    for cfg in configs(False):
                        if cfg["attn"] != attn:
                            continue
                        for seed, shape in enumerate(("small", "mid")):
                            _, tree = build_tree(shape, seed, vocab, prompt)
                            record({"model": "smollm2-135m", "threads": threads, **cfg, "shape": shape,
                                    **compare(target, vocab, cfg, prompt, tree)})


if __name__ == "__main__":
    sys.exit(main())
