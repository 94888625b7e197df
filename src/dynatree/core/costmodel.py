"""The tree budget from a measured cost model (Sequoia's hardware-aware tree size).

Speculation pays when the tokens a round commits grow faster than what the round costs. The
expected number of committed tokens of a tree is 1 (the bonus token) plus the sum over drafted
nodes of the probability that verification reaches them; DySpec's expected-acceptance values and
DynaTree's path probabilities both estimate that per node as the draft's path probability
``exp(cum_logq)``. What a round costs is mostly the target's verify forward, whose time as a function
of the number of rows is a property of the machine, not of the algorithm: nearly flat up to
hundreds of rows on a GPU, flat up to a few rows on a CPU and then steep (BLAS kernel switches,
static-engine bucket padding). Sequoia picks its tree size from a measured curve of that kind;
here the curve is a :class:`CostProfile` measured once per (model, device, dtype, threads,
engine) and cached on disk, and :func:`choose_budget` picks the node count that maximises

    (1 + sum of the first n nodes' expected gains) / (verify cost of n + 1 rows + other round costs)

i.e. expected committed tokens per millisecond. The core is a pure function, so tests drive it with
fake curves; only :func:`measure` touches a clock.

Cache folder: ``$DYNATREE_CACHE_DIR/costmodel`` if the variable is set, else the platform's user
cache dir (``platformdirs``). The profile is measured by default, once per model, engine and
machine (announced on stderr; about 1 s for a 135M model and 10 s for a 1.5B one on two cores),
and every size decision reads it: the policies' node budgets (:func:`node_budget`), the text
source's cut, the hybrid's model gate. ``DYNATREE_COST_MODEL`` switches: ``off`` (the tables in
:mod:`dynatree.tuning`, measured on one machine: the fallback), ``trim`` (also DynaTree's per-round
Sequoia-style cut of each tree to the prefix that maximises expected tokens per ms).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dynatree.errors import DynaTreeError

ENV_DIR = "DYNATREE_CACHE_DIR"
ENV_SWITCH = "DYNATREE_COST_MODEL"
#: A greedy batch's share costs: ``measure`` (default: timed on this machine at first use, cached)
#: or ``table`` (``tuning.BATCH_SHARE_COST``, one machine's measurement)
BATCH_ENV_SWITCH = "DYNATREE_BATCH_SHARES"
#: ``off``: a cached profile is read as it is, never re-timed against the machine (:func:`holds`)
CHECK_ENV_SWITCH = "DYNATREE_PROFILE_CHECK"
FORMAT = 3  # 3: every bucketed engine stepwise, at its buckets; 2: the fastest of the reps (1: their median)
CONTEXT = 64  # cached tokens the profile's verify calls attend to (a short prompt)
DRAFT_ROWS = 8  # the widest draft call timed (a level of a tree the budgets allow on a CPU)
BATCH_CONTEXT = 128  # cached tokens per row before a batch's timed verify calls


@dataclass(frozen=True)
class CostProfile:
    """Measured verify time (ms, median) of the target for trees of ``rows`` rows (root included).

    ``stepwise``: the engine pads a call to the next measured size (a bucketed engine's buckets:
    static, aot), so a size between two measured ones costs the larger one; otherwise costs are interpolated
    linearly. Past the last measured size the last segment's slope is extended.
    """

    rows: tuple[int, ...]
    ms: tuple[float, ...]
    stepwise: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(int(r) for r in self.rows))
        object.__setattr__(self, "ms", tuple(float(m) for m in self.ms))
        if not self.rows or len(self.rows) != len(self.ms):
            raise DynaTreeError(f"a cost profile needs one time per row count, got {len(self.rows)} and {len(self.ms)}")
        if self.rows[0] < 1 or any(b <= a for a, b in zip(self.rows, self.rows[1:])):
            raise DynaTreeError(f"cost profile rows must be ascending positive integers, got {self.rows}")
        if any(not math.isfinite(m) or m <= 0 for m in self.ms):
            raise DynaTreeError(f"cost profile times must be positive and finite, got {self.ms}")

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    def cost(self, rows: int) -> float:
        """Verify time (ms) of a call of ``rows`` rows."""
        if rows <= self.rows[0]:
            return self.ms[0]
        for i in range(1, len(self.rows)):
            if rows <= self.rows[i]:
                if self.stepwise:
                    return self.ms[i]
                r0, r1, m0, m1 = self.rows[i - 1], self.rows[i], self.ms[i - 1], self.ms[i]
                return m0 + (m1 - m0) * (rows - r0) / (r1 - r0)
        if len(self.rows) == 1:
            return self.ms[0] * rows / self.rows[0]
        slope = max((self.ms[-1] - self.ms[-2]) / (self.rows[-1] - self.rows[-2]), 0.0)
        return self.ms[-1] + slope * (rows - self.rows[-1])

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostProfile:
        if data.get("format") != FORMAT:
            raise DynaTreeError(f"unknown cost profile format {data.get('format')!r}")
        return cls(tuple(data["rows"]), tuple(data["ms"]), bool(data.get("stepwise", False)), dict(data.get("meta", {})))


# ------------------------------------------------------------------------------ the choice
def throughput(cost: CostProfile | Callable[[int], float], gains: Sequence[float], n: int,
               overhead_ms: float = 0.0) -> float:
    """Expected committed tokens per ms of a round verifying the first ``n`` nodes of ``gains``."""
    c = cost.cost(n + 1) if isinstance(cost, CostProfile) else float(cost(n + 1))
    return (1.0 + float(sum(gains[:n]))) / (c + overhead_ms)


def choose_budget(cost: CostProfile | Callable[[int], float], gains: Sequence[float], overhead_ms: float = 0.0,
                  limit: int | None = None, *, base: float = 1.0, rows: int = 1) -> int:
    """How many of the nodes (in the order given) a round should verify: the ``n`` in
    ``[0, len(gains)]`` that maximises expected committed tokens per ms, the smallest on ties.

    ``gains[i]`` is node i's expected gain (the probability verification accepts it). The argmax
    runs over every prefix rather than stopping at the first drop, so a cost step (a bucket
    boundary) that the nodes after it pay back does not end the tree early. ``overhead_ms`` is
    the rest of the round (drafting, committing): the larger it is, the cheaper extra rows look.

    ``base`` and ``rows`` describe what the round already holds before these nodes: its expected
    committed tokens (1, the bonus token, for a bare root) and its rows (1, the root). Adding nodes
    to a tree another source drafted passes that tree's: ``(base + sum(gains[:n])) / cost(rows + n)``.
    """
    if overhead_ms < 0 or not math.isfinite(overhead_ms):
        raise DynaTreeError(f"overhead_ms must be finite and >= 0, got {overhead_ms}")
    if not (math.isfinite(base) and base > 0):
        raise DynaTreeError(f"base must be finite and > 0, got {base}")
    if not (isinstance(rows, int) and rows >= 1):
        raise DynaTreeError(f"rows must be an integer >= 1, got {rows!r}")
    top = len(gains) if limit is None else min(len(gains), limit)
    best, best_n, total = -1.0, 0, float(base)
    for n in range(top + 1):
        if n:
            total += float(gains[n - 1])
        c = cost.cost(rows + n) if isinstance(cost, CostProfile) else float(cost(rows + n))
        value = total / (c + overhead_ms)
        if value > best * (1 + 1e-9):
            best, best_n = value, n
    return best_n


def choose_share(cost: CostProfile | Callable[[int], float], gains: Sequence[Sequence[float]],
                 limit: int | None = None, *, weights: Sequence[float] | None = None,
                 overhead: float = 0.0) -> int:
    """Rows per batch row (root included) a batched round should verify: the ``m`` in
    ``[1, limit]`` that maximises the batch's expected committed tokens per unit of verify cost,

        (B + sum over rows b of w_b * sum(gains[b][:m - 1])) / (cost(B * m) + [m > 1] * overhead),

    ``B = len(gains)``, the smallest on ties. ``gains[b]`` are row ``b``'s drafted nodes' expected
    gains in tree order (a prefix of a tree is a tree). One share for all rows because the batched
    forward pads every row's tree to the widest: the batch pays for ``B * m`` rows whichever rows
    fill them. So the wider the batch, the further up the cost curve each extra row per batch row
    lands, and the share shrinks to 1 (plain batched decoding) where no tree's expected gain pays
    for it.

    ``weights`` (default 1 each): what a token gained on row ``b`` is worth against the batch's
    average (:func:`last_row_weights`: a batch lasts as long as its slowest row, so a token on a
    row far ahead saves less). ``overhead``: what drafting the trees would cost, in the same units
    as ``cost`` (0 once they are drafted: a sunk cost does not change the best cut).
    """
    rows = len(gains)
    if rows == 0:
        return 1
    if weights is not None and len(weights) != rows:
        raise DynaTreeError(f"weights must have one entry per row ({rows}), got {len(weights)}")
    if not (math.isfinite(overhead) and overhead >= 0):
        raise DynaTreeError(f"overhead must be finite and >= 0, got {overhead}")
    w = [1.0] * rows if weights is None else [float(x) for x in weights]
    top = 1 + max(len(g) for g in gains)
    if limit is not None:
        top = max(1, min(top, limit))
    best, best_m, total = -1.0, 1, float(rows)
    for m in range(1, top + 1):
        if m > 1:
            total += sum(wb * float(g[m - 2]) for wb, g in zip(w, gains) if len(g) >= m - 1)
        c = cost.cost(rows * m) if isinstance(cost, CostProfile) else float(cost(rows * m))
        value = total / (c + (overhead if m > 1 else 0.0))
        if value > best * (1 + 1e-9):
            best, best_m = value, m
    return best_m


def last_row_weights(remaining: Sequence[float], row_share: float, spread: float) -> list[float]:
    """What a token gained on each row of a batch is worth, relative to the batch's average row,
    given each row's expected remaining rounds (its tokens still to write over its recent tokens
    per round).

    Why not 1 each: a batch's step costs ``a + beta * rows``; it runs until its last row is done,
    and a row that finishes leaves. A token gained on any row saves ``beta`` (one row fewer in a
    later step); one gained on the row that finishes last also saves ``a`` (one step fewer at the
    end). With ``row_share = beta * B / cost(B)`` (the per-row part of a step) and ``p_b`` the
    chance that row ``b`` is the last (a softmax of the remaining rounds with temperature
    ``spread`` rounds: the future is uncertain), a token on row ``b`` is worth

        w_b = row_share + (1 - row_share) * B * p_b,

    which averages 1 over the rows: rows tied for last weigh 1 each, a row far ahead
    ``row_share``, a lone laggard up to ``row_share + (1 - row_share) * B``."""
    if not remaining:
        return []
    if not (0.0 <= row_share <= 1.0) or not spread > 0:
        raise DynaTreeError(f"row_share must be in [0, 1] and spread > 0, got {row_share}, {spread}")
    top = max(remaining)
    odds = [math.exp((r - top) / spread) for r in remaining]
    total = sum(odds)
    return [row_share + (1.0 - row_share) * len(remaining) * o / total for o in odds]


def max_useful_nodes(cost: CostProfile, overhead_ms: float = 0.0, certainty: float = 1.0) -> int:
    """The most nodes worth drafting if every node were accepted with probability ``certainty``:
    no realistic tree should be bigger, which caps the drafting work of a round."""
    return choose_budget(cost, [certainty] * (cost.max_rows - 1), overhead_ms)


# ------------------------------------------------------------------------ on-disk profiles
def cache_dir() -> Path:
    """Where profiles live: ``$DYNATREE_CACHE_DIR/costmodel`` or the user cache dir."""
    root = os.environ.get(ENV_DIR)
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("dynatree")
    return Path(root) / "costmodel"


def mode() -> str:
    """``DYNATREE_COST_MODEL``, read per call: ``measure`` (the default; ``on`` says the same),
    ``trim`` or ``off``."""
    value = os.environ.get(ENV_SWITCH, "measure").strip().lower()
    value = {"on": "measure", "1": "measure", "true": "measure", "yes": "measure", "0": "off", "false": "off",
             "no": "off"}.get(value, value)
    if value not in ("measure", "trim", "off"):
        raise DynaTreeError(f"{ENV_SWITCH} must be 'measure', 'trim' or 'off', got {value!r}")
    return value


def enabled() -> bool:
    """Whether the target's verify cost is measured (on by default; ``DYNATREE_COST_MODEL=off``:
    the tables of :mod:`dynatree.tuning`, measured on one machine, size every tree instead). A
    budget tuned on one model and machine does not carry over: on a 2-core AMD EPYC a 4-row verify
    cost 1.28 one-row steps of SmolLM2-135M and 0.99 of a 1.5B-parameter model, whose 16-row verify
    cost 1.34 (``benchmarks/cpu/kernels/``)."""
    return mode() != "off"


def trims() -> bool:
    """Whether DynaTree also cuts every tree to its best prefix by the profile (``trim``): a
    Sequoia-style per-round choice from the draft's calibrated path probabilities. Not the default:
    on the 2-core EPYC it lost to the budget alone (1.43x against 1.69x over autoregressive
    decoding, and 1.47x against 1.49x over HF greedy on a 2-core Intel Sapphire Rapids)."""
    return mode() == "trim"


def node_budget(profile: CostProfile, step_cost: float | None = None) -> int:
    """The most drafted nodes a tree may hold on this profile: the largest ``n`` whose verify of
    ``n + 1`` rows costs at most ``step_cost`` (``tuning.BUDGET_STEP_COST``) one-row steps, at
    least 1. Why a bound on the curve rather than a fixed count: the flat part of the curve is what
    a tree may fill for free, and its length differs by 10x between machines and models (4 rows on
    SmolLM2-135M on the 2-core EPYC, 14 on a 1.5B-parameter model there, over 30 on a GPU)."""
    from dynatree import tuning

    limit = (tuning.BUDGET_STEP_COST if step_cost is None else step_cost) * profile.cost(1)
    n = 1
    while n + 1 < profile.max_rows and profile.cost(n + 2) <= limit:
        n += 1
    return n


def batch_shares_measured() -> bool:
    """Whether a greedy batch times its share costs on this machine (the default) rather than read
    ``tuning.BATCH_SHARE_COST``: the table's machine says little about another's. On a 2-core AMD
    EPYC (Zen 4), SmolLM2-135M, 400-token contexts, a share of 2 cost 0.94 / 1.12 / 1.22 / 1.37
    plain steps at B = 2 / 4 / 8 / 16 where the table (a 2-core Intel Xeon) says 1.31 / 1.22 /
    1.09 / 1.17. ``DYNATREE_BATCH_SHARES=table`` pins the table (the test suite does: no test's
    trees may depend on the clock)."""
    value = os.environ.get(BATCH_ENV_SWITCH, "measure").strip().lower()
    if value not in ("measure", "table"):
        raise DynaTreeError(f"{BATCH_ENV_SWITCH} must be 'measure' or 'table', got {value!r}")
    return value == "measure"


def model_identity(model: torch.nn.Module) -> dict[str, Any]:
    """What distinguishes one model's cost from another's: name, class, size, a weight fingerprint."""
    params = list(model.parameters())
    first = params[0].detach().flatten()[:64].float().cpu()
    return {
        "name": str(getattr(getattr(model, "config", None), "_name_or_path", "") or ""),
        "class": type(model).__name__,
        "params": int(sum(p.numel() for p in params)),
        "fingerprint": round(float(first.abs().sum()), 6),
    }


def profile_key(model: torch.nn.Module, engine: str, compile: bool | str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the verify cost depends on: model, device, dtype, threads, engine, compilation."""
    p = next(model.parameters())
    return {"model": model_identity(model), "device": str(p.device), "dtype": str(p.dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "engine": engine, "compile": compile, "torch": torch.__version__,
            **(extra or {})}


def _path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return cache_dir() / f"{digest}.json"


def load(key: dict[str, Any]) -> CostProfile | None:
    """The cached profile for ``key``, or None (missing, unreadable or of another format)."""
    path = _path(key)
    try:
        return CostProfile.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, DynaTreeError):
        return None


