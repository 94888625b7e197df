"""GPU measurements: per-round costs, the Triton tree-attention kernel, end to end (issue 19).

Runs on a machine with one NVIDIA GPU and no network. Every number is one JSON line in
``OUT/costs.jsonl`` (the device named in each) or, for end to end, a ``dynatree bench`` row in
``OUT/e2e.jsonl``. Sections (``--sections``, comma-separated, in this order by default):

``env``
    device, versions, measured copy bandwidth (bytes read + written per second) and the nominal
    memory bandwidth where torch reports clock and bus width.
``costs``
    verify cost vs tree size (1..256) on a Pythia-2.8B-shaped target and level cost vs width
    (1..64) on a Pythia-70M-shaped draft -- random fp16 weights: cost does not depend on them --
    for HF eager attention, HF SDPA, the static engine and the compiled static engine
    (``mode="reduce-overhead"``: CUDA graphs); bytes a call must read (weights + KV prefix) and
    the bytes/s achieved against the measured bandwidth.
``e2e``
    the real offline pair (SmolLM2-135M-Instruct from its GGUF, the shipped distilled draft) in
    fp16 through the ``dynatree bench`` runner: HF-eager autoregressive (the HF model called step
    by step, no compile: the reference), our compiled autoregressive, and every strategy on both
    engines, in ONE run group, so every row has its speedup over both baselines and its greedy
    match against autoregressive (fp16 near-ties can flip an argmax: measured, never hidden).
    Then one more run per strategy records the trees it builds (``OUT/trees.jsonl``).
``kernel``
    attention alone: the Triton block-skipping kernel vs SDPA with the additive tree mask, BFS vs
    DFS order, on the trees ``e2e`` recorded (sizes the policies build) and on bushy trees of the
    policies' node budgets; with a Pythia-2.8B-shaped head layout and prefix.
``kernel_in_model``
    one whole target verify, SDPA vs the kernel, BFS vs DFS.
``report``
    ``OUT/costs.md`` and PNG plots from ``costs.jsonl`` (``dynatree report`` makes the e2e report).

``--smoke`` runs the same code on CPU with tiny shapes in seconds (the test suite does): fp16 on
CPU, the Triton kernel under its interpreter (``TRITON_INTERPRET=1``), synchronisation through
``torch.cpu``, and ``torch.compile`` with a backend that stands in for CUDA graphs: it replays
each graph into output buffers it owns (a caller that keeps an output without copying sees it
overwritten, as after a CUDA-graph replay) and counts static inputs (weights, the static KV
cache) whose address changed since capture (a GPU run would re-record). Inductor's own code
generation is torch's and takes minutes per graph on a small CPU, so the smoke run skips it; a GPU
run can then only fail on what is truly GPU-specific.

    bash benchmarks/gpu/run.sh --gguf /tmp/SmolLM2-135M-Instruct.Q4_1.gguf     # the GPU command
    python benchmarks/gpu/gpu_bench.py --smoke --out /tmp/smoke                 # CPU, seconds
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:  # Triton reads this when first imported (transformers may import it)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from dynatree.runtime.cache import CachedModel, StaticCachedModel
from dynatree.runtime.devices import check_device
from dynatree.core.tree import TokenTree, TreeBuilder, ancestor_matrix, dfs_order
from dynatree.core.verify import tree_forward

PYTHIA = {
    "pythia-2.8b": {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 10240,
                        "vocab_size": 50304},
    "pythia-70m": {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
                       "vocab_size": 50304},
}
TINY = {
    "tiny-target": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
                        "vocab_size": 128},
    "tiny-draft": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                       "vocab_size": 128},
}
# Every strategy, sized to fit the static buckets below (a tree of n drafted nodes is n + 1 rows).
E2E_DRAFTING = ("linear:k=4@linear-4", "fixed:max_nodes=127@fixed", "dynatree@dynatree", "dyspec@dyspec",
                "dyspec-threshold:max_nodes=127@dyspec-threshold")
COMPILED = "engine=static:compile=true"


@dataclass(frozen=True)
class Plan:
    """Everything that differs between the GPU run and the CPU smoke run; the code is shared."""

    device: torch.device
    dtype: torch.dtype
    smoke: bool
    target: str  # shape names (keys of PYTHIA or TINY)
    draft: str
    verify_sizes: tuple[int, ...]  # tree rows of a target verify
    compiled_sizes: tuple[int, ...]  # the same for the compiled engine (one CUDA graph each)
    level_sizes: tuple[int, ...]  # widths of a draft level
    prefix: int
    reps: int
    warmup: int
    copy_bytes: int  # tensor size of the bandwidth measurement
    kernel_budgets: tuple[int, ...]  # node budgets of the policies (synthetic trees for `kernel`)
    kernel_recorded: int | None  # how many recorded policy trees `kernel` times (smallest first; None: all)
    e2e_prompts: int
    e2e_prompt_tokens: int
    e2e_new_tokens: int
    e2e_buckets: tuple[int, ...]
    e2e_warmup: int
    shapes: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def sync(self) -> Callable[[], None]:
        return torch.get_device_module(self.device).synchronize


def gpu_plan(device: str, prompts: int, new_tokens: int) -> Plan:
    return Plan(device=check_device(device, torch.float16), dtype=torch.float16, smoke=False,
                target="pythia-2.8b", draft="pythia-70m",
                verify_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), compiled_sizes=(1, 4, 16, 32, 64, 128, 256),
                level_sizes=(1, 2, 4, 8, 16, 32, 64), prefix=512, reps=30, warmup=5, copy_bytes=1 << 30,
                kernel_budgets=(16, 64, 128, 256, 768), kernel_recorded=None, e2e_prompts=prompts, e2e_prompt_tokens=128,
                e2e_new_tokens=new_tokens, e2e_buckets=(1, 4, 16, 64, 128), e2e_warmup=1, shapes=PYTHIA)


def smoke_plan() -> Plan:
    return Plan(device=torch.device("cpu"), dtype=torch.float16, smoke=True, target="tiny-target", draft="tiny-draft",
                verify_sizes=(1, 4), compiled_sizes=(1, 4), level_sizes=(1, 4), prefix=16, reps=1, warmup=1,
                copy_bytes=1 << 20, kernel_budgets=(9,), kernel_recorded=1, e2e_prompts=1, e2e_prompt_tokens=12, e2e_new_tokens=6,
                e2e_buckets=(1, 128), e2e_warmup=0, shapes=TINY)


# ----------------------------------------------------------------------------------------- output
class Sink:
    """Appends JSON rows to a file (flushed per row, so a killed section keeps what it measured)."""

    def __init__(self, path: Path, device_name: str) -> None:
        self.path, self.device_name = path, device_name
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, **row: Any) -> None:
        row = {"device": self.device_name, **row}
        line = json.dumps(row)
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from dynatree.bench.sysinfo import machine_info

    return f"CPU {machine_info()['cpu']} (smoke)"


# ----------------------------------------------------------------------------- CUDA-graph stand-in
@dataclass
class GraphEmulationStats:
    graphs: int = 0
    replays: int = 0
    rerecords: int = 0  # static inputs whose address changed since capture


EMULATION = GraphEmulationStats()


def cuda_graph_emulation(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Dynamo backend for the CPU smoke run: what CUDA-graph replay does to the caller, on CPU.

    A replayed CUDA graph writes its outputs into the same buffers every time and reads weights
    and the static cache from the addresses recorded at capture. So outputs land in buffers this
    graph owns (overwritten by the next replay), and a static input that moved is counted.
    """
    EMULATION.graphs += 1
    static = [i for i, x in enumerate(example_inputs)
              if isinstance(x, torch.Tensor) and (isinstance(x, torch.nn.Parameter) or hasattr(x, "_dynamo_static_input_type"))]
    addresses = {i: example_inputs[i].data_ptr() for i in static}
    buffers: list[Any] | None = None

    def replay(*args: Any) -> Any:
        nonlocal buffers
        EMULATION.replays += 1
        for i in static:
            if args[i].data_ptr() != addresses[i]:
                EMULATION.rerecords += 1
                addresses[i] = args[i].data_ptr()
        outs = gm(*args)
        flat = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        if buffers is None:
            buffers = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in flat]
        else:
            for b, o in zip(buffers, flat):
                if isinstance(b, torch.Tensor):
                    b.copy_(o)
        result = list(buffers)
        return type(outs)(result) if isinstance(outs, (list, tuple)) else result[0]

    return replay


