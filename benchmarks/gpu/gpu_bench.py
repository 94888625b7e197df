"""GPU measurements for the fast engine (issue 8): per-round costs, the tree-attention kernel, end to end.

Runs on a machine with one NVIDIA GPU and no network (the device machine): models are
Pythia-2.8B / Pythia-70M-*shaped* random fp16 networks for per-round costs (costs do not depend on
the weights), and the real offline pair (SmolLM2-135M from its GGUF + the shipped draft) for end
to end numbers when the GGUF file is given. Every number is written as one JSON line to --out.

    python benchmarks/gpu/gpu_bench.py --sections costs,kernel --out results.jsonl
    python benchmarks/gpu/gpu_bench.py --sections e2e --gguf /tmp/SmolLM2.gguf --out e2e.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from dynatree.cache import CachedModel, StaticCachedModel  # noqa: E402
from dynatree.kernels.tree_attention import count_blocks, tree_attention, tree_block_counts  # noqa: E402
from dynatree.tree import TreeBuilder, ancestor_matrix, dfs_order  # noqa: E402
from dynatree.verify import tree_forward  # noqa: E402

SHAPES = {
    "pythia-2.8b": dict(hidden_size=2560, num_hidden_layers=32, num_attention_heads=32, intermediate_size=10240),
    "pythia-70m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048),
}
OUT: Path


def emit(**row) -> None:
    row["device"] = torch.cuda.get_device_name()
    print(json.dumps(row), flush=True)
    with OUT.open("a") as f:
        f.write(json.dumps(row) + "\n")


def pythia(name: str, attn: str = "sdpa") -> GPTNeoXForCausalLM:
    cfg = GPTNeoXConfig(vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25, **SHAPES[name])
    cfg._attn_implementation = attn
    with torch.device("cuda"):
        model = GPTNeoXForCausalLM(cfg).to(torch.float16).eval()
    return model


def ms(fn, reps: int = 30, warmup: int = 5) -> float:
    """Median wall time of fn() in milliseconds, GPU synchronised."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bushy_tree(n: int, branch: int = 3) -> TreeBuilder:
    """A breadth-first tree of n nodes (root included) with `branch` children per node."""
    b = TreeBuilder(1)
    frontier = [0]
    while len(b) < n:
        nxt = []
        for u in frontier:
            for _ in range(branch):
                if len(b) < n:
                    nxt.append(b.add(u, 2 + len(b) % 100, -0.1))
        frontier = nxt
    return b


def kv_for(model, engine: str, buckets, capacity: int):
    vocab = model.config.vocab_size
    if engine == "hf":
        return CachedModel(model, vocab)
    return StaticCachedModel(model, vocab, capacity, compile=engine == "static+compile",
                             compile_mode="reduce-overhead", buckets=buckets)


@torch.inference_mode()
def section_costs(prefix: int) -> None:
    """Verify cost vs tree size (target), level cost vs width (draft), per engine; bandwidth."""
    for name, sizes in (("pythia-2.8b", (1, 32, 64, 128)), ("pythia-70m", (1, 4, 16, 64))):
        model = pythia(name)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for engine in ("hf", "static", "static+compile"):
            t0 = time.perf_counter()
            kv = kv_for(model, engine, sizes, prefix + 300)
            kv.prefill(list(range(2, prefix + 2)))
            base = None
            for n in sizes:
                tree = bushy_tree(n).freeze()

                def step() -> None:
                    tree_forward(kv, tree)
                    kv.compact(prefix, [])

                t = ms(step)
                base = t if n == 1 else base
                emit(section="costs", model=name, engine=engine, prefix=prefix, tree_nodes=n, ms=round(t, 3),
                     ratio_to_one_token=round(t / base, 3),
                     weight_GBps=round(weight_bytes / (t / 1e3) / 1e9, 1) if n == 1 else None,
                     setup_s=round(time.perf_counter() - t0, 1))
        del model
        torch.cuda.empty_cache()


@torch.inference_mode()
def section_kernel() -> None:
    """Attention alone: SDPA (additive mask) vs the block-skipping kernel in BFS and DFS order."""
    heads, dim = 32, 128
    g = torch.Generator().manual_seed(0)
    for n in (256, 512, 1024, 2048):
        parent = [-1] + [int(torch.randint(max(0, i - 64), i, (1,), generator=g)) for i in range(1, n)]
        b = TreeBuilder(0)
        for i in range(1, n):
            b.add(parent[i], 1, -0.1)
        t = b.freeze()
        anc = ancestor_matrix(t.parent, t.depth)
        perm = dfs_order(t.parent)
        masks = {"bfs": anc, "dfs": anc[perm][:, perm]}
        q = torch.randn(1, heads, n, dim, device="cuda", dtype=torch.float16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        for order, mask in masks.items():
            mc = mask.cuda()
            add = torch.zeros(n, n, device="cuda", dtype=torch.float16).masked_fill(~mc, float("-inf"))
            sdpa = ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=add))
            kern = ms(lambda: tree_attention(q, k, v, mc))
            err = (tree_attention(q, k, v, mc) - torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=add)).abs().max().item()
            emit(section="kernel", tree_nodes=n, order=order, blocks=count_blocks(mask), dense_blocks=count_blocks(torch.ones_like(mask)),
                 sdpa_ms=round(sdpa, 4), kernel_ms=round(kern, 4), max_abs_err=err)


