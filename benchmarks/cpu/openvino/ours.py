"""Our side of the OpenVINO comparison: HF greedy ``generate``; our autoregressive decoding, our
default (draft model + text) and the text alone, on the eager engine (``engine="hf"``) and on the
ahead-of-time compiled one (``engine="aot"``, its packages built before the first pass and the
build time recorded); on Spec-Bench's first turns (2 questions per task, 12 prompts), each prompt to
HF greedy's own end (its EOS, or 192 tokens), 2 interleaved passes. Writes the prompts and HF's
outputs for ``openvino_side.py`` (which must reproduce them) and our rates: pooled (all tokens over
all time) and the mean of per-prompt rates.

    python benchmarks/cpu/openvino/ours.py --dir /tmp/ov   # then openvino_side.py in its own venv
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ov"), help="where the HF folder, prompts and outputs go")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=192)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import machine_info
    from dynatree.loading import models

    from dynatree.bench.sysinfo import provenance

    code = provenance().get("code")  # (at the start: the code that runs, not what the tree holds after)
    target, tok = models.load_model("smollm2-135m")
    draft = models.resolve_draft("smollm2-135m-distilled", target)
    args.dir.mkdir(parents=True, exist_ok=True)
    target.save_pretrained(args.dir / "hf")  # (what optimum-intel exports to OpenVINO's format)
    tok.save_pretrained(args.dir / "hf")
    prompts = specbench_prompts("spec-bench", tok, 2, 2048, first_turns=True)
    t0 = time.perf_counter()
    dynatree.precompile(target, draft, 4096, dynatree.EngineOptions(engine="aot"))  # (built, or loaded: timed)
    aot_ready_s = time.perf_counter() - t0
    for engine in ("hf", "aot"):  # (first-use timings: the linear plan, the cost profiles; warm-up)
        dynatree.generate(target, draft, prompts[0][1], max_new_tokens=8, options=dynatree.EngineOptions(engine=engine))

    runs = {  # name: (engine, draft model, text)
        "ours-autoregressive": ("hf", False, False), "ours-default": ("hf", True, True),
        "ours-autoregressive-aot": ("aot", False, False), "ours-default-aot": ("aot", True, True),
        "ours-text-aot": ("aot", False, True),
    }
    rates: dict[str, list[float]] = {"hf": [], **{name: [] for name in runs}}
    pooled: dict[str, list[float]] = {name: [0, 0.0] for name in rates}  # tokens, seconds
    refs: dict[str, list[int]] = {}
    equal = 0
    for rep in range(2):
        for pid, ids in prompts:
            for name in rates:
                t0 = time.perf_counter()
                if name == "hf":
                    out = target.generate(torch.tensor([ids]), max_new_tokens=args.new, do_sample=False)[0, len(ids):]
                else:
                    engine, model, text = runs[name]
                    out = dynatree.generate(target, draft if model else None, ids,
                                            "dynatree" if model or text else "autoregressive", text=text,
                                            max_new_tokens=args.new,
                                            options=dynatree.EngineOptions(engine=engine)).sequences[0, len(ids):]
                dt = time.perf_counter() - t0
                out = out.tolist()
                rates[name].append(len(out) / dt)
                pooled[name][0] += len(out)
                pooled[name][1] += dt
                if name == "hf":
                    refs[pid] = out
                else:
                    equal += out == refs[pid]
    (args.dir / "prompts.json").write_text(json.dumps({"prompts": prompts, "refs": refs}))
    from dynatree.runtime import aot_store

    builds = [json.loads(p.read_text()).get("build_s") for p in aot_store.cache_dir().glob("*.json")]
    result = {"machine": machine_info(), "threads": args.threads, "prompts": len(prompts), "passes": 2,
              "date": time.strftime("%Y-%m-%d"), "code": code,
              "tokens_per_second": {k: round(statistics.mean(v), 1) for k, v in rates.items()},
              "pooled_tokens_per_second": {k: round(n / t, 1) for k, (n, t) in pooled.items()},
              "aot_ready_s": round(aot_ready_s, 1), "aot_package_build_s": sorted(b for b in builds if b is not None),
              "outputs_equal_to_hf": f"{equal} of {2 * (len(rates) - 1) * len(prompts)}",
              "lengths": [len(v) for v in refs.values()]}
    (args.dir / "ours.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