def save(key: dict[str, Any], profile: CostProfile) -> Path:
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    data = profile.to_json()
    data["meta"] = {**data["meta"], "key": key}
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)  # atomic: two processes profiling at once cannot leave a torn file
    return path


# ------------------------------------------------------------------------------ measuring
def engine_buckets(kv: Any) -> tuple[int, ...] | None:
    """The row counts ``kv`` pads its calls to (the static and aot engines), None for an engine
    whose cost grows row by row.

    Why it matters: between two buckets a call costs the larger one, so the rows up to a bucket
    are free once the bucket is paid. Measured on the aot engine (2-core AMD EPYC, SmolLM2-135M,
    600 cached tokens): 1-2 rows 21.6-23.3 ms, 3-8 rows 31.7-33.8, 9-16 rows 43.0-44.8. Read as a
    line through 1, 2, 4, 6, 8, 12, 16 rows, 6 and 12 rows were timed as their buckets and
    the sizes between interpolated, so the text's cut stopped a tree short of its bucket's free
    rows; and 24 and 32 rows, past the largest bucket, timed the eager chunk a prefill takes."""
    buckets = getattr(kv, "buckets", None)
    return tuple(int(b) for b in buckets) if buckets else None


def default_sizes(device: str, buckets: Sequence[int] | None) -> tuple[int, ...]:
    """Row counts to time. A bucketed engine costs the same inside a bucket: time the buckets."""
    top = 256 if device == "cuda" else 32
    if buckets:
        return tuple(b for b in buckets if b <= top) or (min(buckets),)
    if device == "cuda":
        return (1, 2, 4, 8, 16, 32, 64, 128, 256)
    return (1, 2, 4, 6, 8, 12, 16, 24, 32)


