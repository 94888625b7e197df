"""The suffix index against a brute-force reference that scans the sequences.

The reference counts every n-gram (length <= max_depth) and every (n-gram, next token) pair by
scanning; the index must agree on counts, continuation counts, the matched suffix and the proposed
tree (the multiset of path scores is the top-`budget` of all admissible continuations). Mutants at
the end inject classic bugs into the real code at test time and must be caught by the same checks.
"""

from __future__ import annotations

import inspect
import itertools
import math
import random
import textwrap
from collections import Counter, defaultdict
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dynatree.drafts.suffix_index as si
from dynatree.errors import DynaTreeError
from dynatree.drafts.suffix_index import Proposal, SuffixCache, SuffixIndex, TextIndex, propose_best

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ODD_MIN_PROBS = [0.0, 0.0713, 0.1337, 0.2917, 0.4561]  # no small-count fraction lands on these


# ------------------------------------------------------------------------------------ reference


def reference(seqs: list[list[int]], depth: int) -> tuple[Counter, dict[tuple, Counter]]:
    """count[g]: occurrences of g (1 <= len(g) <= depth); nxt[g][t]: occurrences of g followed by t
    (len(g) < depth, so that g + t fits in the depth bound)."""
    count: Counter = Counter()
    nxt: dict[tuple, Counter] = defaultdict(Counter)
    for s in seqs:
        for i in range(len(s)):
            for n in range(0, min(depth, len(s) - i) + 1):
                g = tuple(s[i : i + n])
                if n:
                    count[g] += 1
                if n < depth and i + n < len(s):
                    nxt[g][s[i + n]] += 1
    return count, nxt


def ref_match(ctx: list[int], nxt: dict[tuple, Counter], depth: int, max_len: int | None = None) -> int:
    cap = min(len(ctx), depth - 1, depth if max_len is None else max_len)
    for n in range(cap, 0, -1):
        if sum(nxt[tuple(ctx[len(ctx) - n :])].values()) > 0:
            return n
    return 0


def ref_candidates(suffix: tuple, nxt: dict[tuple, Counter], depth_cap: int, min_prob: float) -> list[Fraction]:
    """Exact path scores of every continuation of ``suffix`` within the depth cap and >= min_prob."""
    out: list[Fraction] = []
    stack = [((), Fraction(1))]
    while stack:
        path, score = stack.pop()
        if len(path) == depth_cap:
            continue
        dist = nxt.get(suffix + path, Counter())
        total = sum(dist.values())
        for tok, c in dist.items():
            s = score * Fraction(c, total)
            if s >= min_prob:
                out.append(s)
                stack.append((path + (tok,), s))
    return out


def check_counts(ix: SuffixIndex, seqs: list[list[int]], alphabet: int = 3) -> None:
    depth = ix.max_depth
    count, nxt = reference(seqs, depth)
    assert ix.num_tokens == sum(map(len, seqs)) == ix.count([])
    probes = set(count) | set(nxt)
    for n in range(1, min(depth, 4) + 1):  # absent n-grams too
        probes |= set(itertools.product(range(alphabet), repeat=n))
    for g in probes:
        if 0 < len(g) <= depth:
            assert ix.count(g) == count[g], g
        if len(g) < depth:
            assert ix.continuations(g) == dict(nxt.get(g, {})), g
    assert ix.num_nodes == si._subtree_size(ix._root)


def check_proposal(
    prop: Proposal,
    ix: SuffixIndex,
    seqs: list[list[int]],
    ctx: list[int],
    budget: int,
    min_prob: float,
    alpha: float,
    max_spec: int,
    min_match: int,
) -> None:
    depth = ix.max_depth
    _, nxt = reference(seqs, depth)
    max_match = max(depth // 2, depth - max_spec)
    m = ref_match(ctx, nxt, depth, max_match)
    assert prop.match_len == m
    if m < min_match or budget == 0:
        assert len(prop) == 0
        return
    suffix = tuple(ctx[len(ctx) - m :])
    cap = min(max_spec, math.ceil(alpha * m))
    n = len(prop)
    assert len(prop.parents) == len(prop.logprobs) == n <= budget
    scores, depths, paths = [], [], []
    kids: dict[int, set] = defaultdict(set)
    for i in range(n):
        p = prop.parents[i]
        assert -1 <= p < i  # parent before child
        assert prop.tokens[i] not in kids[p]  # no duplicate siblings
        kids[p].add(prop.tokens[i])
        path = (paths[p] if p >= 0 else ()) + (prop.tokens[i],)
        paths.append(path)
        depths.append(len(path))
        dist = nxt[suffix + path[:-1]]
        assert math.isclose(math.exp(prop.logprobs[i]), dist[path[-1]] / sum(dist.values()), rel_tol=1e-9)
        scores.append((scores[p] if p >= 0 else 1.0) * math.exp(prop.logprobs[i]))
    assert all(d <= cap and d <= depth - m for d in depths)
    assert all(s >= min_prob for s in scores)
    assert all(a >= b - 1e-12 for a, b in zip(scores, scores[1:]))  # best-first: non-increasing
    assert math.isclose(prop.score, sum(scores), rel_tol=1e-9, abs_tol=1e-12)
    best = sorted(ref_candidates(suffix, nxt, cap, min_prob), reverse=True)
    assert n == min(budget, len(best))
    for got, want in zip(sorted(scores, reverse=True), best):
        assert math.isclose(got, float(want), rel_tol=1e-9)


# ------------------------------------------------------------------------------------ strategies


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, int, list]:
    depth = draw(st.integers(1, 6))
    alphabet = draw(st.integers(2, 4))
    toks = st.lists(st.integers(0, alphabet - 1), max_size=14)
    ops = draw(st.lists(st.tuples(st.sampled_from(["add", "extend", "extend", "remove"]), st.integers(0, 9), toks), max_size=10))
    return depth, alphabet, ops