@contextlib.contextmanager
def smoke_compiler(plan: Plan) -> Iterator[None]:
    """In the smoke run, ``torch.compile(..., mode=...)`` uses :func:`cuda_graph_emulation`."""
    if not plan.smoke:
        yield
        return
    real = torch.compile

    def compile_(model: Any = None, *, mode: str | None = None, **kwargs: Any) -> Any:
        kwargs.pop("backend", None)
        return real(model, backend=cuda_graph_emulation, **kwargs)

    torch.compile = compile_  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real  # type: ignore[assignment]


# ---------------------------------------------------------------------------------------- helpers
def random_model(plan: Plan, name: str, attn: str = "sdpa") -> GPTNeoXForCausalLM:
    """A Pythia-shaped (or tiny) GPTNeoX with random weights on the plan's device and dtype."""
    cfg = GPTNeoXConfig(max_position_embeddings=2048, rotary_pct=0.25, **plan.shapes[name])
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(plan.device):
        return GPTNeoXForCausalLM(cfg).to(plan.dtype).eval()


def median_ms(plan: Plan, fn: Callable[[], Any], reps: int | None = None) -> float:
    """Median wall time of ``fn()`` in ms, synchronised (device work finished) before each stop."""
    for _ in range(plan.warmup):
        fn()
    plan.sync()
    times = []
    for _ in range(reps or plan.reps):
        t = time.perf_counter()
        fn()
        plan.sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bushy_tree(n: int, branch: int = 3) -> TokenTree:
    """A breadth-first tree of ``n`` nodes (root included), ``branch`` children per node."""
    b = TreeBuilder(1)
    frontier = [0]
    while len(b) < n:
        nxt = []
        for u in frontier:
            for _ in range(branch):
                if len(b) < n:
                    nxt.append(b.add(u, 2 + len(b) % 60, -0.1))
        frontier = nxt
    return b.freeze()


