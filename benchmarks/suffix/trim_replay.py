"""Offline replay of the text source's cut (``TextDraft.trim``) on the recorded instruct outputs.

    PYTHONPATH=src python benchmarks/suffix/trim_replay.py [--decays 0.8,0.9,0.95]

The autoregressive rows of ``benchmarks/instruct/cpu.jsonl`` are the target's greedy output for
the twelve held-out instruct prompts, so a text-only round needs no model: it commits the longest
path of its tree equal to the next output tokens, plus the bonus token. This runs the library's
own ``TextProposer`` (proposal, cut, calibration) round by round, with the back-off off, and prints
per category: tokens per round, drafted nodes per round, and the *modeled* verify cost per
committed token in one-row steps under ``tuning.TEXT_COST_CURVE["cpu"]`` -- the cost the cut
itself optimises, so it is the model's verdict, not a measurement ("+0.1/round" adds a tenth of a
step per round for the rest of the round). No clock is read.

Variants: ``whole`` (``trim=False``), ``raw`` (the cut on the uncalibrated path probabilities),
``cut`` (the default: calibrated by ``StepAcceptance``) and the cut with other decays.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
from pathlib import Path

from dynatree import tuning
from dynatree.bench.instruct import instruct_set
from dynatree.core.costmodel import CostProfile
from dynatree.core.tree import TreeBuilder, children_lists
from dynatree.drafts.suffix import StepAcceptance, TextProposer, TextDraft
from dynatree.loading.models import load_tokenizer

RESULTS = Path(__file__).resolve().parents[1] / "instruct" / "cpu.jsonl"


class _Raw(StepAcceptance):
    """The cut without calibration: the rate stays 1."""

    def learn(self, proposal, committed) -> None:  # noqa: ANN001
        pass


def replay(prompt: list[int], out: list[int], config: TextDraft, cost: CostProfile | None,
           acceptance: StepAcceptance | None, curve: CostProfile) -> tuple[int, int, float]:
    """(rounds, drafted nodes, modeled verify cost) of a text-only run whose output is ``out``."""
    src = TextProposer(config, cost)
    if acceptance is not None:
        src.acceptance = acceptance
    src.prefill(prompt)
    pos, root, rounds, nodes, modeled = 0, prompt[-1], 0, 0, 0.0
    while pos < len(out):
        builder = TreeBuilder(root)
        src.draft(builder, None)  # type: ignore[arg-type]
        tree = builder.freeze()
        kids, toks = children_lists(tree.parent), tree.tokens.tolist()
        path: list[int] = []
        node = 0
        while pos + len(path) < len(out):
            node = next((c for c in kids[node] if toks[c] == out[pos + len(path)]), -1)
            if node < 0:
                break
            path.append(node)
        bonus = out[pos + len(path)] if pos + len(path) < len(out) else out[-1]
        src.commit(tree, path, bonus)
        pos += len(path) + 1
        root = bonus
        rounds += 1
        nodes += tree.num_drafted
        modeled += curve.cost(tree.num_drafted + 1)
    return rounds, nodes, modeled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decays", default="0.8,0.9,0.95", help="other calibration decays to compare")
    args = ap.parse_args()
    tok = load_tokenizer("smollm2-135m")
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    outputs = {r["prompt_sha"]: r["output_ids"] for r in rows if r["strategy"] == "autoregressive"}
    curve = CostProfile(*tuning.TEXT_COST_CURVE["cpu"])
    variants: dict[str, tuple[TextDraft, CostProfile | None, object]] = {
        "whole": (TextDraft(trim=False), None, lambda: None),
        "raw": (TextDraft(), curve, _Raw),
        "cut": (TextDraft(), curve, StepAcceptance),
    }
    for d in (float(x) for x in args.decays.split(",") if x):
        variants[f"cut@{d}"] = (TextDraft(), curve, lambda d=d: StepAcceptance(d))
    totals: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0, 0, 0.0])
    for category, ids in instruct_set("instruct", tok, 12, 1024):
        out = outputs[hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]]
        for name, (config, cost, make) in variants.items():
            rounds, nodes, modeled = replay(ids, out, config, cost, make(), curve)  # type: ignore[operator]
            for key in ((category, name), ("all", name)):
                t = totals[key]
                t[0] += rounds
                t[1] += nodes
                t[2] += len(out)
                t[3] += modeled
    order = list(variants)
    print("| set | variant | tokens/round | nodes/round | modeled cost/token | +0.1/round |")
    print("|---|---|---|---|---|---|")
    for (category, name), (r, n, t, m) in sorted(totals.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        print(f"| {category} | {name} | {t / r:.2f} | {n / r:.2f} | {m / t:.3f} | {(m + 0.1 * r) / t:.3f} |")


if __name__ == "__main__":
    main()