def replay(depth: int, ops: list) -> tuple[SuffixIndex, dict[int, list[int]]]:
    ix = SuffixIndex(depth)
    live: dict[int, list[int]] = {}
    for op, which, toks in ops:
        ids = sorted(live)
        if op == "add" or not ids:
            sid = ix.add_sequence()
            live[sid] = []
        else:
            sid = ids[which % len(ids)]
        if op == "remove" and ids:
            ix.remove_sequence(sid)
            del live[sid]
        else:
            ix.extend(sid, toks)
            live[sid] += toks
    return ix, live


# ------------------------------------------------------------------------------------ index


@SETTINGS
@given(histories())
def test_counts_equal_brute_force(history: tuple) -> None:
    depth, alphabet, ops = history
    ix, live = replay(depth, ops)
    check_counts(ix, list(live.values()), alphabet)
    assert all(ix.sequence(k) == v for k, v in live.items())


@SETTINGS
@given(st.integers(1, 6), st.lists(st.integers(0, 2), max_size=40), st.data())
def test_incremental_extend_equals_one_shot(depth: int, tokens: list[int], data: st.DataObject) -> None:
    one = SuffixIndex(depth)
    one.extend(one.add_sequence(), tokens)
    inc = SuffixIndex(depth)
    sid = inc.add_sequence()
    i = 0
    while i < len(tokens):
        k = data.draw(st.integers(1, 5))
        inc.extend(sid, tokens[i : i + k])
        i += k
    check_counts(inc, [tokens])
    assert inc.num_nodes == one.num_nodes
    assert dump(inc) == dump(one)


def dump(ix: SuffixIndex) -> dict:
    """Every trie location as string -> (count, continuations), leaf chains expanded: the index's
    logical content, independent of how its nodes happen to be split."""
    out = {}
    stack = [((), ix._root)]
    while stack:
        prefix, v = stack.pop()
        toks = tuple(v.seq[v.pos : v.pos + v.length])
        for k in range(1, v.length + 1):
            out[prefix + toks[:k]] = (v.count, 1 if k < v.length else v.cont)
        for tok, c in (v.kids or {}).items():
            assert c.seq[c.pos] == tok
            stack.append((prefix + toks, c))
    return out


@SETTINGS
@given(histories(), st.lists(st.integers(0, 3), max_size=14), st.lists(st.tuples(st.integers(0, 9), st.lists(st.integers(0, 3), max_size=5)), max_size=6))
def test_remove_sequence_restores_the_state_without_it(history: tuple, extra: list[int], interleaved: list) -> None:
    depth, _, ops = history
    ix, live = replay(depth, ops)
    sid = ix.add_sequence()
    ix.extend(sid, extra)
    for which, toks in interleaved:  # the others keep growing while the extra one is indexed
        ids = sorted(live)
        if ids:
            k = ids[which % len(ids)]
            ix.extend(k, toks)
            live[k] += toks
        ix.extend(sid, toks)
    ix.remove_sequence(sid)
    check_counts(ix, list(live.values()), 4)
    fresh = SuffixIndex(depth)
    for toks in live.values():
        fresh.extend(fresh.add_sequence(), toks)
    assert dump(ix) == dump(fresh)
    for k in live:  # the remaining sequences' active suffixes still work after the removal
        ix.extend(k, extra[:5])
        live[k] += extra[:5]
    check_counts(ix, list(live.values()), 4)
    with pytest.raises(DynaTreeError):
        ix.extend(sid, [1])