def tree_from_parents(parent: Sequence[int]) -> TokenTree:
    b = TreeBuilder(1)
    for i in range(1, len(parent)):
        b.add(int(parent[i]), 2 + i % 60, -0.1)
    return b.freeze()


def read_bytes(model: torch.nn.Module, prefix: int) -> int:
    """Bytes one call must read: every weight but the input embedding table (a few rows are read),
    plus the keys and values of the cached prefix."""
    cfg = model.config
    emb = model.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) - emb.numel() * emb.element_size()
    kv = 2 * cfg.num_hidden_layers * prefix * cfg.hidden_size * emb.element_size()
    return weights + kv


def make_kv(plan: Plan, model: torch.nn.Module, variant: str, sizes: Sequence[int]) -> CachedModel:
    vocab = model.config.vocab_size
    if variant.startswith("hf"):
        return CachedModel(model, vocab)
    return StaticCachedModel(model, vocab, plan.prefix + 300, compile=variant == "static-compiled",
                             compile_mode="reduce-overhead", buckets=sizes)


# --------------------------------------------------------------------------------------- sections
@torch.inference_mode()
def section_env(plan: Plan, sink: Sink) -> dict[str, Any]:
    import transformers

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    n = plan.copy_bytes
    src = torch.empty(n, dtype=torch.uint8, device=plan.device)
    dst = torch.empty_like(src)
    copy_ms = median_ms(plan, lambda: dst.copy_(src), 10)
    nominal = None
    if plan.device.type == "cuda":
        props = torch.cuda.get_device_properties(plan.device)
        clock, bus = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
        nominal = 2 * clock * 1e3 * bus / 8 if clock and bus else None  # kHz, bits, double data rate
    row = {"section": "env", "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
               "triton": triton_version, "dtype": str(plan.dtype).removeprefix("torch."), "smoke": plan.smoke,
               "copy_bytes": n, "copy_GBps": round(2 * n / (copy_ms / 1e3) / 1e9, 1),
               "nominal_GBps": round(nominal / 1e9, 1) if nominal else None}
    sink.emit(**row)
    return row


