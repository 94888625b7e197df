"""Every exact decoder a CPU user could pick, on Spec-Bench's questions, interleaved prompt by prompt
(README.md): the run behind the README's first table.

Decoders (``--decoders``, all by default): HF greedy ``generate``, HF prompt lookup and HF assisted
generation (the shipped draft, exported to a plain HF model); our autoregressive decoding on the
eager engine (``engine="hf"``) and on the ahead-of-time compiled one (``engine="aot"``, its
packages built or loaded before the first pass, the time recorded); on the aot engine our default
(draft model + text), the text alone and the draft model alone; OpenVINO GenAI plain and with
prompt lookup, in a worker process of its own virtual environment (``openvino_worker.py``: only one
side runs at a time). Spec-Bench's questions, ``--questions`` per task, MT-bench's with both turns
(``--first-turns``: first turns only), each prompt to HF greedy's own end (its EOS, or ``--new``
tokens). HF's outputs are taken first (its warm-up); then every decoder decodes the first prompt
once (theirs), and ``--passes`` passes follow, each running every decoder on each prompt in turn,
the order reversed from one prompt to the next, so a slow spell of the machine falls on all of
them alike. Every output is checked against HF's.

The file holds every (pass, prompt, decoder) record -- tokens, seconds (prefill included), equal to
HF greedy's or not -- and, per decoder and pass, pooled rates (all tokens over all time) overall
and per Spec-Bench task, with their median; it is rewritten after each pass, so an interrupted run
keeps the passes it finished.

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
        "ours-text-aot": ("aot", False, True), "ours-draft-aot": ("aot", True, False)}
#: HF's: decoder -> generate's extra arguments ("assistant" stands for the exported draft)
HF = {"hf": {}, "hf-prompt-lookup": {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2},
      "hf-assisted": {"assistant_model": "assistant"}}
THEIRS = {"openvino-plain": "plain", "openvino-prompt-lookup": "prompt-lookup"}
DEFAULT = ["hf", "hf-prompt-lookup", "hf-assisted", "ours-autoregressive", "ours-autoregressive-aot",
           "ours-default-aot", "ours-text-aot", "ours-draft-aot", "openvino-plain", "openvino-prompt-lookup"]


def totals(records: list[dict], decoder: str, passes: int, task: str | None = None) -> list[tuple[int, float]]:
    """Per pass, the decoder's tokens and seconds (over one task's prompts, or all)."""
    out = []
    for p in range(passes):
        rows = [r for r in records if r["decoder"] == decoder and r["pass"] == p and task in (None, r["task"])]
        out.append((sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)))
    return out


def pooled(records: list[dict], decoder: str, passes: int, task: str | None = None) -> list[float]:
    """Per pass, the decoder's tokens over its seconds (over one task's prompts, or all)."""
    return [tokens / seconds for tokens, seconds in totals(records, decoder, passes, task)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ov"), help="the HF folder and OpenVINO IR's home")
    ap.add_argument("--prepare", action="store_true", help="only save the embedded target as an HF folder")
    ap.add_argument("--ov-python", help="the python of OpenVINO's virtual environment")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=192)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--questions", type=int, default=8, help="Spec-Bench questions per task")
    ap.add_argument("--first-turns", action="store_true", help="MT-bench's first turns only")
    ap.add_argument("--decoders", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join([*HF, *OURS, *THEIRS])}")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    names = args.decoders.split(",")
    unknown = sorted(set(names) - {*HF, *OURS, *THEIRS})
    if unknown or "hf" not in names:
        ap.error(f"unknown decoders {unknown}" if unknown else "'hf' (the reference) must be among the decoders")
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    import dynatree
    from dynatree.bench.runner import hf_assistant
    from dynatree.bench.specbench_questions import greedy_answerer, row_task, specbench_prompts
    from dynatree.bench.sysinfo import machine_info, provenance
    from dynatree.loading import models
    from dynatree.runtime import aot_engine

    code = provenance().get("code")  # (at the start: the code that runs, not what the tree holds after)
    target, tok = models.load_model("smollm2-135m")
    if args.prepare:
        args.dir.mkdir(parents=True, exist_ok=True)
        target.save_pretrained(args.dir / "hf")  # (what optimum-intel exports to OpenVINO's format)
        tok.save_pretrained(args.dir / "hf")
        return
    if not args.out or (set(names) & set(THEIRS) and not args.ov_python):
        ap.error("--out is needed, and --ov-python for OpenVINO's decoders (or --prepare)")
    draft = models.resolve_draft("smollm2-135m-distilled", target)
    assistant = hf_assistant(draft) if "hf-assisted" in names else None
    prompts = specbench_prompts("spec-bench", tok, args.questions, 2048, greedy_answerer(target, args.new),
                                progress=True, first_turns=args.first_turns)
    task_of = {pid: row_task({"prompt_id": pid})[0] for pid, _ in prompts}
    worker, hello = None, {}
    if set(names) & set(THEIRS):
        worker = subprocess.Popen([args.ov_python, str(Path(__file__).with_name("openvino_worker.py")),
                                   "--ir", str(args.dir / "ir"), "--threads", str(args.threads)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(worker.stdout.readline())
    t0 = time.perf_counter()
    dynatree.precompile(target, draft, 4096, dynatree.EngineOptions(engine="aot"))  # (built, or loaded: timed)
    aot_ready_s = time.perf_counter() - t0
    pad = target.generation_config.pad_token_id
    pad = pad if pad is not None else target.generation_config.eos_token_id

    def decode(name: str, ids: list[int], new: int) -> tuple[list[int], float]:
        if name in THEIRS:
            worker.stdin.write(json.dumps({"mode": THEIRS[name], "ids": ids, "new": new}) + "\n")
            worker.stdin.flush()
            answer = json.loads(worker.stdout.readline())
            return answer["tokens"], answer["seconds"]
        t = time.perf_counter()
        if name in HF:
            extra = {k: (assistant if v == "assistant" else v) for k, v in HF[name].items()}
            x = torch.tensor([ids])
            out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                                  pad_token_id=pad, **extra)[0, len(ids):]
        else:
            engine, model, text = OURS[name]
            out = dynatree.generate(target, draft if model else None, ids, "dynatree" if model or text else "autoregressive",
                                    text=text, max_new_tokens=new,
                                    options=dynatree.EngineOptions(engine=engine)).sequences[0, len(ids):]
        return out.tolist(), time.perf_counter() - t

    from tqdm.auto import tqdm

    refs = {pid: decode("hf", ids, args.new)[0] for pid, ids in tqdm(prompts, desc="HF greedy references")}
    for name in names:  # (first-use costs: the linear plan, the cost profiles, graph warm-up)
        decode(name, prompts[0][1], 8)
    records: list[dict] = []
    bar = tqdm(total=args.passes * len(prompts), desc="prompts", unit="prompt")
    for p in range(args.passes):
        for i, (pid, ids) in enumerate(prompts):
            for name in (names if (p * len(prompts) + i) % 2 == 0 else names[::-1]):
                out, seconds = decode(name, ids, len(refs[pid]))
                records.append({"pass": p, "prompt": pid, "task": task_of[pid], "decoder": name,
                                "tokens": len(out), "seconds": round(seconds, 4), "equal": out == refs[pid]})
            bar.update(1)
        done = p + 1
        rates = {k: pooled(records, k, done) for k in names}
        builds = {role: [r.get("build_s") for r in aot_engine.loaded_records(m)]
                  for role, m in (("target", target), ("draft", draft))}  # (the packages this run loaded)
        result = {"machine": machine_info(), "threads": args.threads, "prompts": len(prompts),
                  "questions_per_task": args.questions, "turns": "first" if args.first_turns else "all",
                  "passes": done, "new_tokens": args.new, "decoders": names,
                  "date": time.strftime("%Y-%m-%d"), "code": code, "torch": torch.__version__,
                  "transformers": __import__("transformers").__version__,
                  "openvino": hello.get("openvino"), "openvino_settings": hello.get("settings"),
                  "pooled_tokens_per_second": {k: round(statistics.median(v), 1) for k, v in rates.items()},
                  "pooled_per_pass": {k: [round(x, 1) for x in v] for k, v in rates.items()},
                  "per_task_pooled_median": {t: {k: round(statistics.median(pooled(records, k, done, t)), 1)
                                                 for k in names} for t in dict.fromkeys(task_of.values())},
                  "per_pass": {k: [{"tokens": n, "seconds": round(t, 3)} for n, t in totals(records, k, done)]
                               for k in names},
                  "outputs_equal_to_hf": {k: f"{sum(r['equal'] for r in records if r['decoder'] == k)} of "
                                             f"{done * len(prompts)}" for k in names},
                  "aot_ready_s": round(aot_ready_s, 1), "aot_package_build_s": builds,
                  "lengths": [len(v) for v in refs.values()], "records": records}
        args.out.write_text(json.dumps(result, indent=1))
    bar.close()
    if worker is not None:
        worker.stdin.close()
        worker.wait()
    print(json.dumps({k: result[k] for k in ("pooled_tokens_per_second", "pooled_per_pass", "outputs_equal_to_hf")},
                     indent=1))


if __name__ == "__main__":
    main()
