"""The back-off on simulated rounds: how much it loses against the faster of plain decoding and
speculation, on drafts that never pay and drafts that do (no model, no clock: modeled rounds).

    python benchmarks/backoff/simulate.py [--runs 200] [--out simulate.json]

A speculative round commits ``1 + accepted`` tokens, the draft's tokens accepted one after the
other with probability ``alpha`` each up to ``depth``, and costs ``cost`` plain steps; a plain
round commits one token and costs one step; every round's time has 5% Gaussian noise. For each
case and run length, the mean time over ``--runs`` seeded runs of: plain decoding, speculation in
every round, :class:`dynatree.loop.backoff.Backoff` (the library's rule), and the rule it replaced
(moving-average rates, margin 0.97, a verdict after 4 rounds, pauses 8-64), each as a ratio to the
faster of plain decoding and speculation (1.000: the back-off cost nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable

from dynatree.loop.backoff import Backoff

CASES = [  # (alpha, depth, cost): never pays (alpha = 0), marginal, pays
    (0.0, 3, 2.0), (0.0, 3, 1.5), (0.0, 3, 1.1), (0.0, 1, 1.05), (0.2, 3, 1.3), (0.5, 4, 2.0),
    (0.3, 3, 1.3), (0.4, 3, 1.3), (0.5, 3, 1.3), (0.7, 4, 1.5), (0.3, 2, 1.05), (0.6, 5, 1.2),
]
LENGTHS = (64, 192, 512)


class PreviousRule:
    """The rule before (moving averages of tokens per second, margin 0.97, 4 rounds a verdict)."""

    def __init__(self, margin=0.97, probe_plain=2, min_rounds=4, first_pause=8, max_pause=64, ema=0.3):
        self.margin, self.probe_plain, self.min_rounds = margin, probe_plain, min_rounds
        self.first_pause, self.max_pause, self.ema = first_pause, max_pause, ema
        self.spec_rate = self.plain_rate = None
        self.rounds = self.spec_rounds = self.plain_rounds = self.pause_left = 0
        self.pause = first_pause

    def should_draft(self) -> bool:
        if self.rounds == 0:
            return True
        if self.plain_rounds < self.probe_plain:
            return False
        return self.pause_left == 0

    def observe(self, drafted: bool, committed: int, seconds: float) -> None:
        self.rounds += 1
        if self.rounds == 1:
            return
        rate = committed / seconds
        mix = lambda old: rate if old is None else (1 - self.ema) * old + self.ema * rate  # noqa: E731
        if not drafted:
            self.plain_rate = mix(self.plain_rate)
            self.plain_rounds += 1
            self.pause_left = max(0, self.pause_left - 1)
            return
        self.spec_rate = mix(self.spec_rate)
        self.spec_rounds += 1
        if self.spec_rounds < self.min_rounds or self.plain_rate is None:
            return
        if self.spec_rate < self.margin * self.plain_rate:
            self.pause_left, self.pause = self.pause, min(2 * self.pause, self.max_pause)
            self.spec_rounds, self.spec_rate = 0, None
        else:
            self.pause = self.first_pause


def run(guard, alpha: float, depth: int, cost: float, tokens: int, rng: random.Random, noise: float = 0.05) -> float:
    """The time of one run of ``tokens`` tokens (plain steps); ``guard`` None: speculate always."""
    t, out = 0.0, 0
    while out < tokens:
        draft = guard is None or guard.should_draft()
        committed = 1
        if draft:
            while committed <= depth and rng.random() < alpha:
                committed += 1
        seconds = (cost if draft else 1.0) * (1 + noise * rng.gauss(0, 1))
        committed = min(committed, tokens - out)
        out, t = out + committed, t + seconds
        if guard is not None:
            guard.observe(draft, committed, seconds)
    return t


def simulate(runs: int) -> list[dict]:
    rules: dict[str, Callable[[], object]] = {"backoff": Backoff, "previous": PreviousRule}
    rows = []
    for alpha, depth, cost in CASES:
        for n in LENGTHS:
            spec = statistics.mean(run(None, alpha, depth, cost, n, random.Random(s)) for s in range(runs))
            best = min(float(n), spec)
            row = {"alpha": alpha, "depth": depth, "cost": cost, "tokens": n, "plain": float(n), "speculation": spec,
                   "speculation_pays": spec < n}
            for name, make in rules.items():
                row[name] = statistics.mean(run(make(), alpha, depth, cost, n, random.Random(s)) for s in range(runs)) / best
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = simulate(args.runs)
    print("| alpha | depth | cost | tokens | speculation / plain | back-off / best | previous rule / best |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['alpha']} | {r['depth']} | {r['cost']} | {r['tokens']} | {r['speculation'] / r['plain']:.3f} "
              f"| {r['backoff']:.3f} | {r['previous']:.3f} |")
    for pays in (False, True):
        sub = [r for r in rows if r["speculation_pays"] == pays and r["tokens"] >= 192]
        print(f"speculation {'pays' if pays else 'loses'} (192+ tokens): back-off worst {max(r['backoff'] for r in sub):.3f}, "
              f"previous worst {max(r['previous'] for r in sub):.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": args.runs, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