@torch.inference_mode()
def section_costs(plan: Plan, sink: Sink, bandwidth_GBps: float) -> None:
    """Verify cost vs tree rows (target) and level cost vs width (draft), per engine variant."""
    for role, name, sizes in (("target", plan.target, plan.verify_sizes), ("draft", plan.draft, plan.level_sizes)):
        for variant in ("hf-eager", "hf-sdpa", "static", "static-compiled"):
            model = random_model(plan, name, "eager" if variant == "hf-eager" else "sdpa")
            nbytes = read_bytes(model, plan.prefix)
            run_sizes = tuple(s for s in sizes if s in plan.compiled_sizes) if variant == "static-compiled" else sizes
            t0 = time.perf_counter()
            kv = make_kv(plan, model, variant, run_sizes)
            kv.prefill(list(range(2, plan.prefix + 2)))
            base = None
            for n in run_sizes:
                tree = bushy_tree(n)

                def step(kv: CachedModel = kv, tree: TokenTree = tree) -> None:
                    tree_forward(kv, tree)
                    kv.compact(plan.prefix, [])

                ms = median_ms(plan, step)
                base = ms if base is None else base
                gbps = nbytes / (ms / 1e3) / 1e9
                sink.emit(section="costs", role=role, model=name, variant=variant, prefix=plan.prefix, rows=n,
                          ms=round(ms, 4), ratio_to_one_row=round(ms / base, 3), read_bytes=nbytes,
                          GBps=round(gbps, 1), bandwidth_fraction=round(gbps / bandwidth_GBps, 3),
                          setup_and_first_s=round(time.perf_counter() - t0, 1), **emulation_fields(plan, variant))
            del kv, model
            if plan.device.type == "cuda":
                torch.cuda.empty_cache()


def emulation_fields(plan: Plan, variant: str) -> dict[str, Any]:
    if variant != "static-compiled":
        return {}
    if not plan.smoke:
        return {"compile_backend": "inductor (mode=reduce-overhead: CUDA graphs)"}
    return {"compile_backend": "cuda-graph-emulation", "graphs": EMULATION.graphs, "replays": EMULATION.replays,
            "rerecords": EMULATION.rerecords}


def kernel_shapes(plan: Plan) -> tuple[int, int]:
    cfg = plan.shapes[plan.target]
    heads = cfg["num_attention_heads"]
    return heads, cfg["hidden_size"] // heads


