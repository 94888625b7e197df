"""Every number the library tuned to hardware or to measurements, in one place, with where it
was measured. The modules that use them import them from here (and keep the names, so a test can
still patch ``dynatree.runtime.engines.AUTO_MIN_PARAMS`` and the like).

Machines named below: "the 2-core EPYC" is the project's CI machine (2-core AMD EPYC VM, torch
2.x with MKL, float32); "the H200" is one NVIDIA H200, torch 2.11 + CUDA 13, float16 (the
results with their machines: the documentation's Results and Performance notes pages). A number measured on one machine is a default, not a law: each has a
keyword or an option that overrides it. No torch here: the CLI's ``--help`` reads this module.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- tree budgets
#: The node budget read off the target's measured verify-cost curve (``costmodel.node_budget``):
#: the most drafted nodes whose verify costs at most this many one-row steps (the profile's 64
#: cached tokens: a real prompt's longer context makes extra rows dearer). On the 2-core EPYC the
#: curve of SmolLM2-135M (1 / 2 / 4 / 6 / 8 rows: 35 / 36 / 42 / 43 / 48 ms) gives 3 nodes, the
#: hand-tuned budget below; 1.3 gave 6 there and ran the default 3% slower than 3 on Spec-Bench
#: (1.51x against 1.55x our plain decoding, two interleaved runs; the text alone, which has no
#: such budget, 1.60x and 1.56x). A Qwen2.5-1.5B-shaped model with oneDNN's packed kernels (8 rows
#: 1.11, 16 rows 1.34 steps) gets 10.
BUDGET_STEP_COST = 1.2
#: The drafted-node budget when ``max_nodes`` is None and no cost profile is measured
#: (``DYNATREE_COST_MODEL=off``), as it was tuned by hand.
#: CPU: on the 2-core EPYC a verify of root + 3 nodes (4 rows) costs about one autoregressive
#: step with the few-row linear layout, 5+ rows cost ~1.5x (BLAS switches kernels above 4 rows):
#: 1.04x over compiled AR with 3 nodes against 0.85x with 4, same run. CUDA: on the H200 a compiled verify of a
#: Pythia-2.8B-shaped target costs 1.24x one step at 32 rows and 1.45x at 64; 64 is not swept.
#: Re-checked on the CPU after its verify passes got cheaper (4 rows 1.8x -> 1.3x a step): 6
#: nodes ran at 0.99x alone and 1.97x in the hybrid against 1.07x and 2.05x with 3, same run
#: (the 2-core EPYC, the instruct sets).
DEFAULT_MAX_NODES = {"cpu": 3, "cuda": 64}

#: A batch's trees share this many verify rows per round: each running row gets
#: ``BATCH_TREE_ROWS // rows`` rows (root included), since a wide batch already fills the target's
#: forward; a share under ``BATCH_MIN_SHARE`` rows is a plain step. Measured on a 2-core Intel
#: Xeon (Sapphire Rapids), SmolLM2-135M, Spec-Bench first turns, 64-96 new tokens, greedy: at 4
#: rows a share of 4 per row beat 8 and 16 and plain decoding on translation (2.97 s against
#: 3.33 s at 8 and 3.37 s plain); with 2 per row (one drafted node) the text draft ran at
#: 0.80-1.00x plain decoding at 8 rows and 0.84-0.97x at 16 rows, in every task. So from 6 rows
#: on a batch decodes plain until enough rows have finished.
BATCH_TREE_ROWS = 16
BATCH_MIN_SHARE = 3
#: (The two numbers above fix a *sampled* batch's share for the whole run, so a seeded row's draws
#: do not depend on its neighbours. A greedy batch chooses its share every round from the cost
#: curve below and the rows' own trees: ``core.costmodel.choose_share``.)
#: A greedy batch's verify cost by its share (rows per batch row, root included), relative to
#: a plain step of the same batch. Read only under ``DYNATREE_BATCH_SHARES=table``: by default a
#: batch times its shares on the machine it runs on (``loop.batch.measured_shares``), since they
#: differ by CPU (a share of 2 at B = 2: 0.94 plain steps on a 2-core AMD EPYC, Zen 4, 1.31 on the
#: Intel Xeon below). Per device type, per batch size ``B``, ``(shares, relative
#: costs)``, interpolated linearly and extended past the last share by the last segment's slope.
#: A batch of ``rows`` takes the table of the smallest tabulated ``B >= rows`` (the largest past
#: the last): a wider batch's shares cost relatively more, so this errs toward plain steps.
#: Per batch size, not one curve over total rows: 32 rows cost 1.73x a plain step of 4 rows as
#: 4 x 8 but 1.14x one of 16 rows as 16 x 2, while plain batches of 4 and 16 rows differ 1.8x
#: (every row's context costs). CPU: the 2-core Intel
#: Xeon (Sapphire Rapids), SmolLM2-135M, fp32, 2 threads, 400-token contexts, a verify of a chain
#: per row and its commit with the grouped keys and values read in place (``runtime/batch_cache``)
#: and appended in place (``runtime/growing_layer``), the mean of three runs of medians of 5
#: interleaved timings (2026-11-27); plain steps 43-65 / 57-91 / 77-115 / 92-149 ms at B = 2 / 4 /
#: 8 / 16 (the VM's phases). (Before the batch read the cache in place, HF's per-query-head copy
#: made a share of 2 cost 1.72 plain steps at B = 16, then 1.14. Appending in place took the same
#: milliseconds off plain and tree steps, so the larger shares now cost relatively more: a share
#: of 8 at B = 16 2.58 plain steps, 2.30 before.) CUDA: not
#: timed for batches; the H200's single-sequence compiled verify of a Pythia-2.8B-shaped target (1.24 one-row steps at 32 rows, 1.45 at 64) read as 16
#: rows x share.
BATCH_SHARE_COST: dict[str, dict[int, tuple[tuple[int, ...], tuple[float, ...]]]] = {
    "cpu": {
        2: ((1, 2, 4, 8, 16), (1.0, 1.31, 1.63, 1.80, 2.28)),
        4: ((1, 2, 4, 8, 16), (1.0, 1.22, 1.34, 1.76, 2.54)),
        8: ((1, 2, 4, 8, 16), (1.0, 1.09, 1.38, 1.98, 2.93)),
        16: ((1, 2, 4, 8), (1.0, 1.17, 1.70, 2.58)),
    },
    "cuda": {16: ((1, 2, 4), (1.0, 1.13, 1.32))},
}
#: A greedy batch row's calibration starts as if its draft had offered this many expected nodes
#: (path probabilities) and the target had accepted one: a fresh row counts its draft's
#: probabilities at a third until its own trees say more. The text's raw probabilities are often
#: 1 (a continuation seen once); trusted whole, at B = 16 on Spec-Bench's math questions (the
#: 2-core Intel Xeon) the hybrid verified trees in 14 of 92 rounds, committed 1.17 tokens per round
#: and saved no round (every round waits for the slowest row); at a third it decoded plain. The
#: instruct rewrite set at B = 4 kept its trees (6.5 tokens per round, 1.9x), Spec-Bench's
#: translation at B = 4 too (1.33x, text).
BATCH_PRIOR_EXPECTED = 3.0
#: A greedy batch values a token gained on each row by that row's chance of finishing last
#: (``core.costmodel.last_row_weights``): a batch runs until its last row is done, so a token on
#: a row far ahead saves only that row's part of a later step. ``BATCH_ROW_COST``: what each row
#: beyond the first adds to a plain batched step, in one-row steps (a plain step of B rows costs
#: ``1 + r (B - 1)``, ``0 <= r <= 1``). CPU: the 2-core Intel Xeon (Sapphire Rapids),
#: SmolLM2-135M, fp32, 2 threads, 400-token contexts, KV appended in place, three runs of medians
#: of 5 interleaved steps (2026-11-27), e.g. 63 / 65 / 69 / 91 / 102 / 115 / 141 / 149 ms at B = 1 /
#: 2 / 3 / 4 / 6 / 8 / 12 / 16: least-squares lines of 0.090-0.097 one-row steps per row (0.12
#: before the cache appended in place: HF's copy of the whole cache grows with the rows). The
#: slopes between neighbouring sizes jump with the kernels' row blocking, so the line, not a local
#: slope. CUDA: not timed for batches; the H200's single-sequence
#: compiled verify curve (1.24 one-row steps at 32 rows) gives about 0.01. ``BATCH_LAST_SPREAD``:
#: how uncertain it is which row finishes last, as the spread of a softmax over the rows'
#: remaining rounds in units of ``sqrt(R)`` (``R`` the longest: gains come in bursts, so a row's
#: progress over ``R`` rounds wanders by about ``sqrt(R)``; two rows' difference by ``sqrt(2 R)``).
#: A fixed spread of 2 rounds made the text draft drop every tree of Spec-Bench translation at
#: B = 4 (96 rounds, 1.04x our batched decoding, against 73 rounds and 1.61x unweighted, medians
#: of 3 interleaved on the 2-core Intel Xeon): a row a few tokens ahead early on is not known to
#: finish first, its later gains still shorten the batch.
BATCH_ROW_COST = {"cpu": 0.10, "cuda": 0.01}
BATCH_LAST_SPREAD = 1.5
#: A greedy batch round that drafted but whose every tree was cut to its root (the share was one
#: row per row) paid for its drafting and gained nothing; where that drafting was material (more
#: than ``BATCH_PAUSE_MATERIAL`` of the round's verify time: a draft model's calls, not a text
#: lookup) the batch drafts no tree for a pause of 1 round, doubling after every such round up to
#: ``BATCH_PAUSE_MAX``, reset by a round that keeps a tree. On the 2-core Intel Xeon, Spec-Bench
#: QA at B = 16: the hybrid's draft model ran 59 times (0.74 s of 13.7 s) and every tree was cut;
#: the text's lookups cost 0.3% of a round's verify time, its probes stay free.
BATCH_PAUSE_MATERIAL = 0.1
BATCH_PAUSE_MAX = 16
#: A batch's draft calls of one step run as one forward over every row
#: (:mod:`dynatree.runtime.batch_draft`), each row's queries padded to the longest call's. A call
#: of more tokens than this (a draft catching up on the tokens it sat out) runs alone instead, so
#: that the other rows do not pay its length in padded queries.
BATCH_DRAFT_ALONE = 16
#: The most rows a greedy batch's verify forward may hold (each row's tree is drafted up to
#: ``BATCH_MAX_ROWS // rows`` rows before the share is chosen).
BATCH_MAX_ROWS = {"cpu": 128, "cuda": 256}

# --------------------------------------------------------------------------- engines
#: ``engine="auto"`` keeps models smaller than this on the eager hf engine: the static engine's
#: fixed shapes and compiled graphs save a roughly fixed overhead per layer call that only a real
#: model's steps make worth their set-up (the suite's tiny random models keep the plain path).
AUTO_MIN_PARAMS = 20_000_000
#: Static-engine buckets on a CPU: its trees stay small (the cost model rarely picks more than a
#: few nodes), so buckets up to 32 rows cover them and halve the graphs to compile.
CPU_AUTO_BUCKETS = (1, 2, 4, 8, 16, 32)
#: What each generated token saves on the aot engine over the eager one, per target layer, in
#: seconds: 0.48 ms on the 2-core Intel Xeon (SmolLM2-135M, 30 layers, our plain decoding 21.1 ->
#: 30.4 tok/s, benchmarks/cpu/openvino/intel-xeon-4q.json, 2026-11-28) and 0.62 ms on the
#: 2-core EPYC (22.6 -> 38.8 tok/s, amd-epyc-aot-dynamic-rows.json); the lower, rounded down, so
#: that ``engine="auto"`` builds the packages only for a call that surely repays the build (both
#: the build and the saving grow with the layers, so the break-even in tokens barely moves with the
#: model's depth: about 30,000 tokens for the embedded target, its build estimated at 405 s on a
#: machine that has not built packages yet).
AOT_SAVING_S_PER_LAYER_TOKEN = 0.45e-3
#: (``cpu_linear=None`` no longer turns the few-row layout on from 2 threads, as tuned on the
#: 2-core EPYC: the kernel per row count is measured on the user's CPU, ``kernels/linear_plan.py``.)
#: Most rows a call may have to take the few-row layout: 64 rows were still faster than
#: ``F.linear`` on the 2-core EPYC; prefill chunks of 128+ were not.
CPU_LINEAR_MAX_ROWS = 64
#: From this many rows the few-row layout multiplies by weights pre-packed for oneDNN: a verify
#: pass of 8 / 16 / 24 rows then cost 1.41 / 1.78 / 2.19 one-row steps instead of 1.81 / 2.45 /
#: 3.04, 4 rows the same 1.29 (the 2-core EPYC); per matrix, 1-2 rows were slower packed.
CPU_PACKED_MIN_ROWS = 4
#: Packed copies double a model's weight memory, so a model gets them only when its weights take
#: at most ``CPU_PACKED_MEMORY_SHARE`` of the memory available when it is first run (and at most
#: ``CPU_PACKED_MAX_BYTES``, the bound where the available memory cannot be read). The embedded
#: pair (0.54 GB + 0.04 GB) always does; a Qwen2.5-1.5B-shaped fp32 model (6.2 GB) does on a 24 GB
#: machine, where its packed 8-row verify reads the weights once and ``F.linear`` reads them
#: almost four times (``benchmarks/cpu/kernels/``, the 2-core EPYC).
CPU_PACKED_MAX_BYTES = 64 * 1024**3
CPU_PACKED_MEMORY_SHARE = 0.5
#: A batch's prompts are prefilled one by one (unpadded, causal attention without a mask) instead
#: of in one call padded to the longest (a mask over every padded row), on CPU, when the padding
#: exceeds ``BATCH_PREFILL_ROW_PADDING`` tokens per row or the longest prompt has at least
#: ``BATCH_PREFILL_ROW_LENGTH`` tokens. Measured on the 2-core Intel Xeon (Sapphire Rapids),
#: SmolLM2-135M, fp32, 2 threads, medians of 3 interleaved, one by one against padded: 16 rows of
#: 300-1,600 tokens 0.37x (22.8 s against 62.5 s), of 120-330 0.73x, of 200-260 1.14x, of 150-180
#: 1.21x, of 30-60 1.63x; 4 rows of 700-900 0.60x, of 400-420 0.99x, of 250-300 1.20x, of 100-200
#: 1.08x; 8 rows of 500-520 0.99x; 2 rows of 1,000 0.94x. A call costs about 77 ms of passes over
#: the weights, a padded token about 1.4 ms (16 rows of 30-60 tokens), so padding pays from about
#: 55 tokens a row; from about 500 tokens the masked attention makes one by one pay without padding.
#: Re-checked on a 2-core AMD EPYC (Zen 4), same prompts' shapes and method: 16 rows of 300-1,600
#: 0.37x, of 120-330 0.71x, of 200-260 0.87x (the rule pads there: 1.15x the faster side, the one
#: miss), of 30-60 1.47x; 4 rows of 700-900 0.85x, of 400-420 1.14x, of 250-300 1.17x, of 100-200
#: 1.05x; 2 rows of 1,000 0.92x.
BATCH_PREFILL_ROW_PADDING = 64
BATCH_PREFILL_ROW_LENGTH = 512
#: A static-engine prefill runs in chunks of at most this many tokens (larger than the largest
#: bucket: those chunks run uncompiled, unpadded, instead of one compiled trace per prompt length).
PREFILL_CHUNK = 256
#: A tree of at most this many rows gets the LM head of all its rows in one call on the lazy
#: head's first read: with the few-row layout 2-4 rows cost what one row costs on the 2-core EPYC.
LAZY_HEAD_BATCH_ROWS = 4
#: Query/key block of the Triton tree-attention kernel. (On the H200 the kernel is slower than SDPA
#: at every tree size measured, 16 to 768 nodes: it stays opt-in.)
TREE_ATTENTION_BLOCK = 32

# --------------------------------------------------------------------------- drafting from the text
#: The text source's defaults (``TextDraft``): most nodes per round, the proposal's probability
#: floor, and its depth cap ``min(MAX_SPEC, ceil(ALPHA * match length))`` (SuffixDecoding's
#: ``max_spec = alpha * match_len``); with a draft model, the expected accepted length from which
#: the model sits the round out. A grid over the text source's settings chose alpha = 8
#: (alpha = 1, ArcticInference's default, committed 12-28% less; 16 was within 2.5%) and the floor
#: (0 gains 2-5% but grows trees no CPU verify can afford); 16 nodes fit the CPU's verify of a text
#: proposal, whose nodes are chains more than fans.
TEXT_BUDGET = 16
TEXT_MIN_PROB = 0.1
TEXT_ALPHA = 8.0
TEXT_MAX_SPEC = 32
TEXT_CONFIDENT = 2.0
#: Tokens a hybrid tree's draft model must add per call, beyond what the text's own nodes would
#: have had accepted, to keep being called where the text is unsure (``drafts.model_gate``): about
#: what a call costs on the 2-core EPYC in plain steps -- 2-3 draft forwards of 0.08 step each
#: plus its 3 verify rows (~0.1 step on ``TEXT_COST_CURVE``).
#: 0 calls the model in every unsure round (the behaviour before the gate).
TEXT_MODEL_MIN_GAIN = 0.3
#: Verify cost (relative to a one-row step) by rows, root included, that ``TextDraft(trim=True)``
#: cuts the text's proposal against when no cost profile is measured (``DYNATREE_COST_MODEL=on``
#: measures one, which then wins): per device type, ``(rows, relative cost)``, interpolated
#: linearly and extended past the last point by the last segment's slope. Relative costs suffice:
#: with no other round cost counted, the best node count is the same at any scale.
#: CPU: the 2-core AMD EPYC (Zen 4), 2 threads, eager hf engine, the few-row linear plan measured
#: over the model's weights (1-2 rows row-major, 3-64 packed), the grouped KV cache read in place,
#: 600 cached tokens (2026-11-27): the median of 5 interleaved verify calls of chains of each size
#: (``costmodel.measure``, lazy head) over the one-row call (41 ms): 2 rows 1.06, 4 rows 1.23, 9
#: rows 1.42, 17 rows 1.79, 32 rows 2.37 (64 cached tokens: 1.02 / 1.14 / 1.32 / 1.59 / 2.13). The
#: curve before (2026-11-24, before 4+ rows used packed weights) said 9 rows 2.0 and 17 rows 2.59;
#: on Spec-Bench's first turns (12 prompts, 192 new tokens, default hybrid, interleaved) this one
#: committed 2.27 tokens per round against 2.15 and ran 1.01x as fast (summarization 0.96x, MT-bench
#: 1.04x). CUDA: flat -- on the H200 a
#: hf-engine verify of a Pythia-2.8B-shaped target costs 1.00-1.03x one step from 1 to 32 rows,
#: so every node of a proposal (path probability >= 0.1) pays
#: and the full budget stays. Other devices: none, no trim.
TEXT_COST_CURVE: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "cpu": ((1, 2, 4, 9, 17, 32), (1.0, 1.06, 1.23, 1.42, 1.79, 2.37)),
    "cuda": ((1, 2), (1.0, 1.0)),
}
#: Memory of the per-step acceptance rate that calibrates the text's path probabilities before the
#: cut (``drafts.suffix.StepAcceptance``): each round's evidence decays by this factor, ~8 rounds,
#: the window DynaTree's own calibration averages over. A replay (the
#: text source replayed on the twelve recorded instruct outputs, no back-off, the CPU curve above
#: as the cost): the modeled verify cost per committed token fell from 0.653 one-row steps
#: (whole proposals; 0.644 cut on raw probabilities) to 0.538 (chat 1.15 -> 0.81, rewrite 0.261 ->
#: 0.265); decays 0.8 / 0.9 / 0.95 gave 0.521 / 0.542 / 0.546.
TEXT_CALIBRATION_DECAY = 0.875
#: The most the hybrid's draft model may spend on caching the prompt, as a share of what plain
#: decoding of the whole run costs (the target's prefill plus one step a new token, on the measured
#: curves): beyond it the draft caches only the prompt's last tokens (``drafts.hybrid.prompt_window``).
#: A 0.5B draft of a 1.5B target caches a 769-token prompt in about a third of the target's
#: prefill, 4-6 s on the 2-core EPYC, 15% of a 64-token run: a loss no back-off can win back once
#: the draft turns out never to agree. 2%, so the back-off's own probing fits in the 3% it promises.
#: The embedded pair's 2-layer draft never reaches it.
DRAFT_PREFILL_SHARE = 0.02
#: The fewest prompt tokens a windowed draft caches (the last ones): below this a draft loses the
#: question it answers.
DRAFT_MIN_WINDOW = 32

# --------------------------------------------------------------------------- the back-off
#: ``Backoff`` (``loop/backoff.py``): speculation must reach ``BACKOFF_MARGIN`` of plain decoding's
#: rate; ``BACKOFF_PROBE_PLAIN`` plain rounds measure a plain step early; a verdict against
#: speculation needs ``BACKOFF_MIN_ROUNDS`` rounds whose mean loss exceeds ``BACKOFF_Z`` standard
#: errors (each round's loss at least ``BACKOFF_MIN_SD`` plain steps uncertain: the clock's noise),
#: or ``BACKOFF_MAX_LOSS`` plain steps lost since the last verdict; pauses double from the first to
#: the last (a pause's tokens reach the draft model in one call after it), and last at least the
#: loss that began them over ``BACKOFF_PROBE_SHARE``. Chosen on a simulation
#: of rounds (``benchmarks/backoff/simulate.py``: acceptance 0-0.7, depth 1-5, a round costing
#: 1.05-2 plain steps, 5% clock noise, 200 runs each): against the faster of plain decoding and
#: speculation, over 192 and 512 tokens, this rule loses at most 3.7% where speculation loses (the
#: worst: a draft that never agrees, rounds of 2 plain steps, 192 tokens; 2.9% at 1.5 steps) and at
#: most 2.2% where it wins; the moving-average rule before it (margin 0.97, verdicts after 4
#: rounds, pauses 8-64) lost up to 10.9% and 7.6%.
BACKOFF_MARGIN = 1.0
BACKOFF_PROBE_PLAIN = 2
BACKOFF_MIN_ROUNDS = 2
BACKOFF_MAX_LOSS = 0.75
BACKOFF_Z = 1.3
BACKOFF_MIN_SD = 0.05
BACKOFF_FIRST_PAUSE = 8
BACKOFF_MAX_PAUSE = 128
BACKOFF_PROBE_SHARE = 0.05
