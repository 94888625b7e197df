"""Offline acceptance of the suffix draft source: tokens committed per round with a perfect target.

    PYTHONPATH=src python benchmarks/suffix/acceptance.py

A greedy run whose target output is known in advance: each round the draft proposes from the prompt
and the answer so far, and the round commits 1 + the longest proposed path that equals the true
next tokens (the +1 is the target's bonus token). No model: this measures only how much of the
answer the index predicts, which is what a target's greedy output would accept when it copies.

Workloads (stdlib text, so the script needs no data files):

* ``code-edit``: prompt = ``textwrap.py`` (first ~12 kB); answer = the same code "re-typed with
  edits": one identifier renamed everywhere, ~10% of lines deleted, ~5% new lines inserted (from
  ``shlex.py``), a few numbers changed.
* ``prose-extract``: prompt = the module docstrings of ~20 stdlib modules; answer = ~40% of their
  sentences in order, with ~10% of words dropped (an extractive summary).

Tokenizers: bytes (256 symbols) and a regex word tokenizer (``\\w+|\\s+|[^\\w\\s]``, ids per
distinct piece), closer to BPE granularity.

Compared with prompt lookup as in HF transformers' PromptLookupCandidateGenerator (the n-gram of
the last n = 3, 2, 1 tokens, its *first* earlier occurrence that has a continuation, the next 10
tokens as a chain) and the same with the *latest* occurrence.
"""

from __future__ import annotations

import argparse
import importlib
import random
import re
import statistics
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

from dynatree.drafts.suffix_index import Proposal, SuffixIndex

# ----------------------------------------------------------------------------- workloads


def code_edit(seed: int = 0) -> tuple[str, str]:
    rng = random.Random(seed)
    src = Path(textwrap.__file__).read_text()[:12000]
    donor = Path(importlib.import_module("shlex").__file__).read_text().splitlines()
    lines = src.replace("width", "line_width").splitlines()
    out = []
    for line in lines:
        r = rng.random()
        if r < 0.10:
            continue
        if r < 0.15:
            out.append(rng.choice(donor))
        out.append(re.sub(r"\b(\d+)\b", lambda m: str(int(m.group(1)) + 1), line) if rng.random() < 0.05 else line)
    return src, "\n".join(out)


def prose_extract(seed: int = 0) -> tuple[str, str]:
    rng = random.Random(seed)
    names = ["argparse", "textwrap", "heapq", "bisect", "fractions", "difflib", "shlex", "string", "random",
             "statistics", "json", "csv", "functools", "itertools", "collections", "pathlib", "inspect",
             "tokenize", "pickle", "zipfile"]
    docs = [importlib.import_module(n).__doc__ or "" for n in names]
    passage = "\n\n".join(d.strip() for d in docs if d)
    sentences = re.split(r"(?<=[.!?])\s+", passage)
    kept = []
    for s in sentences:
        if rng.random() < 0.4:
            kept.append(" ".join(w for w in s.split() if rng.random() >= 0.1))
    return passage, " ".join(kept)


def byte_tokens(prompt: str, answer: str) -> tuple[list[int], list[int]]:
    return list(prompt.encode()), list(answer.encode())


def word_tokens(prompt: str, answer: str) -> tuple[list[int], list[int]]:
    vocab: dict[str, int] = {}
    pat = re.compile(r"\w+|\s+|[^\w\s]")
    enc = lambda text: [vocab.setdefault(p, len(vocab)) for p in pat.findall(text)]  # noqa: E731
    return enc(prompt), enc(answer)


# ----------------------------------------------------------------------------- drafts

Draft = Callable[[list[int]], tuple[list[int], list[int]]]  # context -> (parents, tokens)


def suffix_draft(index: SuffixIndex, budget: int, **options: object) -> Draft:
    def draft(ctx: list[int]) -> tuple[list[int], list[int]]:
        p: Proposal = index.propose(ctx, budget, **options)  # type: ignore[arg-type]
        return p.parents, p.tokens

    return draft


def prompt_lookup(latest: bool, max_ngram: int = 3, chain: int = 10) -> Draft:
    def draft(ctx: list[int]) -> tuple[list[int], list[int]]:
        n_ctx = len(ctx)
        for n in range(max_ngram, 0, -1):
            if n_ctx <= n:
                continue
            pattern = ctx[n_ctx - n :]
            starts = range(n_ctx - n - 1, -1, -1) if latest else range(n_ctx - n)
            for i in starts:  # an occurrence ending before the last token, so it has a continuation
                if ctx[i : i + n] == pattern:
                    toks = ctx[i + n : i + n + chain]
                    return list(range(-1, len(toks) - 1)), toks
        return [], []

    return draft


def accepted(parents: Sequence[int], tokens: Sequence[int], truth: Sequence[int]) -> int:
    kids: dict[int, dict[int, int]] = {}
    for i, (p, t) in enumerate(zip(parents, tokens)):
        kids.setdefault(p, {})[t] = i
    node, n = -1, 0
    while n < len(truth):
        nxt = kids.get(node, {}).get(truth[n])
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


def simulate(prompt: list[int], answer: list[int], make: Callable[[SuffixIndex], Draft], depth: int = 64) -> tuple[float, float]:
    """Mean tokens per round, and the fraction of rounds with an empty proposal."""
    index = SuffixIndex(depth)
    sid = index.add_sequence()
    index.extend(sid, prompt)
    draft = make(index)
    pos, rounds, empty = 0, 0, 0
    while pos < len(answer):
        parents, tokens = draft(index.sequence(sid))
        empty += not tokens
        step = min(1 + accepted(parents, tokens, answer[pos:]), len(answer) - pos)
        index.extend(sid, answer[pos : pos + step])
        pos += step
        rounds += 1
    return len(answer) / rounds, empty / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 10, 16, 32])
    ap.add_argument("--grid", type=int, default=0, metavar="BUDGET", help="also sweep alpha, min_prob and min_match at this budget")
    args = ap.parse_args()
    workloads = {"code-edit": code_edit(), "prose-extract": prose_extract()}
    tokenizers = {"bytes": byte_tokens, "words": word_tokens}
    for wname, (ptext, atext) in workloads.items():
        for tname, tok in tokenizers.items():
            prompt, answer = tok(ptext, atext)
            print(f"\n{wname} / {tname}: prompt {len(prompt)} tokens, answer {len(answer)} tokens")
            for latest in (False, True):
                tpr, empty = simulate(prompt, answer, lambda ix, latest=latest: prompt_lookup(latest))
                print(f"  prompt lookup 3->1, chain 10, {'latest' if latest else 'first '} occurrence: {tpr:5.2f} tokens/round ({empty:4.0%} empty)")
            for budget in args.budgets:
                tpr, empty = simulate(prompt, answer, lambda ix, b=budget: suffix_draft(ix, b))
                print(f"  suffix tree, budget {budget:2d} (defaults):                 {tpr:5.2f} tokens/round ({empty:4.0%} empty)")
            if args.grid:
                for alpha in (1.0, 4.0, 8.0, 16.0):
                    for min_prob in (0.0, 0.1, 0.3):
                        for min_match in (1, 2):
                            opts = {"alpha": alpha, "min_prob": min_prob, "min_match": min_match}
                            tpr, empty = simulate(prompt, answer, lambda ix, o=opts: suffix_draft(ix, args.grid, **o))
                            print(f"    budget {args.grid} {opts}: {tpr:5.2f} ({empty:4.0%} empty)")


if __name__ == "__main__":
    main()