@SETTINGS
@given(histories(), st.lists(st.integers(0, 3), max_size=10), st.none() | st.integers(1, 6))
def test_match_is_the_longest_suffix_with_a_continuation(history: tuple, ctx: list[int], max_len: int | None) -> None:
    depth, _, ops = history
    ix, live = replay(depth, ops)
    _, nxt = reference(list(live.values()), depth)
    for context in [ctx] + list(live.values()):
        loc, m = ix.match(context, max_len)
        assert m == ref_match(context, nxt, depth, max_len)
        assert (loc is None) == (m == 0)


def test_suffix_seen_only_at_the_live_end_is_no_match() -> None:
    ix = SuffixIndex(8)
    sid = ix.add_sequence()
    ix.extend(sid, [5, 6, 7, 8, 9])
    assert ix.match(ix.sequence(sid)) == (None, 0)  # "8 9", "9" occur only at the end
    assert len(ix.propose(ix.sequence(sid), 8, min_prob=0.0)) == 0
    ix.extend(sid, [1, 5, 6])  # "5 6" now has a continuation (7); "1 5 6" does not
    prop = ix.propose(ix.sequence(sid), 8, min_prob=0.0, alpha=4.0)
    assert prop.match_len == 2
    assert prop.tokens == [7, 8, 9, 1, 5, 6][: len(prop)] and len(prop) == 6
    assert prop.logprobs == [0.0] * 6  # count / continuations: seen once, followed once -> 1, not 1/2


# ------------------------------------------------------------------------------------ proposals


@SETTINGS
@given(
    histories(),
    st.lists(st.integers(0, 3), max_size=8),
    st.integers(0, 12),
    st.sampled_from(ODD_MIN_PROBS),
    st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    st.integers(1, 6),
    st.integers(1, 3),
)
def test_proposals_are_the_best_first_top_budget(history, tail, budget, min_prob, alpha, max_spec, min_match) -> None:
    depth, _, ops = history
    ix, live = replay(depth, ops)
    seqs = list(live.values())
    contexts = [tail] + [s + tail for s in seqs[:2]]
    for ctx in contexts:
        prop = ix.propose(ctx, budget, min_prob=min_prob, alpha=alpha, max_spec=max_spec, min_match=min_match)
        check_proposal(prop, ix, seqs, ctx, budget, min_prob, alpha, max_spec, min_match)


@SETTINGS
@given(histories(), st.lists(st.integers(0, 3), max_size=8), st.integers(0, 12))
def test_add_to_builds_a_valid_tree(history, tail, budget) -> None:
    from dynatree.core.tree import TreeBuilder, validate

    depth, _, ops = history
    ix, live = replay(depth, ops)
    ctx = (list(live.values()) or [[]])[0] + tail
    prop = ix.propose(ctx, budget, min_prob=0.0, alpha=4.0)
    b = TreeBuilder(root_token=99)
    under = b.add(0, 98, -0.5)  # hang the proposal below a non-root node
    ids = prop.add_to(b, under=under)
    assert ids == list(range(2, 2 + len(prop)))
    tree = b.freeze()
    validate(tree)
    for i, node in enumerate(ids):
        assert b.tokens[node] == prop.tokens[i]
        assert b.parent[node] == (under if prop.parents[i] < 0 else ids[prop.parents[i]])
        path_logq = sum(prop.logprobs[j] for j in path_of(prop, i))
        assert math.isclose(b.cum_logq[node], -0.5 + path_logq, abs_tol=1e-9)


def path_of(prop: Proposal, i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = prop.parents[i]
    return out


def test_argument_errors_are_one_line_dynatree_errors() -> None:
    with pytest.raises(DynaTreeError, match="max_depth"):
        SuffixIndex(0)
    ix = SuffixIndex(4)
    for kw in [{"min_prob": 1.5}, {"alpha": 0.0}, {"max_spec": 0}, {"min_match": 0}]:
        with pytest.raises(DynaTreeError):
            ix.propose([1], 4, **kw)
    with pytest.raises(DynaTreeError, match="budget"):
        ix.propose([1], -1)
    with pytest.raises(DynaTreeError, match="unknown"):
        ix.remove_sequence(3)
    with pytest.raises(DynaTreeError, match="alpha"):
        TextIndex(alpha=-1.0)
    with pytest.raises(DynaTreeError, match="option"):
        TextIndex(alfa=2.0)


# ------------------------------------------------------------------------------------ cache


@SETTINGS
@given(st.integers(0, 30), st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=8), st.integers(1, 5))
def test_cache_keeps_the_newest_sequences_that_fit(max_tokens: int, adds: list[list[int]], depth: int) -> None:
    cache = SuffixCache(max_tokens, max_depth=depth)
    history: list[list[int]] = []
    for toks in adds:
        cache.add(toks)
        kept_tail = toks[max(0, len(toks) - max_tokens) :] if max_tokens else []
        if kept_tail:
            history.append(kept_tail)
        kept, total = [], 0
        for s in reversed(history):  # FIFO eviction keeps the newest run that fits
            if total + len(s) > max_tokens:
                break
            kept.append(s)
            total += len(s)
        assert cache.num_tokens == total <= max_tokens
        assert cache.num_sequences == len(kept)
        check_counts(cache.index, kept, 4)