def load_trees(path: Path) -> list[tuple[str, TokenTree]]:
    """The recorded policy trees: per strategy the largest and the median-sized one."""
    if not path.exists():
        return []
    by_label: dict[str, list[list[int]]] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        by_label.setdefault(rec["label"], []).append(rec["parent"])
    out = []
    for label, trees in by_label.items():
        trees = sorted(trees, key=len)
        for which, parent in (("median", trees[len(trees) // 2]), ("largest", trees[-1])):
            if len(parent) > 1:
                out.append((f"{label}:{which}", tree_from_parents(parent)))
    return out


@torch.inference_mode()
def section_kernel(plan: Plan, sink: Sink, trees_path: Path) -> None:
    """Attention alone over prefix + tree: SDPA (additive mask) vs the kernel, BFS vs DFS order."""
    from dynatree.runtime.kernels.tree_attention import count_blocks, tree_attention

    heads, dim = kernel_shapes(plan)
    recorded = sorted(load_trees(trees_path), key=lambda item: item[1].size)[: plan.kernel_recorded]
    trees = recorded + [(f"bushy-{n}", bushy_tree(n)) for n in plan.kernel_budgets]
    g = torch.Generator().manual_seed(0)
    for source, t in trees:
        n, keys = t.size, plan.prefix + t.size
        anc = ancestor_matrix(t.parent, t.depth)
        perm = dfs_order(t.parent)
        q = torch.randn(1, heads, n, dim, generator=g).to(plan.device, plan.dtype)
        k = torch.randn(1, heads, keys, dim, generator=g).to(plan.device, plan.dtype)
        v = torch.randn_like(k)
        for order, tree_mask in (("bfs", anc), ("dfs", anc[perm][:, perm])):
            mask = torch.ones(n, keys, dtype=torch.bool)
            mask[:, plan.prefix:] = tree_mask
            mask = mask.to(plan.device)
            add = torch.zeros(n, keys, device=plan.device, dtype=plan.dtype).masked_fill(~mask, float("-inf"))
            def sdpa(q=q, k=k, v=v, add=add) -> torch.Tensor:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=add)

            def kern(q=q, k=k, v=v, mask=mask) -> torch.Tensor:
                return tree_attention(q, k, v, mask)

            err = (kern().float() - sdpa().float()).abs().max().item()
            sdpa_ms, kern_ms = median_ms(plan, sdpa), median_ms(plan, kern)
            sink.emit(section="kernel", tree=source, nodes=n, depth=t.max_depth, prefix=plan.prefix, heads=heads,
                      head_dim=dim, order=order, blocks=count_blocks(mask), dense_blocks=count_blocks(torch.ones_like(mask)),
                      sdpa_ms=round(sdpa_ms, 4), kernel_ms=round(kern_ms, 4),
                      kernel_speedup=round(sdpa_ms / kern_ms, 3), max_abs_err=err)


@torch.inference_mode()
def section_kernel_in_model(plan: Plan, sink: Sink) -> None:
    """A whole target verify (hf engine) with SDPA vs the kernel registered as attention, BFS vs DFS."""
    from dynatree.runtime.kernels.hf_attention import register
    from dynatree.runtime.kernels.tree_attention import tree_block_counts

    model = random_model(plan, plan.target)
    sizes = [n for n in plan.verify_sizes if n >= 4]
    try:
        for attn in ("sdpa", register()):
            model.set_attn_implementation(attn)
            for order in ("bfs", "dfs"):
                for n in sizes:
                    kv = CachedModel(model, model.config.vocab_size)
                    kv.prefill(list(range(2, plan.prefix + 2)))
                    tree = bushy_tree(n)

                    def step(kv: CachedModel = kv, tree: TokenTree = tree, order: str = order) -> None:
                        tree_forward(kv, tree, order)
                        kv.compact(plan.prefix, [])

                    counts = tree_block_counts(tree.parent, tree.depth, plan.prefix)
                    sink.emit(section="kernel_in_model", attn=attn, order=order, rows=n, prefix=plan.prefix,
                              ms=round(median_ms(plan, step), 4), blocks=counts[order], dense_blocks=counts["dense"])
    finally:
        model.set_attn_implementation("sdpa")


def e2e_specs() -> str:
    """HF-eager AR (reference), our compiled AR, then every strategy on the hf and compiled engines."""
    specs = ["autoregressive@ar-hf-eager", f"autoregressive:{COMPILED}@ar-compiled"]
    for spec in E2E_DRAFTING:
        body, label = spec.split("@")
        specs += [f"{body}@{label}", f"{body}:{COMPILED}@{label}-compiled"]
    return ",".join(specs)


def e2e_models(plan: Plan, gguf: str | None, draft: str
               ) -> tuple[torch.nn.Module, torch.nn.Module, list[list[int]], str, str]:
    """(target, draft, prompt ids, target name, draft name): the offline pair on the GPU, tiny Llamas
    in the smoke run."""
    if plan.smoke:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5,
                          max_position_embeddings=256, bos_token_id=0, eos_token_id=1)
        cfg._attn_implementation = "sdpa"
        target = LlamaForCausalLM(cfg).eval()
        dmodel = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():  # a draft that agrees with the target only partly
            for p, q in zip(dmodel.parameters(), target.parameters()):
                p.copy_(q + 0.03 * q.std() * torch.randn_like(q) if q.numel() > 1 else q)
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(2, 128, (plan.e2e_prompt_tokens,), generator=g).tolist() for _ in range(plan.e2e_prompts)]
        return target.to(plan.dtype), dmodel.to(plan.dtype), prompts, "tiny-llama", "tiny-llama-perturbed"
    from dynatree.loading import models
    from dynatree.bench.datasets import load_prompt_ids
    from dynatree.text.corpora import LICENCES_DIR
    from dynatree.errors import DynaTreeError

    if gguf is None:
        raise DynaTreeError("e2e needs --gguf PATH (the SmolLM2-135M-Instruct GGUF; see benchmarks/gpu/README.md)")
    target, tok = models.load_gguf(Path(gguf), dtype=plan.dtype, device=plan.device)
    dmodel = models.resolve_draft(draft, target, dtype=plan.dtype, device=plan.device)
    dataset = "licenses" if LICENCES_DIR.is_dir() else "pydoc"
    prompts = load_prompt_ids(dataset, tok, plan.e2e_prompts, plan.e2e_prompt_tokens)
    return target, dmodel, prompts, f"smollm2-135m ({Path(gguf).name})", draft