@torch.inference_mode()
def section_kernel_in_model(prefix: int) -> None:
    """A whole Pythia-2.8B-shaped verify pass with SDPA vs the kernel (both eager HF engine)."""
    from dynatree.kernels.hf_attention import register

    model = pythia("pythia-2.8b")
    for attn in ("sdpa", register()):
        model.set_attn_implementation(attn)
        for order in ("bfs", "dfs"):
            for n in (64, 128, 256):
                kv = CachedModel(model, model.config.vocab_size)
                kv.prefill(list(range(2, prefix + 2)))
                tree = bushy_tree(n).freeze()

                def step() -> None:
                    tree_forward(kv, tree, order)
                    kv.compact(prefix, [])

                counts = tree_block_counts(tree.parent, tree.depth, prefix)
                emit(section="kernel_in_model", attn=attn, order=order, tree_nodes=n, prefix=prefix, ms=round(ms(step, 20), 3),
                     blocks=counts[order], dense_blocks=counts["dense"])


@torch.inference_mode()
def section_e2e(gguf: str, draft_spec: str, new_tokens: int, num_prompts: int) -> None:
    """The real offline pair in fp16: every strategy on hf and static+compile engines."""
    import dynatree
    from dynatree import models
    from dynatree.bench.datasets import load_prompt_ids

    target, tok = models.load_gguf(Path(gguf), cache_root=Path("/tmp/dtcache"), dtype=torch.float16, device="cuda")
    draft = models.resolve_draft(draft_spec, target, dtype=torch.float16, device="cuda")
    prompts = load_prompt_ids("licenses" if Path("/usr/share/common-licenses").exists() else "pydoc", tok, num_prompts, 128)
    runs = [("autoregressive", {}), ("linear", {"k": 4}), ("fixed", {"depth": 4, "branch": 2, "max_nodes": 32}),
            ("dynatree", {"max_nodes": 63}), ("dyspec", {"max_nodes": 32})]
    hf_ref = {}
    for i, ids in enumerate(prompts):
        x = torch.tensor([ids], device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = target.generate(x, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
        torch.cuda.synchronize()
        hf_ref[i] = out[0, len(ids):].tolist()
        if i > 0:
            emit(section="e2e", engine="hf-generate", strategy="autoregressive", prompt=i,
                 tokens_per_s=round(new_tokens / (time.perf_counter() - t), 1))
    for engine, comp in (("hf", False), ("static", True)):
        for strategy, opts in runs:
            for i, ids in enumerate(prompts):
                r = dynatree.generate(target, draft, ids, strategy, max_new_tokens=new_tokens, eos_token_id=[],
                                      engine=engine, compile=comp, buckets=(1, 4, 16, 64) if engine == "static" else None,
                                      **opts)
                s = r.stats.summary()
                new = r.sequences[0, len(ids):].tolist()
                match = sum(a == b for a, b in zip(new, hf_ref[i])) / len(new)
                first = next((j for j, (a, b) in enumerate(zip(new, hf_ref[i])) if a != b), None)
                if i == 0:
                    continue  # warm-up (and compilation) excluded
                emit(section="e2e", engine=engine + ("+compile" if comp else ""), strategy=strategy, prompt=i,
                     tokens_per_s=round(s["tokens_per_second"], 1), mean_L=round(s["mean_committed"], 3),
                     acceptance=round(s["acceptance"], 3), t_draft=round(s["t_draft"], 4), t_verify=round(s["t_verify"], 4),
                     t_commit=round(s["t_commit"], 4), t_total=round(s["t_total"], 4),
                     match_vs_hf_fp16=round(match, 4), first_mismatch=first)


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="costs,kernel,kernel_in_model")
    ap.add_argument("--out", default="gpu_results.jsonl")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--draft", default="smollm2-135m-distilled")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=5)
    a = ap.parse_args()
    OUT = Path(a.out)
    emit(section="env", torch=torch.__version__, cuda=torch.version.cuda,
         transformers=__import__("transformers").__version__)
    for sec in a.sections.split(","):
        t = time.perf_counter()
        try:
            if sec == "costs":
                section_costs(a.prefix)
            elif sec == "kernel":
                section_kernel()
            elif sec == "kernel_in_model":
                section_kernel_in_model(a.prefix)
            elif sec == "e2e":
                section_e2e(a.gguf, a.draft, a.new_tokens, a.num_prompts)
        except Exception as exc:  # keep the other sections' numbers
            emit(section=sec, error=f"{type(exc).__name__}: {exc}"[:500])
        emit(section=sec, done_s=round(time.perf_counter() - t, 1))


if __name__ == "__main__":
    main()
