"""Our autoregressive decoding against HF's own ``generate`` on this CPU, per few-row linear plan.

Why: the few-row layout tuned on an AMD EPYC made our plain decoding 0.42x HF's speed on an Intel
Sapphire Rapids. Since then the kernel per row count is measured on the user's CPU
(``dynatree.runtime.kernels.linear_plan``). This script times, interleaved in one process on the
embedded target (SmolLM2-135M-Instruct, fp32), greedy decoding of ``--new`` tokens by

* ``hf``: ``target.generate(do_sample=False)``, the reference;
* ``ours-plain``: ``dynatree.generate(..., "autoregressive")`` with ``cpu_linear=False`` (F.linear);
* ``ours-epyc``: the same with ``cpu_linear=True`` (the layout tuned on the EPYC);
* ``ours-default``: the same with the defaults (the plan measured on this CPU);

and records the measured plan, how long measuring it took, and each variant's median tokens per
second over ``--reps`` interleaved rounds with its ratio to HF's (same rounds). Outputs are
compared token for token with HF's.

    python benchmarks/cpu/ar_vs_hf.py --threads 2 --out benchmarks/cpu/ar_vs_hf.json
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("ar_vs_hf.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import dynatree
    from dynatree.bench.sysinfo import machine_info
    from dynatree.loading.models import load_model
    from dynatree.options import EngineOptions, StoppingConfig
    from dynatree.runtime.kernels import linear_plan

    target, tok = load_model("smollm2-135m")
    messages = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]

    kernels = ("linear", "rowmajor", "packed") if linear_plan.packing_applies(target) else ("linear", "rowmajor")
    t0 = time.perf_counter()
    timings = linear_plan.measure(linear_plan.linear_weights(target, linear_plan.MEASURE_BYTES), kernels)
    measure_s = time.perf_counter() - t0
    measured = linear_plan.choose(timings, why="measured by this script")
    default_plan = linear_plan.plan_for(target)  # what a default run uses (cached per machine)

    no_eos = StoppingConfig(eos_token_id=())
    mask = torch.ones_like(ids)

    def hf() -> list[int]:
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.new,
                              min_new_tokens=args.new, pad_token_id=tok.eos_token_id)
        return out[0, ids.shape[1]:].tolist()

    def ours(options: EngineOptions):
        def run() -> list[int]:
            out = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=args.new, options=options,
                                    stopping=no_eos)
            return out.sequences[0, ids.shape[1]:].tolist()
        return run

    variants = {"hf": hf, "ours-plain": ours(EngineOptions(cpu_linear=False)),
                "ours-epyc": ours(EngineOptions(cpu_linear=True)), "ours-default": ours(EngineOptions())}
    for fn in variants.values():  # warm-up (packs weights, fills caches)
        fn()
    rates: dict[str, list[float]] = {k: [] for k in variants}
    outputs: dict[str, list[int]] = {}
    for rep in range(args.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            t = time.perf_counter()
            outputs[name] = variants[name]()
            rates[name].append(len(outputs[name]) / (time.perf_counter() - t))
    ratio = {k: statistics.median(r / h for r, h in zip(rates[k], rates["hf"])) for k in variants}
    result = {
        "script": "benchmarks/cpu/ar_vs_hf.py", "threads": args.threads, "new_tokens": args.new, "reps": args.reps,
        "machine": machine_info(), "measure_seconds": round(measure_s, 2),
        "measured_plan": measured.describe(), "default_plan": default_plan.describe(),
        "timings_ms": {r: {k: round(v * 1e3, 3) for k, v in t.items()} for r, t in timings.items()},
        "tokens_per_second": {k: round(statistics.median(v), 2) for k, v in rates.items()},
        "ratio_to_hf": {k: round(v, 3) for k, v in ratio.items()},
        "same_tokens_as_hf": {k: outputs[k] == outputs["hf"] for k in variants},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("measure_seconds", "measured_plan", "default_plan", "tokens_per_second",
                                             "ratio_to_hf", "same_tokens_as_hf")}, indent=1))


if __name__ == "__main__":
    main()
