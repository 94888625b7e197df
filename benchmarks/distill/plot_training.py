"""Training curves of distilled drafts: loss, and held-out agreement / simulated linear K=4 tokens
per round against wall time, one line per run.

    python benchmarks/distill/plot_training.py --run independent=benchmarks/distill/run_s5/train_log.jsonl \
        --run feature=benchmarks/distill/run_feature/train_log.jsonl --out benchmarks/distill/training.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append", required=True, help="NAME=train_log.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for item in args.run:
        name, _, path = item.partition("=")
        rows = load(Path(path))
        minutes = [r["seconds"] / 60 for r in rows]
        axes[0].plot(minutes, [r["loss"] for r in rows], label=name, alpha=0.8)
        ev = [r for r in rows if "eval" in r]
        em = [r["seconds"] / 60 for r in ev]
        axes[1].plot(em, [100 * r["eval"]["generated"] for r in ev], marker="o", label=name)
        axes[2].plot(em, [r["eval"]["linear_k4_tokens"] for r in ev], marker="o", label=name)
    axes[0].set(title="training loss (per step)", xlabel="wall time on the 2-core CPU (min)", ylabel="loss")
    axes[1].set(title="held-out top-1 agreement with the target", xlabel="wall time (min)", ylabel="%")
    axes[2].set(title="held-out linear K=4: tokens per round", xlabel="wall time (min)", ylabel="tokens / round")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
