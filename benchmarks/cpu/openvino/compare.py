"""Our decoding against OpenVINO GenAI's on one CPU, interleaved prompt by prompt (README.md).

HF greedy ``generate``; our autoregressive decoding, our default (draft model + text) and the text
alone, on the eager engine (``engine="hf"``) and on the ahead-of-time compiled one (``engine="aot"``,
its packages built or loaded before the first pass, the time recorded); OpenVINO GenAI plain and
with prompt lookup, in a worker process of its own virtual environment (``openvino_worker.py``:
only one side runs at a time). Spec-Bench's first turns, 2 questions per task (12 prompts), each
prompt to HF greedy's own end (its EOS, or 192 tokens). HF's outputs are taken first (its warm-up);
then every decoder decodes the first prompt once (theirs), and ``--passes`` passes follow, each
running every decoder on each prompt in turn, the order reversed from one prompt to the next, so
a slow spell of the machine falls on all of them alike. Every output is checked against HF's.

Per decoder and pass: the tokens and the seconds (prefill included), and so a pooled rate (all
tokens over all time); the file gives each pass's and their median.

    python benchmarks/cpu/openvino/compare.py --dir /tmp/ov --prepare     # the HF folder to export
    python benchmarks/cpu/openvino/compare.py --dir /tmp/ov --ov-python /tmp/ov/venv/bin/python --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

#: ours: decoder -> (engine, with the draft model, with the text draft)
OURS = {"ours-autoregressive": ("hf", False, False), "ours-default": ("hf", True, True),
        "ours-autoregressive-aot": ("aot", False, False), "ours-default-aot": ("aot", True, True),
        "ours-text-aot": ("aot", False, True)}
THEIRS = {"openvino-plain": "plain", "openvino-prompt-lookup": "prompt-lookup"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ov"), help="the HF folder and OpenVINO IR's home")
    ap.add_argument("--prepare", action="store_true", help="only save the embedded target as an HF folder")
    ap.add_argument("--ov-python", help="the python of OpenVINO's virtual environment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=192)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--questions", type=int, default=2, help="Spec-Bench questions per task")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import machine_info, provenance
    from dynatree.loading import models
    from dynatree.runtime import aot_store

    code = provenance().get("code")  # (at the start: the code that runs, not what the tree holds after)
    target, tok = models.load_model("smollm2-135m")
    if args.prepare:
        args.dir.mkdir(parents=True, exist_ok=True)
        target.save_pretrained(args.dir / "hf")  # (what optimum-intel exports to OpenVINO's format)
        tok.save_pretrained(args.dir / "hf")
        return
    if not args.ov_python or not args.out:
        ap.error("--ov-python and --out are needed (or --prepare)")
    draft = models.resolve_draft("smollm2-135m-distilled", target)
    prompts = specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)
    worker = subprocess.Popen([args.ov_python, str(Path(__file__).with_name("openvino_worker.py")),
                               "--ir", str(args.dir / "ir"), "--threads", str(args.threads)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hello = json.loads(worker.stdout.readline())
    t0 = time.perf_counter()
    dynatree.precompile(target, draft, 4096, dynatree.EngineOptions(engine="aot"))  # (built, or loaded: timed)
    aot_ready_s = time.perf_counter() - t0

    def decode(name: str, ids: list[int], new: int) -> tuple[list[int], float]:
        if name in THEIRS:
            worker.stdin.write(json.dumps({"mode": THEIRS[name], "ids": ids, "new": new}) + "\n")
            worker.stdin.flush()
            answer = json.loads(worker.stdout.readline())
            return answer["tokens"], answer["seconds"]
        t = time.perf_counter()
        if name == "hf":
            out = target.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)[0, len(ids):]
        else:
            engine, model, text = OURS[name]
            out = dynatree.generate(target, draft if model else None, ids, "dynatree" if model or text else "autoregressive",
                                    text=text, max_new_tokens=new,
                                    options=dynatree.EngineOptions(engine=engine)).sequences[0, len(ids):]
        return out.tolist(), time.perf_counter() - t

    refs = {pid: decode("hf", ids, args.new)[0] for pid, ids in prompts}
    names = ["hf", *OURS, *THEIRS]
    for name in names:  # (first-use costs: the linear plan, the cost profiles, graph warm-up)
        decode(name, prompts[0][1], 8)
    passes = {name: [] for name in names}
    equal = {name: 0 for name in names}
    from tqdm.auto import tqdm

    bar = tqdm(total=args.passes * len(prompts), desc="prompts", unit="prompt")
    for p in range(args.passes):
        totals = {name: [0, 0.0] for name in names}
        for i, (pid, ids) in enumerate(prompts):
            for name in (names if (p * len(prompts) + i) % 2 == 0 else names[::-1]):
                out, seconds = decode(name, ids, len(refs[pid]))
                totals[name][0] += len(out)
                totals[name][1] += seconds
                equal[name] += out == refs[pid]
            bar.update(1)
        for name, (tokens, seconds) in totals.items():
            passes[name].append({"tokens": tokens, "seconds": round(seconds, 3)})
    bar.close()
    worker.stdin.close()
    worker.wait()
    pooled = {name: [r["tokens"] / r["seconds"] for r in runs] for name, runs in passes.items()}
    builds = [json.loads(p.read_text()).get("build_s") for p in aot_store.cache_dir().glob("*.json")]
    result = {"machine": machine_info(), "threads": args.threads, "prompts": len(prompts), "passes": args.passes,
              "new_tokens": args.new,
              "date": time.strftime("%Y-%m-%d"), "code": code, "torch": torch.__version__,
              "openvino": hello["openvino"], "openvino_settings": hello["settings"],
              "pooled_tokens_per_second": {k: round(statistics.median(v), 1) for k, v in pooled.items()},
              "pooled_per_pass": {k: [round(x, 1) for x in v] for k, v in pooled.items()},
              "per_pass": passes,
              "outputs_equal_to_hf": {k: f"{v} of {args.passes * len(prompts)}" for k, v in equal.items()},
              "aot_ready_s": round(aot_ready_s, 1), "aot_package_build_s": sorted(b for b in builds if b is not None),
              "lengths": [len(v) for v in refs.values()]}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("pooled_tokens_per_second", "pooled_per_pass", "outputs_equal_to_hf")},
                     indent=1))


if __name__ == "__main__":
    main()
