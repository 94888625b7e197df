"""What the suffix draft source costs per round, per token and per prefill (no model involved).

    PYTHONPATH=src python benchmarks/suffix/cost.py [--depth 32] [--context 4000] [--rounds 400]

Streams (``--context`` tokens indexed at once, then rounds that extend the live sequence by 3
tokens and propose a tree of 16 nodes, as one speculative round with ~3 accepted tokens would):

* ``copy-mix``: 49k-vocabulary random tokens where 40% of the text is spans copied from earlier
  (an answer quoting its prompt); ~the instruct workload.
* ``py-bytes``: a Python stdlib source file as bytes (256 symbols, very repetitive: the worst
  case for trie size, every short substring repeats).
* ``random``: 49k-vocabulary tokens without repeats: nothing matches, the leaf-chain case.

Times are per-round ``perf_counter_ns`` medians, 90th percentiles and means; the machine it is run on is
whatever it is, so run it on an idle machine for numbers to quote.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from pathlib import Path

from dynatree.drafts.suffix_index import SuffixIndex

VOCAB = 49152


def copy_mix(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < 0.4:
            start = rng.randrange(len(out))
            out += out[start : start + rng.randint(4, 40)]
        else:
            out += [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
    return out[:n]


def py_bytes(n: int) -> list[int]:
    text = Path(random.__file__).read_bytes() + Path(argparse.__file__).read_bytes()
    return list(text[:n])


def random_tokens(n: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def measure(name: str, stream: list[int], context: int, rounds: int, depth: int, budget: int) -> None:
    prompt, rest = stream[:context], stream[context : context + 3 * rounds]
    # prefill: index the whole context at once (best of 3)
    prefill = []
    for _ in range(3):
        ix = SuffixIndex(depth)
        sid = ix.add_sequence()
        t0 = time.perf_counter_ns()
        ix.extend(sid, prompt)
        prefill.append(time.perf_counter_ns() - t0)
    tracemalloc.start()
    probe = SuffixIndex(depth)
    probe.extend(probe.add_sequence(), prompt)
    mem = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del probe
    # rounds: extend by 3 + propose(budget), on the live index
    ext, prop, sizes, per_tok = [], [], [], []
    seq = ix.sequence(sid)
    nodes = ix.num_nodes
    for r in range(0, len(rest), 3):
        chunk = rest[r : r + 3]
        t0 = time.perf_counter_ns()
        ix.extend(sid, chunk)
        t1 = time.perf_counter_ns()
        p = ix.propose(seq, budget)
        t2 = time.perf_counter_ns()
        ext.append(t1 - t0)
        per_tok.append((t1 - t0) / len(chunk))
        prop.append(t2 - t1)
        sizes.append(len(p))
    total = [a + b for a, b in zip(ext, prop)]
    t0 = time.perf_counter_ns()
    ix.remove_sequence(sid)  # what evicting it from a cache costs
    removal = time.perf_counter_ns() - t0

    def us(xs: list[int]) -> str:
        q = statistics.quantiles(xs, n=10)
        return f"median {statistics.median(xs) / 1e3:5.1f} p90 {q[-1] / 1e3:5.1f} mean {statistics.fmean(xs) / 1e3:5.1f}"

    print(f"{name} (depth {depth}, {context}-token context)")
    print(f"  prefill {min(prefill) / 1e6:6.1f} ms ({min(prefill) / context / 1e3:5.2f} us/token); "
          f"{nodes} nodes, {mem / 2**20:4.1f} MiB traced; removal {removal / 1e6:5.1f} ms")
    print(f"  round (extend 3 + propose {budget}) us: {us(total)}")
    print(f"    extend 3 tokens us: {us(ext)}")
    print(f"    propose us:         {us(prop)}   (mean proposal {statistics.fmean(sizes):4.1f} nodes)")
    print(f"  insertion us/token:   {us(per_tok)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--context", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--budget", type=int, default=16)
    args = ap.parse_args()
    n = args.context + 3 * args.rounds
    streams = {"copy-mix": copy_mix(n), "py-bytes": py_bytes(n), "random": random_tokens(n)}
    for depth in args.depth:
        for name, stream in streams.items():
            measure(name, stream, args.context, args.rounds, depth, args.budget)


if __name__ == "__main__":
    main()
