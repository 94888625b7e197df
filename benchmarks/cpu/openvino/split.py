"""Where our autoregressive decoding on the aot engine loses to OpenVINO GenAI's plain decoding:
the prompt (time to the first token) or each token after it (issue 55).

    python benchmarks/cpu/openvino/split.py --dir /tmp/ov --ov-python /tmp/ov/venv/bin/python --out FILE.json

Spec-Bench first turns (``--questions`` per task). For each prompt, each side decodes 1 token and
then ``--new`` tokens (past EOS on neither side: both stop at it the same way); the first time is
the time to the first token, and ``(t_new - t_1) / (tokens - 1)`` the time per token after it. The
two sides alternate, the order reversed from one repetition to the next (``--reps``). OpenVINO
runs in ``openvino_worker.py`` as in ``compare.py`` (fp32, f32 KV cache, 2 threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ov"))
    ap.add_argument("--ov-python", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions", type=int, default=1)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    import dynatree
    from dynatree.bench.specbench_questions import specbench_prompts
    from dynatree.bench.sysinfo import machine_info, provenance
    from dynatree.loading import models

    code = provenance().get("code")
    target, tok = models.load_model("smollm2-135m")
    prompts = specbench_prompts("spec-bench", tok, args.questions, 2048, first_turns=True)
    worker = subprocess.Popen([args.ov_python, str(Path(__file__).with_name("openvino_worker.py")),
                               "--ir", str(args.dir / "ir"), "--threads", str(args.threads)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hello = json.loads(worker.stdout.readline())
    dynatree.precompile(target, None, 4096, dynatree.EngineOptions(engine="aot"))

    def openvino(ids: list[int], new: int) -> tuple[int, float]:
        worker.stdin.write(json.dumps({"mode": "plain", "ids": ids, "new": new}) + "\n")
        worker.stdin.flush()
        answer = json.loads(worker.stdout.readline())
        return len(answer["tokens"]), answer["seconds"]

    def ours(ids: list[int], new: int) -> tuple[int, float]:
        t = time.perf_counter()
        out = dynatree.generate(target, None, ids, "autoregressive", max_new_tokens=new,
                                options=dynatree.EngineOptions(engine="aot"))
        return out.sequences.shape[1] - len(ids), time.perf_counter() - t

    sides = {"openvino-plain": openvino, "ours-autoregressive-aot": ours}
    for f in sides.values():  # (warm-up)
        f(prompts[0][1], 4)
    records = []
    for rep in range(args.reps):
        for i, (pid, ids) in enumerate(prompts):
            order = list(sides) if (rep * len(prompts) + i) % 2 == 0 else list(sides)[::-1]
            for name in order:
                _, first = sides[name](ids, 1)
                n, total = sides[name](ids, args.new)
                records.append({"rep": rep, "prompt": pid, "prompt_tokens": len(ids), "decoder": name,
                                "ttft_s": round(first, 4), "tokens": n,
                                "per_token_s": round((total - first) / max(1, n - 1), 5)})
    worker.stdin.close()
    worker.wait()
    summary = {name: {"ttft_ms_median": round(1e3 * statistics.median(r["ttft_s"] for r in records if r["decoder"] == name), 1),
                      "ttft_s_total": round(sum(r["ttft_s"] for r in records if r["decoder"] == name), 2),
                      "per_token_ms_median": round(1e3 * statistics.median(r["per_token_s"] for r in records
                                                                           if r["decoder"] == name), 2)}
               for name in sides}
    args.out.write_text(json.dumps({"machine": machine_info(), "threads": args.threads, "code": code,
                                    "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                                    "openvino": hello.get("openvino"), "openvino_settings": hello.get("settings"),
                                    "new_tokens": args.new, "summary": summary, "records": records}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