def test_propose_best_takes_the_higher_score_and_the_source_uses_both() -> None:
    cache = SuffixCache(1000, max_depth=16)
    cache.add([1, 2, 3, 4, 5, 6, 7, 8])
    src = TextIndex(cache, max_depth=16, min_prob=0.0, alpha=4.0)
    src.start([9, 1, 2])  # only the cache has seen "1 2" continue
    prop = src.propose(8)
    assert prop.tokens[:6] == [3, 4, 5, 6, 7, 8]
    assert prop == propose_best(src.context, [src.index, cache.index], 8, min_prob=0.0, alpha=4.0)
    src.commit([3, 4, 0, 9, 1, 2])  # now the request itself says "9 1 2" -> 3, a longer match
    local = src.index.propose(src.context, 8, min_prob=0.0, alpha=4.0)
    glob = cache.index.propose(src.context, 8, min_prob=0.0, alpha=4.0)
    assert local.match_len == 3 and glob.match_len == 2
    assert src.propose(8) == (local if local.score >= glob.score else glob)
    src.finish(keep_prompt=False)
    assert cache.num_sequences == 2 and cache.num_tokens == 8 + 6
    assert src.context == []


# ------------------------------------------------------------------------------------ mutants


def mutate(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, old: str, new: str) -> None:
    """Re-define ``owner.name`` from its own source with ``old`` replaced by ``new``."""
    func = getattr(owner, name)
    src = textwrap.dedent(inspect.getsource(func))
    assert old in src, f"mutation site {old!r} not found in {name}"
    namespace = dict(vars(si))
    exec(compile(src.replace(old, new), si.__file__, "exec"), namespace)  # noqa: S102
    monkeypatch.setattr(owner, name, namespace[name])


def random_cases(n: int = 40):
    rng = random.Random(0)
    for _ in range(n):
        depth = rng.randint(2, 6)
        seqs = [[rng.randrange(3) for _ in range(rng.randint(0, 14))] for _ in range(rng.randint(1, 3))]
        yield depth, seqs, [rng.randrange(3) for _ in range(rng.randint(0, 6))]


def caught(check) -> bool:
    """True when the brute-force comparison fails on at least one of the fixed random cases."""
    for depth, seqs, tail in random_cases():
        ix = SuffixIndex(depth)
        for s in seqs:
            ix.extend(ix.add_sequence(), s)
        try:
            check(ix, seqs, tail)
        except AssertionError:
            return True
    return False


def counts_check(ix, seqs, tail):
    check_counts(ix, seqs)


def match_check(ix, seqs, tail):
    _, nxt = reference(seqs, ix.max_depth)
    for ctx in [tail] + [s + tail for s in seqs] + seqs:
        assert ix.match(ctx)[1] == ref_match(ctx, nxt, ix.max_depth)


def proposal_check(ix, seqs, tail):
    for ctx in [tail] + [s + tail for s in seqs] + seqs:
        prop = ix.propose(ctx, 6, min_prob=0.0713, alpha=2.0, max_spec=4)
        check_proposal(prop, ix, seqs, ctx, 6, 0.0713, 2.0, 4, 1)


MUTANTS = {
    # the newest suffix (the last position, as a unigram) is never stepped down from the root
    "forgets the last position": (SuffixIndex, "extend", "for a in range(len(active)):", "for a in range(len(active) - 1):", counts_check),
    # a second occurrence walking into a leaf chain increments it instead of splitting it
    "no chain split": (SuffixIndex, "extend", "elif c.length == 1:", "elif c.length >= 1:", counts_check),
    # ArcticInference's estimate: divide by all occurrences, the one at the live end included
    "count instead of continuations": (si, "_grow", "p = c.count / cont", "p = c.count / v.count", proposal_check),
    # a suffix that occurs only at the end of a sequence is taken as a match
    "match without continuation": (SuffixIndex, "_has_continuation", "return k < v.length or v.cont > 0", "return True", match_check),
    # the depth cap is off by one
    "depth cap off by one": (si, "_grow", "if depth < depth_cap:", "if depth <= depth_cap:", proposal_check),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, name, old, new, check = MUTANTS[mutant]
    assert not caught(check), "the unbroken index must pass the same check"
    mutate(monkeypatch, owner, name, old, new)
    assert caught(check), f"mutant '{mutant}' was not detected"
