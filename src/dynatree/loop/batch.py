"""The decoding loop for a batch of prompts: every row grows its own tree, all rows' trees are
verified in ONE target forward, each row accepts its own path.

Rounds run as in :mod:`dynatree.loop.generate` (draft -> verify -> accept -> commit -> observe),
with these differences:

* each row has its own proposer (its own draft cache, text index and policy state, opened with the
  same context as a single prompt's) and its own random stream. Greedy, a row commits what its
  own decoding would. Sampled, a row's trees and draws depend on its seed and on the batch's size
  (which fixes its share of the verify budget below), not on the other rows; where its trees fit
  that share (a text draft's always do, a policy's when its node budget is at most
  ``BATCH_TREE_ROWS // B - 1``) it commits what a single-prompt run with the same seed would, up
  to float summation order in the batched forwards (the target's, and the draft model's);
* the target's KV caches share one :class:`~dynatree.runtime.batch_cache.BatchedKV` (per-row
  positions and masks; ragged lengths kept as masked holes);
* rows that finish (EOS, stop string, length) leave the batch: no drafting, no verify rows;
* the tree budget follows the load. The batched forward pads every row's tree to the widest, so
  a round pays for ``rows x share`` verify rows. Greedy: each row drafts up to
  ``BATCH_MAX_ROWS // rows`` rows, then one share for all rows is chosen per round
  (:func:`~dynatree.core.costmodel.choose_share`): the one that maximises the batch's expected
  committed tokens (each row's drafted nodes' path probabilities, calibrated by what that row's
  trees have had accepted, and weighted by the row's chance of finishing last: a batch lasts as
  long as its slowest row, :func:`row_weights`) per unit of verify cost, the cost of each share at
  this batch size timed on this machine at first use (:func:`measured_shares`; or
  :data:`dynatree.tuning.BATCH_SHARE_COST` under ``DYNATREE_BATCH_SHARES=table``), and every
  tree is cut to it. The wider the batch, the more each extra row per row costs, down to plain
  batched decoding where no tree pays; with the back-off on, a round whose drafting cost was
  material and whose every tree was cut to its root pauses the batch's drafting
  (:class:`CutPause`). Sampled: a fixed share, ``BATCH_TREE_ROWS // rows`` (1 under
  ``BATCH_MIN_SHARE``), so a seeded row's draws do not depend on its neighbours' trees;
* the back-off (:class:`~dynatree.loop.backoff.Backoff`, greedy runs) judges the batch as a
  whole: it compares the batch's committed tokens per second in speculative rounds and in plain
  rounds, and every row drafts or none does. A batch's rounds last as long as its slowest row
  keeps going, and every drafted row widens everyone's forward, so where the rows' texts give
  little to draft the batch decodes plain.

The draft model's calls are batched across rows: each row's proposer grows its tree step by step
(:meth:`~dynatree.core.proposer.Proposer.drafting`), and each step's calls of every row (the
pending committed tokens, then level after level) run as one draft forward on the rows' shared
draft cache (:mod:`dynatree.runtime.batch_draft`, :func:`draft_together`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dynatree.core.clock import sync_clock
from dynatree.core.costmodel import CostProfile, choose_share, last_row_weights, share_profile_for
from dynatree.core.proposer import DraftCall, Drafting, Outcome, Proposer, RunContext, run_calls
from dynatree.core.sampling import DraftSampler, SamplingConfig
from dynatree.core.stats import BatchRound, BatchStats, GenerationResult, GenerationStats, RoundStats
from dynatree.core.tree import TokenTree, TreeBuilder, committed_tokens, truncate_round
from dynatree.core.verify import batch_lazy_logits, greedy_accept, sample_accept
from dynatree.drafts.registry import open_proposer
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions
from dynatree.policies import DraftPolicy
from dynatree.runtime.batch_cache import BatchedKV
from dynatree.runtime.batch_draft import BatchDrafts
from dynatree.runtime.engines import notice
from dynatree.tuning import (BATCH_LAST_SPREAD, BATCH_MAX_ROWS, BATCH_MIN_SHARE, BATCH_PAUSE_MATERIAL, BATCH_PAUSE_MAX,
                             BATCH_PRIOR_EXPECTED, BATCH_ROW_COST, BATCH_SHARE_COST, BATCH_TREE_ROWS,
                             TEXT_CALIBRATION_DECAY)


def row_generators(rows: int, seed: int | Sequence[int] | None, generator: torch.Generator | None) -> list[torch.Generator]:
    """One random stream per row. ``seed=s``: row ``b`` draws as a single-prompt run with
    ``seed=s + b`` would; ``seed=[s0, s1, ...]``: row ``b`` as one with ``seed=s_b`` (so a row's
    output does not depend on which rows share its batch); a ``generator`` (or, with neither,
    torch's global one, so ``torch.manual_seed`` reproduces a batch) seeds the rows' streams."""
    if isinstance(seed, Sequence) and not isinstance(seed, (str, bytes)):
        seeds = list(seed)
        if len(seeds) != rows or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63 for s in seeds):
            raise DynaTreeError(f"seed must be one integer or one integer in [0, 2**63) per prompt ({rows}), got {seed!r}")
    elif seed is not None:
        if generator is not None:
            raise DynaTreeError("seed must be None when generator= is given (seed the generator instead)")
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63 - rows:
            raise DynaTreeError(f"seed must be None, an integer in [0, 2**63) or one per prompt, got {seed!r}")
        seeds = [seed + b for b in range(rows)]
    else:
        source = generator if generator is not None else torch.default_generator
        seeds = [int(x) for x in torch.randint(0, 2**62, (rows,), generator=source)]
    return [torch.Generator().manual_seed(s) for s in seeds]


def refuse(options: EngineOptions, draft_kind: type[Proposer] | None, on_round: Any, trace: Any,
           tensor_parallel: bool) -> None:
    """One line for each setting a batch cannot honour, before any model runs."""
    why = None
    if options.kv_window is not None:
        why = "KV eviction (kv_window)"
    elif options.engine == "static" or options.compile:
        why = f"the static engine{' compiled' if options.compile else ''} (batches run on the dynamic cache)"
    elif tensor_parallel:
        why = "a tensor-parallel target"
    elif draft_kind is not None and draft_kind.wants_features:
        why = "a feature-conditioned draft head (batches take a draft model, the text or both)"
    elif on_round is not None or trace is not None:
        why = "on_round / trace (they follow one prompt's rounds)"
    if why is not None:
        raise DynaTreeError(f"batches do not support {why} yet: call generate once per prompt")


def open_row_proposers(draft: Any, proposer_cls: type[Proposer] | None, context: RunContext, policy: DraftPolicy,
                       sampling: SamplingConfig, rngs: list[torch.Generator]) -> list[Proposer | None]:
    """Each row's proposer, opened as a single prompt's is, with its own copy of the policy (its
    history adapts to its row) and its own draft sampler on the row's random stream."""
    if proposer_cls is None:
        return [None] * len(rngs)
    shaped = bool(proposer_cls.models(draft))
    return [
        open_proposer(draft, dataclasses.replace(
            context, policy=copy.deepcopy(policy) if shaped else None,
            sampler=DraftSampler(rng, sampling.draft_temperature) if policy.samples_children else None))
        for rng in rngs
    ]


def device_key(table: dict[str, Any], device: torch.device) -> str:
    """The key of ``table`` that ``device`` reads: its type, or ``"cpu"`` for a type without its own."""
    return device.type if device.type in table else "cpu"


def per_device(table: dict[str, Any], device: torch.device) -> Any:
    """``table``'s entry for ``device``'s type; a device type without its own takes the CPU's."""
    return table[device_key(table, device)]


def share_cost(device: torch.device, rows: int, measured: CostProfile | None = None) -> tuple[CostProfile, int]:
    """What a greedy batch of ``rows`` rows pays for each share, as a cost over its forward's
    total rows (``rows x share``), and the most rows that forward may hold, for ``device`` (a
    device type without its own table takes the CPU's). ``measured``: this machine's cost by
    share (:func:`measured_shares`, timed at the batch's starting size, which a batch whose rows
    have finished keeps: it errs toward plain steps); else ``tuning.BATCH_SHARE_COST``'s table of
    the smallest tabulated batch size at least ``rows`` (the largest past the last)."""
    if measured is not None:
        shares, cost = measured.rows, measured.ms
        source = f"measured at {measured.meta.get('batch_rows', '?')} rows"
    else:
        tables = per_device(BATCH_SHARE_COST, device)
        size = min((b for b in tables if b >= rows), default=max(tables))
        shares, cost = tables[size]
        source = f"tuning.BATCH_SHARE_COST[{device_key(BATCH_SHARE_COST, device)!r}][{size}]"
    return (CostProfile(tuple(rows * m for m in shares), cost, meta={"source": source, "shares": list(shares),
                                                                     "cost": [round(c / cost[0], 3) for c in cost]}),
            per_device(BATCH_MAX_ROWS, device))


def measured_shares(target: BatchedKV, rows: int, lazy_head: bool) -> CostProfile | None:
    """This machine's verify cost of each share (1, 2, 4 ... rows per row, up to what
    ``BATCH_MAX_ROWS`` leaves each of ``rows`` rows) for a batch of ``rows`` rows of this target,
    timed once on a fresh batched cache and cached on disk with the single-prompt cost profiles
    (:func:`~dynatree.core.costmodel.share_profile_for`: a few seconds, once per model, machine and
    batch size). None under ``DYNATREE_BATCH_SHARES=table`` (the loop then reads
    ``tuning.BATCH_SHARE_COST``), and where a batch this wide has no second share."""
    top = per_device(BATCH_MAX_ROWS, target.device) // rows
    shares = tuple(m for m in (1, 2, 4, 8, 16, 32) if m <= top)
    if len(shares) < 2:
        return None
    return share_profile_for(lambda: type(target)(target.model, target.vocab_size, target.linear_plan or False),
                             target.model, rows, shares, lazy_head, target.linear_plan, log=notice, engine=target.engine)


def node_gains(builder: TreeBuilder, rate: float) -> list[float]:
    """The drafted nodes' expected gains in tree order: each node's path probability (the product
    of its drafted conditional probabilities, whichever source drafted it) times ``rate``, at most 1."""
    return [min(1.0, math.exp(c) * rate) for c in builder.cum_logq[1:]]


def row_weights(device: torch.device, remaining_rounds: Sequence[float]) -> list[float]:
    """What a token gained on each running row is worth against the batch's average
    (:func:`~dynatree.core.costmodel.last_row_weights`), from the rows' expected remaining rounds
    and the per-row part of a plain step of this many rows: ``B r / (1 + r (B - 1))`` with ``r``
    the device's ``tuning.BATCH_ROW_COST`` (a device type without its own takes the CPU's).

    Which row finishes last is uncertain in proportion to how far off the end is: gains come in
    bursts (a copied span), so over ``R`` rounds a row's progress wanders by about ``sqrt(R)``
    rounds. The softmax's spread is ``tuning.BATCH_LAST_SPREAD * sqrt(R)`` for the longest ``R``:
    early on a row a few tokens ahead may still finish last; near the end it will not."""
    r = per_device(BATCH_ROW_COST, device)
    b = len(remaining_rounds)
    if not b:
        return []
    spread = BATCH_LAST_SPREAD * math.sqrt(max(1.0, max(remaining_rounds)))
    return last_row_weights(remaining_rounds, b * r / (1.0 + r * (b - 1)), spread)


@dataclasses.dataclass
class CutPause:
    """A greedy batch's pause after drafting that bought nothing.

    The share is chosen after the rows have drafted (their trees' path probabilities are its
    evidence), so a round whose every tree is cut to its root has paid for its drafting in vain.
    Where that drafting was cheap (a text lookup) the next round may as well look again; where it
    was material (a draft model's calls: more than ``material`` of the round's verify time), the
    batch skips drafting for ``length`` rounds, doubling after each such round up to ``longest``,
    back to 1 once a round keeps a tree. Outputs never depend on it (greedy: the target's argmax
    whatever the trees); the rounds it skips are plain steps. It reads the clock, so it runs where
    the back-off does (greedy, ``backoff`` not off): a run with ``backoff=False`` keeps trees that
    do not depend on timing."""

    material: float = BATCH_PAUSE_MATERIAL
    longest: int = BATCH_PAUSE_MAX
    length: int = 1
    left: int = 0
    paused: int = 0  # rounds skipped, in all

    def take(self) -> bool:
        """Whether this round is paused (counts it)."""
        if self.left > 0:
            self.left -= 1
            self.paused += 1
            return True
        return False

    def observe(self, kept: bool, t_draft: float, t_verify: float) -> None:
        """A round that drafted: whether any tree kept a drafted node; its drafting and verify times."""
        if kept:
            self.length = 1
        elif t_draft > self.material * t_verify:
            self.left = self.length
            self.length = min(2 * self.length, self.longest)


@dataclasses.dataclass
class _Row:
    prompt: list[int]
    proposer: Proposer | None
    rng: torch.Generator
    stats: GenerationStats
    out: list[int] = dataclasses.field(default_factory=list)
    root: int = 0
    done: bool = False
    # the row's calibration: decayed accepted nodes over decayed expected ones (path probabilities)
    taken: float = 0.0
    expected: float = 0.0

    @property
    def rate(self) -> float:
        """Accepted over expected nodes in the row's recent trees, on a prior of one node accepted
        in ``BATCH_PRIOR_EXPECTED`` expected (a fresh row counts its draft's path probabilities at
        a third until its trees show the target takes more)."""
        return (self.taken + 1.0) / (self.expected + BATCH_PRIOR_EXPECTED)

    def remaining_rounds(self, max_new_tokens: int) -> float:
        """Rounds the row still needs at its pace so far (committed tokens per round, on a prior
        of one plain round): its length limit is what it is known to need; an EOS may end it
        sooner, which nothing here can know."""
        return (max_new_tokens - len(self.out)) * (len(self.stats.rounds) + 1) / (len(self.out) + 1)

    def rest(self) -> None:
        """A round without a tree: the evidence ages as if one had been verified."""
        self.taken *= TEXT_CALIBRATION_DECAY
        self.expected *= TEXT_CALIBRATION_DECAY

    def learn(self, tree: TokenTree, accepted: int) -> None:
        expected = float(tree.cum_logq[1:].exp().clamp(max=1.0).sum()) if tree.size > 1 else 0.0
        self.taken = TEXT_CALIBRATION_DECAY * self.taken + accepted
        self.expected = TEXT_CALIBRATION_DECAY * self.expected + expected


def draft_together(steps: dict[int, Drafting], spent: list[float], clock: Callable[[], float]) -> None:
    """Drive every row's drafting steps (:meth:`~dynatree.core.proposer.Proposer.drafting`) to
    their ends, the calls the rows wait on at each step run together (:func:`run_calls`: one draft
    forward per shared draft cache). ``spent[j]`` gains row ``j``'s time: its own steps, plus an
    equal part of each gathered call it had a call in."""
    waiting: dict[int, DraftCall] = {}

    def advance(j: int, result: torch.Tensor | None) -> None:
        s = clock()
        try:
            waiting[j] = next(steps[j]) if result is None else steps[j].send(result)
        except StopIteration:
            waiting.pop(j, None)
        spent[j] += clock() - s

    for j in steps:
        advance(j, None)
    while waiting:
        order = list(waiting)
        s = clock()
        results = run_calls([waiting[j] for j in order])
        part = (clock() - s) / len(order)
        for j, result in zip(order, results):
            spent[j] += part
            advance(j, result)


def decode_batch(target: BatchedKV, proposers: list[Proposer | None], prompts: list[list[int]],
                 rngs: list[torch.Generator], run: RunContext, drafts: BatchDrafts | None = None) -> GenerationResult:
    """The batch's rounds (module docstring). ``drafts``: the rows' shared draft caches, which
    drop finished rows with the target's cache."""
    clock = sync_clock(target.device)
    rows = [_Row(p, prop, rng, GenerationStats(strategy=run.strategy, prompt_tokens=len(p)), root=p[-1])
            for p, prop, rng in zip(prompts, proposers, rngs)]
    stats = BatchStats([r.stats for r in rows])
    # (timed before the clock starts: the first batch of its size on a machine measures its shares)
    any_draft = any(p is not None for p in proposers)
    measured = measured_shares(target, len(rows), run.lazy_head) if run.sampling.greedy and any_draft else None
    start = clock()

    # 0. Prefill: every row's prompt but its last token (the first root), left-padded.
    target.prefill([p[:-1] for p in prompts])
    for r in rows:
        if r.proposer is not None:
            r.proposer.prefill(r.prompt)
    stats.t_prefill = clock() - start
    for r in rows:
        r.stats.t_prefill = stats.t_prefill

    active = list(range(len(rows)))
    pause = CutPause(BATCH_PAUSE_MATERIAL, BATCH_PAUSE_MAX) if run.backoff is not None else None
    while active:
        t0 = clock()
        # 1. Draft: each running row grows its tree up to the round's cap, then (greedy) every tree
        #    is cut to one share chosen for the batch (the forward pads each tree to the widest).
        #    Greedy: the cap is the most rows the forward may hold over the rows still running, the
        #    share is the one the cost curve and the rows' expected gains favour (outputs are the
        #    target's argmax whatever the trees). Sampled: the batch's size fixes each row's share
        #    for the whole run, so a row's trees, and with them its draws, do not depend on its
        #    neighbours; a share under BATCH_MIN_SHARE rows is 1: plain steps.
        if run.sampling.greedy:
            curve, max_rows = share_cost(target.device, len(active), measured)
            if stats.share_costs is None and any_draft:  # (a batch without drafts never chooses a share)
                stats.share_costs = curve.meta
            cap = max(1, max_rows // len(active))
            weights = row_weights(target.device, [rows[i].remaining_rounds(run.max_new_tokens) for i in active])
            # The most a tree could pay for, each node as likely as its row's calibration allows:
            # where even that is a plain step, no row drafts (its draft model is not even run)
            # and every row's calibration relaxes toward its draft's own probabilities, so the
            # rows try a tree again after a while.
            best = [[min(1.0, rows[i].rate)] * (cap - 1) if rows[i].proposer is not None else [] for i in active]
            if (pause is not None and pause.take()) or choose_share(curve, best, cap, weights=weights) == 1:
                cap = 1
                for i in active:
                    rows[i].rest()
        else:
            cap = run.tree_rows // len(rows)
            cap = cap if cap >= BATCH_MIN_SHARE else 1
        builders, proposed, deepens = [], [], False
        steps: dict[int, Drafting] = {}
        speculate = run.backoff is None or run.backoff.should_draft()
        for j, i in enumerate(active):
            r = rows[i]
            builder = TreeBuilder(r.root, cap, depth_limit=run.max_new_tokens - len(r.out) - 1)
            deepens |= builder.depth_limit > 0
            drafting_row = speculate and cap > 1 and r.proposer is not None and builder.depth_limit > 0
            if drafting_row:
                steps[j] = r.proposer.drafting(builder)
            builders.append(builder)
            proposed.append(drafting_row)
        t_row = [0.0] * len(active)
        draft_together(steps, t_row, clock)  # (each step's draft calls of every row in one forward)
        if run.sampling.greedy and any(proposed):
            share = choose_share(curve, [node_gains(b, rows[i].rate) for b, i in zip(builders, active)], cap,
                                 weights=weights)
            for b in builders:
                b.truncate(share)
        trees = [b.freeze() for b in builders]
        drafting = [p and t.size > 1 for p, t in zip(proposed, trees)]
        t1 = clock()
        # 2. Verify: ONE target forward over every running row's tree.
        if run.lazy_head:  # (the head on the rows acceptance reads, in one call for the batch)
            logits = batch_lazy_logits(target.verify(trees, hidden=True), trees, target.apply_head, target.vocab_size,
                                       target.head_argmax if run.screened_head else None)
        else:
            logits = [x[: t.size] for x, t in zip(target.verify(trees), trees)]
        t2 = clock()
        if pause is not None and any(proposed):
            pause.observe(any(drafting), t1 - t0, t2 - t1)
        # 3. Accept, per row.
        decided = []
        for j, i in enumerate(active):
            row_logits = logits[j]
            if run.sampling.greedy:
                decided.append(greedy_accept(trees[j], row_logits))
            else:
                decided.append(sample_accept(trees[j], row_logits, run.sampling, rows[i].rng))
        # 4. Commit: each row's root and accepted rows to its own columns.
        target.commit([[0, *path] for path, _ in decided])
        t3 = clock()
        committed = 0
        for j, i in enumerate(active):
            r, tree, (path, bonus) = rows[i], trees[j], decided[j]
            s = clock()
            if drafting[j]:
                r.learn(tree, len(path))
            if r.proposer is not None:
                r.proposer.observe(Outcome(tree, path, bonus, None, drafted=drafting[j],
                                           overhead_ms=1e3 * (t_row[j] + (t3 - t2) / len(active))))
            new = truncate_round(committed_tokens(tree, path, bonus), run.max_new_tokens - len(r.out), run.stop)
            hit = run.stop_text is not None and run.stop_text.cut(r.out, new)
            if hit:
                new = new[:hit]
            r.out += new
            r.root = bonus
            committed += len(new)
            now = clock()
            if not r.stats.rounds:
                r.stats.ttft = now - start
            r.stats.rounds.append(RoundStats(
                committed=len(new), accepted=min(len(path), len(new)), drafted=tree.num_drafted, depth=tree.max_depth,
                draft_calls=r.proposer.calls if drafting[j] else 0, t_draft=t_row[j], t_verify=t2 - t1,
                t_commit=(t3 - t2) / len(active) + now - s,
                policy_state=r.proposer.state() if r.proposer is not None else {}))
            if new[-1] in run.stop or hit or len(r.out) >= run.max_new_tokens:
                r.done = True
                r.stats.new_tokens = len(r.out)
                r.stats.t_total = now - start
                if r.proposer is not None:
                    r.proposer.finish(len(r.prompt) + len(r.out))
        stats.rounds.append(BatchRound(len(active), len(active) * max(t.size for t in trees), committed,
                                       t1 - t0, t2 - t1, t3 - t2))
        if run.backoff is not None and deepens:  # (rounds whose rows were all at their last token: not its choice)
            run.backoff.observe(any(proposed), committed, clock() - t0)  # (a round that drafted, cut or not)
        still = [i for i in active if not rows[i].done]
        if len(still) < len(active) and still:
            # 5. Finished rows leave the batch (their KV rows with them).
            target.keep_rows([active.index(i) for i in still])
            if drafts is not None:
                drafts.keep_rows([active.index(i) for i in still])
        active = still

    stats.t_total = clock() - start
    stats.draft_forwards = drafts.calls if drafts is not None else 0
    return GenerationResult(sequences=_pad(rows, run.pad_token_id), stats=stats)


def _pad(rows: list[_Row], pad: int) -> torch.Tensor:
    """HF's layout: prompts left-padded to the longest, answers right-padded to the longest."""
    width, new = max(len(r.prompt) for r in rows), max(len(r.out) for r in rows)
    seq = torch.full((len(rows), width + new), pad, dtype=torch.long)
    for b, r in enumerate(rows):
        seq[b, width - len(r.prompt): width] = torch.as_tensor(r.prompt)
        if r.out:
            seq[b, width: width + len(r.out)] = torch.as_tensor(r.out)
    return seq


def pad_token(target: torch.nn.Module, pad_token_id: int | None, eos: int | Sequence[int] | None) -> int:
    """HF's rule: the given pad token, else the target's ``generation_config.pad_token_id``, else
    the first EOS token (``eos``: the stopping config's, else the target's), else 0."""
    if pad_token_id is not None:
        return pad_token_id
    config = getattr(target, "generation_config", None)
    pad = getattr(config, "pad_token_id", None) if config is not None else None
    if isinstance(pad, int):
        return pad
    if eos is None and config is not None:
        eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int):
        return eos
    return int(eos[0]) if eos else 0
