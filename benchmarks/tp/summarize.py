"""Summarise the CPU TP benchmark: tok/s per configuration and strategy, speedup over the
autoregressive run of the same invocation, and whether every configuration produced the same tokens.

Run: python benchmarks/tp/summarize.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"2 processes x 1 thread (--tp)": "tp2x1.jsonl", "1 process x 2 threads": "1x2.jsonl",
        "1 process x 2 threads, --no-cpu-linear": "1x2-no-cpu-linear.jsonl"}


def main() -> None:
    outputs: dict[tuple[str, str], list[int]] = {}
    for name, file in RUNS.items():
        path = HERE / file
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        tps: dict[str, list[float]] = {}
        for r in rows:
            s = r["stats"]
            tps.setdefault(r["label"], []).append(s["new_tokens"] / s["t_total"])
            outputs[(file, r["prompt_id"], r["label"])] = r["output_ids"]
        ar = statistics.mean(tps.get("autoregressive", [float("nan")]))
        print(f"{name}: " + ", ".join(
            f"{label} {statistics.mean(v):.2f} tok/s ({statistics.mean(v) / ar:.2f}x AR, {len(v)} prompts)"
            for label, v in tps.items()))
    by_prompt: dict[str, set] = {}
    for (_, prompt, _), ids in outputs.items():
        by_prompt.setdefault(prompt, set()).add(tuple(ids))
    same = all(len(v) == 1 for v in by_prompt.values())
    print(f"every configuration and strategy produced the same tokens per prompt: {same}")


if __name__ == "__main__":
    main()