def section_e2e(plan: Plan, sink: Sink, out_dir: Path, gguf: str | None, draft_spec: str) -> None:
    """The pair through the bench runner (one run group), a summary row per label, recorded trees."""
    from dynatree.cli.bench import print_summary
    from dynatree.bench.metrics import summarize
    from dynatree.bench.runner import BenchSettings, Prompt, run_bench
    from dynatree.bench.specs import parse_strategies
    from dynatree.bench.store import ResultsWriter

    target, draft, ids, target_name, draft_name = e2e_models(plan, gguf, draft_spec)
    prompts = [Prompt(id=f"e2e:{i}", ids=tuple(p[: plan.e2e_prompt_tokens])) for i, p in enumerate(ids)]
    specs = parse_strategies(e2e_specs())
    settings = BenchSettings(target=target_name, draft=draft_name, dataset="licenses/pydoc" if not plan.smoke else "random",
                             max_new_tokens=plan.e2e_new_tokens, max_prompt_tokens=plan.e2e_prompt_tokens,
                             dtype=str(plan.dtype).removeprefix("torch."), device=str(plan.device),
                             threads=torch.get_num_threads(), eos_token_id=(), buckets=plan.e2e_buckets,
                             cpu_linear=False,  # the GPU path (the CPU-only layout is off on CUDA)
                             extra={"smoke": plan.smoke})
    with ResultsWriter(out_dir / "e2e.jsonl") as writer:
        outcome = run_bench(target, draft, prompts, specs, settings, writer=writer, warmup=plan.e2e_warmup,
                            warmup_tokens=plan.e2e_new_tokens, progress=False, origin="bench")
    summaries = summarize(outcome.rows)
    print_summary(summaries, f"{sink.device_name} · {settings.dtype} · T = {plan.e2e_new_tokens}")
    for s in summaries:
        rows = [r for r in outcome.rows if r["label"] == s.label]
        tokens = [token_match(ref, r) for r in rows for ref in [reference_of(outcome.rows, r)]]
        tps = s.get("throughput")
        sink.emit(section="e2e", label=s.label, strategy=s.strategy, engine=rows[0]["engine"], prompts=s.prompts,
                  tokens_per_s=round(tps.mean, 2) if tps else None,
                  speedup_vs_ar_hf_eager=_round(s.speedups.get("ar-hf-eager")),
                  speedup_vs_ar_compiled=_round(s.speedups.get("ar-compiled")),
                  mean_L=_round(s.get("L").mean if s.get("L") else None),
                  greedy_match_rate=round(sum(bool(r["greedy_match"]) for r in rows) / len(rows), 4),
                  token_match_rate=round(statistics.mean(tokens), 4), **emulation_fields(plan, "static-compiled"))
    record_trees(plan, target, draft, prompts[0], specs, out_dir / "trees.jsonl")