def measure(kv: Any, sizes: Sequence[int], lazy_head: bool, reps: int = 3,
            clock: Callable[[], float] | None = None) -> CostProfile:
    """Time a verify (the engine's own ``tree_forward``) of chains of ``sizes`` rows after a short
    context, one warm-up call per size (which also compiles a compiled engine's graphs) and
    ``reps`` timed rounds over all sizes, interleaved so a load change hits every size alike.
    The fastest time per size is kept: on a shared machine noise only ever adds time, and a profile
    is measured once and read by every later run (a median of three once read a 135M model's
    one-row step as 46 ms where it costs 36, which made its tree budget 15 nodes instead of 5).
    Leaves ``kv`` empty."""
    once = _verify_timer(kv, lazy_head, clock)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for n in sizes:
        once(n)
    for _ in range(reps):
        for n in sizes:
            times[n].append(once(n))
    for _ in range(EXTRA_ROUNDS):
        if not disordered({n: min(v) for n, v in times.items()}):
            break
        for n in sizes:
            times[n].append(once(n))
    _empty(kv)
    return CostProfile(tuple(sizes), tuple(1e3 * min(times[n]) for n in sizes),
                       stepwise=engine_buckets(kv) is not None, meta={"reps": reps, "context": CONTEXT, "statistic": "min",
                                                             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def _verify_timer(kv: Any, lazy_head: bool, clock: Callable[[], float] | None) -> Callable[[int], float]:
    """Fill ``kv`` with a ``CONTEXT``-token context; return a function that times one verify of a
    chain of ``n`` rows on it (seconds) and drops the chain's rows again."""
    from dynatree.core.clock import sync_clock
    from dynatree.core.tree import TreeBuilder
    from dynatree.core.verify import tree_forward

    tick = clock or sync_clock(kv.device)
    kv.prefill([0] * CONTEXT)

    def once(n: int) -> float:
        b = TreeBuilder(0)
        for i in range(n - 1):
            b.add(i, 0, 0.0)
        tree = b.freeze()
        t0 = tick()
        logits, _ = tree_forward(kv, tree, "bfs", lazy_head)
        _ = logits[0]  # the head of the root row, as acceptance reads at least that
        t = tick() - t0
        kv.compact(CONTEXT, [])
        return t

    return once


#: A cached profile is measured again where a size it lists now runs this many times faster than
#: it says (:func:`holds`).
STALE = 1.25
#: The cached profiles (their files) this process has checked against the machine.
_CHECKED: set[Path] = set()


def holds(kv: Any, profile: CostProfile, lazy_head: bool, reps: int = 3,
          clock: Callable[[], float] | None = None) -> bool:
    """Whether a cached ``profile`` still describes this machine: its smallest and its largest size,
    timed now as :func:`measure` times them (the fastest of ``reps`` calls after a warm-up), do
    not run ``STALE`` times faster than it says. Leaves ``kv`` empty.

    Why: a profile is measured once and read by every later run, and noise only ever adds time,
    so one measured while something else ran says calls cost more than they do, and unevenly: every
    tree budget and draft gate read from it is off until someone deletes the file. On the 2-core
    Intel Xeon, the embedded target's profile measured during an OpenVINO export said 36.1 ms for
    one row and 49.6 for eight, where the idle machine takes 22.3 and 35.2 (trees looked like 1.37
    one-row steps where they cost 1.58). That pair's default happened to decode about as fast with
    either (0.97-1.04x by pass, ``benchmarks/cpu/stale_profile.jsonl``: both keep its trees small
    there); a budget near the knee of a curve can move with it. A machine busy now only lets the check
    pass. About 0.4 s once per process for the embedded pair (8 target calls, 8 draft calls).
    """
    once = _verify_timer(kv, lazy_head, clock)
    sizes = sorted({profile.rows[0], profile.rows[-1]})
    for n in sizes:
        once(n)
    best = {n: min(once(n) for _ in range(reps)) for n in sizes}
    _empty(kv)
    return all(profile.cost(n) <= STALE * 1e3 * best[n] for n in sizes)


#: Rounds a measurement may add over every size while its curve is :func:`disordered`.
EXTRA_ROUNDS = 3
#: How much more than a larger call a smaller one may cost before the curve is read as noise.
DISORDER = 1.25


def disordered(ms: dict[int, float]) -> bool:
    """Whether a call of fewer rows cost ``DISORDER`` times more than one of more rows: a verify of
    more rows reads the same weights and does more arithmetic, so such a curve was measured while
    something else ran (once: one row at 485 ms, four at 393, where one row costs 218; every budget
    and gate price read from it was off by 2x). Some dips are real (a packed kernel for 4 rows
    beats a row-major one for 2, by up to 1.24x on the EPYC): the extra rounds cost seconds and
    keep them, as the fastest of more calls."""
    sizes = sorted(ms)
    return any(ms[a] > DISORDER * min(ms[b] for b in sizes[i + 1:]) for i, a in enumerate(sizes[:-1]))


def _empty(kv: Any) -> None:
    if hasattr(kv, "reset"):
        kv.reset()
    else:
        kv.compact(0, [])



def measure_shares(kv: Any, rows: int, shares: Sequence[int], lazy_head: bool, reps: int = 3,
                   clock: Callable[[], float] | None = None) -> CostProfile:
    """Time a batched verify of ``rows`` chains of each share (rows per batch row, root included)
    and its commit, as a greedy batch's round runs them (with ``lazy_head``, the hidden states and
    the head on each chain), after a ``BATCH_CONTEXT``-token context per row: one warm-up call
    per share, then ``reps`` rounds over all shares, interleaved. ``kv`` is a fresh
    :class:`~dynatree.runtime.batch_cache.BatchedKV`. Returns the median time (ms) by share: a
    profile over shares, not total rows (the loop reads it at the batch's rows)."""
    from dynatree.core.clock import sync_clock
    from dynatree.core.tree import TreeBuilder
    from dynatree.core.verify import batch_lazy_logits

    tick = clock or sync_clock(kv.device)
    kv.prefill([[0] * BATCH_CONTEXT] * rows)

    def chain(m: int) -> Any:
        b = TreeBuilder(0)
        for i in range(m - 1):
            b.add(i, 0, 0.0)
        return b.freeze()

    trees = {m: [chain(m)] * rows for m in shares}
    times: dict[int, list[float]] = {m: [] for m in shares}

    def once(m: int) -> float:
        t0 = tick()
        if lazy_head:
            batch_lazy_logits(kv.verify(trees[m], hidden=True), trees[m], kv.apply_head, kv.vocab_size)
        else:
            kv.verify(trees[m])
        kv.commit([[0]] * rows)  # (each row keeps its root: the context grows by one token a call)
        return tick() - t0

    for m in shares:
        once(m)
    for _ in range(reps):
        for m in shares:
            times[m].append(once(m))
    return CostProfile(tuple(shares), tuple(1e3 * statistics.median(times[m]) for m in shares),
                       meta={"reps": reps, "context": BATCH_CONTEXT, "batch_rows": rows,
                             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def share_profile_for(new_kv: Callable[[], Any], model: torch.nn.Module, rows: int, shares: Sequence[int],
                      lazy_head: bool, linear_plan: Any = None,
                      log: Callable[[str], None] | None = None, engine: str = "hf") -> CostProfile | None:
    """The cached cost of each share for a batch of ``rows`` rows of this (model, device, dtype,
    threads, few-row linear kernels ``linear_plan``, ``engine``), or a fresh measurement on ``new_kv()``
    (:func:`measure_shares`, saved for next time); None under ``DYNATREE_BATCH_SHARES=table``
    (the loop then reads ``tuning.BATCH_SHARE_COST``)."""
    if not batch_shares_measured():
        return None
    key = profile_key(model, "batch", False, {"rows": rows, "shares": list(shares), "lazy_head": lazy_head,
                                               "context": BATCH_CONTEXT, "cpu_linear": linear_plan,
                                               **({"engine": engine} if engine != "hf" else {})})

    def fresh() -> CostProfile:
        if log is not None:
            log(f"dynatree: timing a batch of {rows}'s verify cost per tree share on this machine "
                "(once for this model, batch size and machine)...")
        return measure_shares(new_kv(), rows, shares, lazy_head)

    return cached(key, fresh)


def cached(key: dict[str, Any], fresh: Callable[[], CostProfile], refresh: bool = False,
           check: Callable[[CostProfile], bool] | None = None) -> CostProfile:
    """The profile saved for ``key``, else (or with ``refresh``) ``fresh()`` measured now and saved
    for next time. ``check``: asked once per process of a profile read from disk; where it says
    no, the profile is measured again (:func:`holds`)."""
    profile = None if refresh else load(key)
    path = _path(key)
    if profile is not None and check is not None and path not in _CHECKED:
        _CHECKED.add(path)
        if not check(profile):
            profile = None
    if profile is None:
        profile = fresh()
        try:
            save(key, profile)
        except OSError:
            pass  # a read-only cache dir only costs a re-measurement next time
    return profile


def profile_for(kv: Any, model: torch.nn.Module, engine: str, compile: bool | str, lazy_head: bool,
                buckets: Sequence[int] | None = None, cpu_linear: Any = None,
                log: Callable[[str], None] | None = None, role: str = "target",
                refresh: bool = False) -> CostProfile | None:
    """The cached profile of this (model, device, dtype, threads, engine) or a fresh measurement
    (saved for next time; ``refresh``: measured again whatever is cached, e.g. after one measured
    while the machine was busy); None when profiling is switched off. ``role="draft"`` times a draft
    model's calls the same way (its logits for every row: what a draft level call computes)."""
    if not enabled():
        return None
    padded = engine_buckets(kv)
    buckets = padded or buckets
    # (``build``: what a compiled engine's steps were built with, e.g. the aot packages' attention:
    #  a profile timed on packages since rebuilt otherwise outlives them)
    key = profile_key(model, engine, compile, {"lazy_head": lazy_head, "buckets": list(buckets) if buckets else None,
                                               "cpu_linear": cpu_linear, "build": getattr(kv, "build", None),
                                               **({"role": role} if role != "target" else {})})

    def fresh() -> CostProfile:
        if log is not None:
            what = "the target's verify cost per tree size" if role == "target" else "the draft model's cost per call"
            log(f"dynatree: measuring {what} (once for this model and machine)...")
        sizes = default_sizes(kv.device.type, padded)
        if role != "target":
            sizes = tuple(n for n in sizes if n <= DRAFT_ROWS) or sizes[:1]
        return measure(kv, sizes, lazy_head)

    def check(profile: CostProfile) -> bool:
        if holds(kv, profile, lazy_head):
            return True
        if log is not None:
            log("dynatree: the cached cost profile says calls cost more than they take now (measured "
                "while something else ran?); measuring again")
        return False

    checking = os.environ.get(CHECK_ENV_SWITCH, "on").lower() not in ("off", "0", "false")
    return cached(key, fresh, refresh, check if checking else None)