def _round(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def reference_of(rows: list[dict[str, Any]], row: dict[str, Any]) -> list[int]:
    return next(r["output_ids"] for r in rows if r["reference"] and r["prompt_id"] == row["prompt_id"])


def token_match(reference: Sequence[int], row: dict[str, Any]) -> float:
    """Share of positions where the output equals the reference (after a flip the rest usually differs too)."""
    out = row["output_ids"]
    return sum(a == b for a, b in zip(out, reference)) / max(len(reference), 1)


def record_trees(plan: Plan, target: torch.nn.Module, draft: torch.nn.Module, prompt: Any, specs: list[Any],
                 path: Path) -> None:
    """One run per drafting strategy (hf engine) with tree_forward wrapped to keep every tree's shape."""
    import dynatree
    from dynatree.loop import generate as engine
    from dynatree.options import EngineOptions, StoppingConfig

    real = engine.tree_forward
    current: list[list[int]] = []

    def recording(kv: Any, tree: TokenTree, *args: Any, **kwargs: Any) -> Any:
        current.append(tree.parent.tolist())
        return real(kv, tree, *args, **kwargs)

    path.unlink(missing_ok=True)
    engine.tree_forward = recording
    try:
        with path.open("w") as f:
            for spec in specs:
                if not spec.uses_draft or spec.run.get("compile"):
                    continue
                current.clear()
                dynatree.generate(target, draft, list(prompt.ids), spec.name, max_new_tokens=plan.e2e_new_tokens,
                                  stopping=StoppingConfig(eos_token_id=()), seed=0,
                                  options=EngineOptions(cpu_linear=False), **spec.policy_options)
                for parent in current:
                    f.write(json.dumps({"label": spec.label, "parent": parent}) + "\n")
    finally:
        engine.tree_forward = real


def section_report(out_dir: Path) -> None:
    """``costs.md`` (tables) and ``costs.png`` / ``kernel.png`` from ``costs.jsonl``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (out_dir / "costs.jsonl").read_text().splitlines() if line.strip()]
    device = next((r["device"] for r in rows), "?")
    md = [f"# GPU kit results: {device}", ""]
    rows = [r for r in rows if "done_s" not in r]
    env = [r for r in rows if r["section"] == "env" and "error" not in r]
    if env:
        e = env[-1]
        md += [(f"torch {e['torch']}, CUDA {e['cuda']}, transformers {e['transformers']}, triton {e['triton']}, "
                f"{e['dtype']}. Copy bandwidth measured {e['copy_GBps']} GB/s (read + write); nominal "
                f"{e['nominal_GBps']} GB/s."), ""]
    costs = [r for r in rows if r["section"] == "costs" and "error" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, role in zip(axes, ("target", "draft")):
        sub = [r for r in costs if r["role"] == role]
        if not sub:
            continue
        md += [f"## {role} ({sub[0]['model']}): ms per call vs rows (ratio to one row; share of bandwidth)", "",
               "| variant | " + " | ".join(str(n) for n in sorted({r["rows"] for r in sub})) + " |",
               "|---|" + "---|" * len({r["rows"] for r in sub})]
        for variant in dict.fromkeys(r["variant"] for r in sub):
            vr = {r["rows"]: r for r in sub if r["variant"] == variant}
            cells = [f"{vr[n]['ms']:.3g} ({vr[n]['ratio_to_one_row']:.2f}x; {vr[n]['bandwidth_fraction']:.0%})"
                     if n in vr else "—" for n in sorted({r["rows"] for r in sub})]
            md.append(f"| {variant} | " + " | ".join(cells) + " |")
            ax.plot(sorted(vr), [vr[n]["ms"] for n in sorted(vr)], marker="o", label=variant)
        md.append("")
        ax.set(xscale="log", xlabel="rows per call (tree nodes / level width)", ylabel="ms", title=f"{role}: {sub[0]['model']}")
        ax.legend()
    fig.suptitle(device)
    fig.tight_layout()
    fig.savefig(out_dir / "costs.png", dpi=110)
    plt.close(fig)
    kern = [r for r in rows if r["section"] == "kernel" and "error" not in r]
    if kern:
        md += ["## Triton kernel vs SDPA (attention alone, prefix + tree)", "",
               "| tree | nodes | order | blocks / dense | SDPA ms | kernel ms | kernel speedup | max err |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['tree']} | {r['nodes']} | {r['order']} | {r['blocks']}/{r['dense_blocks']} | {r['sdpa_ms']} | "
               f"{r['kernel_ms']} | {r['kernel_speedup']} | {r['max_abs_err']:.2g} |" for r in kern]
        md.append("")
        fig, ax = plt.subplots(figsize=(6, 4))
        for order in ("bfs", "dfs"):
            sub = sorted((r for r in kern if r["order"] == order), key=lambda r: r["nodes"])
            ax.scatter([r["nodes"] for r in sub], [r["kernel_speedup"] for r in sub], label=f"kernel, {order}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xscale="log", xlabel="tree nodes", ylabel="SDPA ms / kernel ms", title=device)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "kernel.png", dpi=110)
        plt.close(fig)
    inmodel = [r for r in rows if r["section"] == "kernel_in_model" and "error" not in r]
    if inmodel:
        md += ["## Whole verify: SDPA vs kernel (ms)", "", "| attention | order | " +
               " | ".join(str(n) for n in sorted({r["rows"] for r in inmodel})) + " |",
               "|---|---|" + "---|" * len({r["rows"] for r in inmodel})]
        for key in dict.fromkeys((r["attn"], r["order"]) for r in inmodel):
            vr = {r["rows"]: r["ms"] for r in inmodel if (r["attn"], r["order"]) == key}
            md.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{vr[n]:.3g}" for n in sorted(vr)) + " |")
        md.append("")
    e2e = [r for r in rows if r["section"] == "e2e" and "error" not in r]
    if e2e:
        md += ["## End to end (fp16): speedups from ONE run group", "",
               "| label | engine | tok/s | × ar-hf-eager | × ar-compiled | L̄ | greedy match (prompts) | token match |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['label']} | {r['engine']['engine']}{'+compile' if r['engine']['compile'] else ''} | "
               f"{r['tokens_per_s']} | {r['speedup_vs_ar_hf_eager']} | {r['speedup_vs_ar_compiled']} | {r['mean_L']} | "
               f"{r['greedy_match_rate']:.0%} | {r['token_match_rate']:.1%} |" for r in e2e]
        md.append("")
    errors = [r for r in rows if "error" in r]
    if errors:
        md += ["## Sections that failed", ""] + [f"- {r['section']}: `{r['error']}`" for r in errors] + [""]
    md += ["![costs](costs.png)", ""] + (["![kernel](kernel.png)", ""] if kern else [])
    (out_dir / "costs.md").write_text("\n".join(md), encoding="utf-8")


SECTIONS = ("env", "costs", "e2e", "kernel", "kernel_in_model", "report")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, from {', '.join(SECTIONS)}")
    ap.add_argument("--out", default="gpu-results", help="output folder (costs.jsonl, e2e.jsonl, trees.jsonl, costs.md, PNGs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gguf", default=None, help="SmolLM2-135M-Instruct GGUF (the e2e target)")
    ap.add_argument("--draft", default="smollm2-135m-distilled")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, seconds (what the test suite runs)")
    a = ap.parse_args(argv)
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; choose from {SECTIONS}")
    from dynatree.errors import DynaTreeError

    try:
        plan = smoke_plan() if a.smoke else gpu_plan(a.device, a.num_prompts, a.new_tokens)
    except DynaTreeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if plan.device.type == "cuda" and plan.device.index is not None:
        torch.cuda.set_device(plan.device)  # so that synchronize() waits for the right GPU
    threads = torch.get_num_threads()
    if plan.smoke:  # tiny matrices: one thread is fastest, and the test machine may be busy
        torch.set_num_threads(1)
    try:
        return run_sections(plan, sections, Path(a.out), a.gguf, a.draft)
    finally:
        torch.set_num_threads(threads)


def run_sections(plan: Plan, sections: Sequence[str], out: Path, gguf: str | None, draft: str) -> int:
    """Run the sections in order; a failing one becomes an error row and the others still run."""
    sink = Sink(out / "costs.jsonl", device_name(plan.device))
    bandwidth = None
    failed = 0
    with smoke_compiler(plan):
        for sec in sections:
            t = time.perf_counter()
            try:
                if sec == "env" or (sec == "costs" and bandwidth is None):
                    env = section_env(plan, sink)
                    bandwidth = env["copy_GBps"]
                if sec == "costs":
                    section_costs(plan, sink, bandwidth)
                elif sec == "kernel":
                    section_kernel(plan, sink, out / "trees.jsonl")
                elif sec == "kernel_in_model":
                    section_kernel_in_model(plan, sink)
                elif sec == "e2e":
                    section_e2e(plan, sink, out, gguf, draft)
                elif sec == "report":
                    section_report(out)
            except Exception as exc:  # noqa: BLE001 -- keep the other sections' numbers; the error is a row too
                failed += 1
                sink.emit(section=sec, error=f"{type(exc).__name__}: {exc}"[:500])
                import traceback

                traceback.print_exc()
            sink.emit(section=sec, done_s=round(time.perf_counter() - t, 1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
