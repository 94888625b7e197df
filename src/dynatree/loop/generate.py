"""The decoding loop: prefill, then rounds of draft -> verify -> accept -> commit -> observe.

State between rounds: both caches hold every committed token except the last one (the *root*),
which the next round feeds to the target together with the drafted tree. So each round costs one
target forward, whatever the tree's size, and no committed token is ever run twice.

Acceptance is greedy at temperature 0 and lossless rejection sampling otherwise
(:mod:`dynatree.core.verify`); one CPU generator drives every random draw of a run (the DySpec policies'
child sampling and the verifier's), so ``seed=`` or ``generator=`` makes a run reproducible.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect

from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any

import torch

from dynatree.runtime import aot_batch, distributed
from dynatree.core.proposer import Outcome, Proposer, RunContext
from dynatree.core.kv import KVModel
from dynatree.core.clock import sync_clock
from dynatree.loop import backoff as backoff_module, flat_keywords
from dynatree.loop.backoff import Backoff
from dynatree.drafts.registry import open_proposer, proposer_for
from dynatree.drafts.feature import FeatureProposer
from dynatree.drafts.model import ModelProposer
from dynatree.drafts.suffix import TextDraft
from dynatree.runtime.cache import vocab_size
from dynatree.runtime.engines import cached_target, eval_mode, notice, resolve as resolve_options
from dynatree.loop import batch
from dynatree.runtime.batch_cache import BatchedKV
from dynatree.runtime.batch_draft import BatchDrafts
from dynatree.runtime.inputs import check_causal_lm, prompt_rows
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.policies import DraftPolicy, make_policy
from dynatree.core.sampling import DraftSampler, SamplingConfig, make_generator
from dynatree.core.stats import GenerationResult, GenerationStats, RoundEvent, RoundStats
from dynatree.runtime.streaming import StreamingConfig, StreamingKV, find_rope
from dynatree.core.tree import TreeBuilder, committed_tokens, truncate_round
from dynatree.core.verify import greedy_accept, sample_accept, tree_forward


def generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | TextDraft | None,
    input_ids: torch.Tensor | Sequence[int],
    strategy: str | DraftPolicy = "dynatree",
    *,
    text: bool = True,
    max_new_tokens: int = 128,
    attention_mask: torch.Tensor | Sequence[Sequence[int]] | None = None,
    sampling: SamplingConfig | None = None,
    options: EngineOptions | None = None,
    stopping: StoppingConfig | None = None,
    seed: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    tokenizer: Any = None,
    truncate_prompt: bool = False,
    allow_vocab_mismatch: bool = False,
    backoff: bool | Backoff | None = None,
    on_round: Callable[[RoundEvent], None] | None = None,
    trace: str | PathLike | None = None,
    **strategy_options: Any,
) -> GenerationResult:
    """Generate with tree speculative decoding: at temperature 0 the output equals the target's own
    greedy output; above it, the output follows the target's sampling distribution exactly.

    Settings come in three typed groups, each validated when it is built: ``sampling``
    (:class:`~dynatree.core.sampling.SamplingConfig`), ``options`` (the engine:
    :class:`~dynatree.options.EngineOptions`) and ``stopping``
    (:class:`~dynatree.options.StoppingConfig`). The flat keywords of dynatree 0.1
    (``temperature=``, ``engine=``, ``eos_token_id=``, ...) are refused since 0.2, with the group
    to use (:mod:`dynatree.loop.flat_keywords`).

    Args:
        target: any HF causal LM (GPTNeoX/Pythia, Llama, Qwen2, GPT-2, ...), unmodified.
        draft: a causal LM over the same vocabulary (with ``text``, the default, it drafts in one
            tree with the text itself); None to draft from the text alone (the prompt and what has
            been written: no second model); a :class:`~dynatree.drafts.suffix.TextDraft` to tune
            the text's part, or with ``model=`` to draft from both with those settings.
        input_ids: one prompt, ``[1, L]`` or ``[L]``; or a batch: ``[B, L]`` (left-padded, with
            ``attention_mask``) or a list of prompts of different lengths. Each row of a batch
            grows its own tree, all rows are verified in one target forward
            (:mod:`dynatree.loop.batch`).
        strategy: ``"autoregressive"``, ``"linear"``, ``"fixed"``, ``"dynatree"``, ``"dyspec"``,
            ``"dyspec-threshold"``, one of them with options as the bench and the CLI write them
            (``"linear:k=5"``), or a policy object (a :class:`~dynatree.policies.DraftPolicy`): the
            shape of the draft model's tree. With no draft model (``draft=None``, or a
            ``TextDraft`` without ``model=``) the tree is the text's own and the strategy shapes
            nothing (``"autoregressive"`` still turns drafting off).
        text: with a draft model, also draft from the text itself (prompt and answer so far) in
            the same tree, as the CLI does (the model sits out the rounds where the text is
            confident, and the rounds where it has not been earning its calls). On the CPU
            Spec-Bench runs of the README it is level with the text alone, which is ahead
            overall. False: the draft model's tree alone, as in the DynaTree and DySpec papers (for reproducing them and for the bench's
            ``source=model``). It applies to a draft model only: ``None`` and a ``TextDraft``
            draft from the text whatever it says.
        max_new_tokens: tokens to generate at most (the last round is truncated exactly).
        attention_mask: with a ``[B, L]`` batch, 0 where a row is left padding (HF's convention).
        sampling: temperature (0, the default, is greedy), top-k, top-p on the target, and the
            draft temperature DySpec samples children at. None: greedy.
        options: the engine: which cache (``engine``), ``compile``, buckets, tree order, lazy
            head, CPU linear layers, StreamingLLM-style eviction (``kv_window``); see
            :class:`~dynatree.options.EngineOptions`. None: decided for the model
            (:func:`dynatree.runtime.engines.resolve`).
        stopping: EOS token(s) and stop strings. None: the target's ``generation_config`` EOS.
        seed: seed of a fresh CPU generator for every random draw of the run (reproducible runs).
            A batch's row ``b`` draws as a single-prompt run with ``seed + b`` would; a list gives
            each row its own seed.
        generator: a CPU ``torch.Generator`` to draw from instead (advanced by the run). With
            neither, torch's global generator is used, so ``torch.manual_seed`` reproduces a run.
        tokenizer: decodes the output for ``stopping.stop_strings`` and for ``trace``'s token text.
        truncate_prompt: left-truncate a prompt that would run past the models' maximum positions.
        allow_vocab_mismatch: skip the draft/target vocabulary-size check (draft logits are cut to
            the target's vocabulary).
        backoff: decode plain (one target step, no drafting) while speculative rounds commit
            tokens more slowly than plain steps do, probing again later
            (:class:`~dynatree.loop.backoff.Backoff`; a ``Backoff`` instance sets its thresholds;
            None: on unless ``DYNATREE_BACKOFF=off``, read per call).
            Greedy runs only: the output is the same either way; a sampled run's random draws
            would depend on timing. Off under tensor parallelism (ranks must build equal trees).
        on_round: called after every round with its :class:`~dynatree.core.stats.RoundEvent` (the
            committed tokens, the drafted tree, the accepted path): what streamers and the trace
            page are fed from, as soon as a round commits rather than at the end.
        trace: write a self-contained HTML page of every round's tree to this path
            (:mod:`dynatree.loop.trace`; token text needs ``tokenizer``).
        **strategy_options: fields of the strategy's config (e.g. ``k=5`` for linear), the same
            as ``"linear:k=5"``.

    Returns:
        a :class:`~dynatree.core.stats.GenerationResult`: ``sequences`` (prompt + new tokens,
        ``[1, L + n]``, on ``input_ids``' device) and per-round ``stats``; for a batch, ``[B, ...]``
        laid out as HF's (left-padded prompts, answers right-padded with ``stopping.pad_token_id``)
        and a :class:`~dynatree.core.stats.BatchStats` (``stats[b]``: row ``b``'s).
    """
    flat_keywords.refuse(strategy_options)
    sampling, options, stopping = (_group(sampling, SamplingConfig, "sampling"), _group(options, EngineOptions, "options"),
                                   _group(stopping, StoppingConfig, "stopping"))
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise DynaTreeError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    policy = _policy(strategy, strategy_options)
    draft = with_text(draft, text, max_new_tokens, options.kv_window) if policy.uses_draft else draft
    check_causal_lm(target, "target")
    prompts = prompt_rows(input_ids, attention_mask, target, stopping.pad_token_id, stopping.eos_token_id)
    if stopping.stop_strings and tokenizer is None:
        raise DynaTreeError("stop_strings need a tokenizer (pass tokenizer=...)")
    stop_text = StopText(tokenizer, list(stopping.stop_strings)) if stopping.stop_strings else None
    if len(prompts) > 1:
        return _generate_batch(target, draft, prompts, policy, max_new_tokens, sampling, options, stopping, stop_text,
                               seed, generator, truncate_prompt, allow_vocab_mismatch, on_round, trace, backoff,
                               input_ids if isinstance(input_ids, torch.Tensor) else None)
    if isinstance(seed, Sequence) and len(seed) == 1:
        seed = seed[0]
    rng = make_generator(seed, generator)
    # Tensor-parallel target: every rank must draw the same numbers and commit the same tokens.
    sync = distributed.RankSync.for_models(target, draft if policy.uses_draft else None)
    if sync is not None:
        sync.share_generator(rng)
    prompt = prompts[0]
    vocab = vocab_size(target)
    # draft=None: speculate from the text itself (the text proposer)
    proposer_cls = proposer_for(draft) if policy.uses_draft else None
    models, depth = _positioned(policy, target, draft, proposer_cls, max_new_tokens)
    streaming = None
    if options.kv_window is not None:
        streaming = StreamingConfig(options.kv_window, options.kv_sinks)
        rope = find_rope(target)  # (a draft's own, when it evicts too, is found where its cache is opened)
        for m in models:
            streaming.check(m, depth, max_positions(m))
    else:
        prompt = _fit_positions(prompt, max_new_tokens, depth, models, truncate_prompt)
    options = resolve_options(options, target, tokens=max_new_tokens)

    with torch.inference_mode(), eval_mode(models):
        target_kv: KVModel = cached_target(target, vocab, options, len(prompt) + max_new_tokens)
        if streaming is not None:
            target_kv = StreamingKV(target_kv, streaming, rope)
        lazy_head = _lazy_head(options, target_kv)
        recorder = None
        if trace is not None:
            from dynatree.loop.trace import TraceRecorder

            recorder = TraceRecorder(tokenizer, on_round)
            on_round = recorder
        # The run's whole setup, in one frozen context: what the proposer opens from and the loop reads.
        drafts = proposer_cls is not None
        context = RunContext(
            target, target_kv, vocab, options, len(prompt) + max_new_tokens, streaming, allow_vocab_mismatch,
            policy=policy if drafts and proposer_cls.models(draft) else None,  # (no draft model: no tree shape)
            sampler=DraftSampler(rng, sampling.draft_temperature) if drafts and policy.samples_children else None,
            cost_profile=(_cost_profile(target_kv, target, options, lazy_head, streaming, policy, proposer_cls, draft)
                          if drafts else lambda: None),
            strategy=policy.name, max_new_tokens=max_new_tokens, stop=_eos_set(target, stopping.eos_token_id),
            stop_text=stop_text, sampling=sampling, rng=rng, tree_order=options.tree_order, lazy_head=lazy_head,
            screened_head=_screened_head(options, lazy_head),
            sync=sync, on_round=on_round, backoff=_pacer(backoff, drafts and sampling.greedy and sync is None),
            shared_random=policy.samples_children)
        proposer = open_proposer(draft, context) if drafts else None
        result = _decode(target_kv, proposer, prompt, context)
        result.stats.cost_profile = policy.cost_profile
    if recorder is not None:
        recorder.write(trace, result, policy)
    device = input_ids.device if isinstance(input_ids, torch.Tensor) else None
    if device is not None and result.sequences.device != device:  # back where the prompt came from
        result = dataclasses.replace(result, sequences=result.sequences.to(device))
    return result


def _group(value: Any, kind: type, name: str) -> Any:
    """A settings group as given, or its defaults for None; anything else refused in one line."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise DynaTreeError(f"{name}= takes a {kind.__name__}, got {type(value).__name__}")
    return value


def with_text(draft: Any, text: bool, max_new_tokens: int | None = None, kv_window: int | None = None) -> Any:
    """What drafts the run: a draft model joined by the text in one tree (``text=True``, a
    :class:`~dynatree.drafts.suffix.TextDraft` wrapping it), or the draft as given. ``text`` applies
    to a draft model only (the built-in model and feature-head proposers): ``None`` and a
    ``TextDraft`` draft from the text whatever it says, and a draft that a proposer of one's own
    takes stays its.

    The default's text proposals reach no deeper than the run can use: ``max_new_tokens`` (a
    deeper node is never committed) and, under KV eviction, ``kv_window - 1`` (a node must see all
    its ancestors). So the default fits every run the model alone fits, instead of reserving the
    text's full depth in positions or refusing a window the user chose for the model's tree."""
    if not isinstance(text, bool):
        raise DynaTreeError(f"text must be True or False, got {text!r}")
    if text and proposer_for(draft) in (ModelProposer, FeatureProposer):
        return TextDraft(model=draft, max_spec=text_depth(max_new_tokens, kv_window))
    return draft


def text_depth(max_new_tokens: int | None = None, kv_window: int | None = None) -> int:
    """The deepest text proposal a run can use: the text's own cap (``TextDraft.max_spec``), at most
    ``max_new_tokens`` and, under KV eviction, ``kv_window - 1``."""
    bounds = [TextDraft.max_spec, *(b for b in (max_new_tokens, kv_window and kv_window - 1) if b)]
    return max(1, min(bounds))


def _pacer(backoff: bool | Backoff | None, applies: bool) -> Backoff | None:
    """The run's back-off controller: None when it is off (``backoff=False``, or None with
    ``DYNATREE_BACKOFF=off``) or does not apply (no proposer, a sampled or tensor-parallel run);
    a given :class:`Backoff` sets the thresholds, and its copy keeps this call's state."""
    if backoff is None:
        backoff = backoff_module.enabled()
    if backoff is False or not applies:
        return None
    return dataclasses.replace(backoff) if isinstance(backoff, Backoff) else Backoff()


def _lazy_head(options: EngineOptions, target_kv: Any) -> bool:
    """Whether acceptance computes the head only on the rows it reads: the engine's setting, by
    default on a CPU (where the head over a large vocabulary is a large share of a forward)."""
    if options.lazy_head is None:
        return target_kv.device.type == "cpu" and target_kv.supports_lazy_head()
    if options.lazy_head and not target_kv.supports_lazy_head():
        raise DynaTreeError("lazy_head=True needs a model whose logits are head(hidden states) exactly")
    return options.lazy_head


def _screened_head(options: EngineOptions, lazy_head: bool) -> bool:
    """Whether greedy acceptance reads the head's argmax through its int8 screen: by default
    wherever the head is lazy (the screen replaces reading a row's whole fp32 head; where a row's
    logits are computed anyway it gains nothing); the KV cache keeps the fp32 head where the
    screen does not apply (:mod:`dynatree.runtime.kernels.screened_head`)."""
    if options.screened_head is None:
        return lazy_head
    if options.screened_head and not lazy_head:
        raise DynaTreeError("screened_head=True needs the lazy head (lazy_head=True or None on a CPU)")
    return options.screened_head


def _policy(strategy: str | DraftPolicy, strategy_options: dict[str, Any]) -> DraftPolicy:
    """The run's policy: a fresh one by name, or a copy of the one given (a run changes its policy's
    state; the caller's object stays as it was). A keyword that is neither generate's nor the
    strategy's gets a hint (``temprature=`` is "did you mean temperature=?", not only "unknown
    option of dynatree")."""
    try:
        if isinstance(strategy, DraftPolicy) and not strategy_options:
            return copy.deepcopy(strategy)
        return make_policy(strategy, **strategy_options)
    except DynaTreeError as error:
        known = [p for p in inspect.signature(generate).parameters if p != "strategy_options"]
        hint = flat_keywords.suggest(strategy_options, [*known, *flat_keywords.SAMPLING, *flat_keywords.ENGINE,
                                                        *flat_keywords.STOPPING])
        if hint:
            raise DynaTreeError(f"{error}; {hint}") from None
        raise


def _cost_profile(target_kv: KVModel, target: torch.nn.Module, options: EngineOptions, lazy_head: bool,
                  streaming: StreamingConfig | None, policy: DraftPolicy, proposer_cls: type[Proposer],
                  draft: Any) -> Callable[[], Any]:
    """The run context's cost profile: the target's verify cost measured on first request (seconds;
    :func:`~dynatree.core.costmodel.profile_for`, which returns None while the cost model is off),
    then kept for the run; never under KV eviction, and only when someone in the run sizes trees
    by it (the policy of a model proposer, or the proposer itself)."""
    wanted = proposer_cls.wants_cost_model(draft) or (bool(proposer_cls.models(draft)) and policy.wants_cost_model())
    if streaming is not None or not wanted:
        return lambda: None

    @functools.cache
    def profile() -> Any:
        from dynatree.core.costmodel import profile_for

        return profile_for(target_kv, target, options.engine, options.compile, lazy_head, options.buckets,
                           options.linear_plan.kernels() if options.linear_plan else False, log=notice)

    return profile


def _decode(target: KVModel, proposer: Proposer | None, prompt: list[int], run: RunContext) -> GenerationResult:
    max_new_tokens, stop, stop_text, sampling, rng = run.max_new_tokens, run.stop, run.stop_text, run.sampling, run.rng
    backoff, sync, on_round = run.backoff, run.sync, run.on_round
    clock = sync_clock(target.device)
    stats = GenerationStats(strategy=run.strategy, prompt_tokens=len(prompt))
    start = clock()

    # 0. Prefill: cache every prompt token but the last, which becomes the first round's root.
    #    A proposer that wants features also gets the target's features of those tokens (its final
    #    hidden states, or the outputs of the layers it names). Without a proposer every round is a
    #    plain step, so the last token is cached too and its logits are the first round's: the
    #    first token then costs the prefill alone, as in HF generate and OpenVINO GenAI, not the
    #    prefill plus a one-row step (a whole read of the weights: ~25 ms a request for the
    #    embedded target on a 2-core Intel Xeon). A drafting run keeps the root apart: its first
    #    round verifies the root's row with a tree, at about the cost of the root alone.
    features = proposer is not None and proposer.wants_features
    layers = proposer.feature_layers if features else ()
    first: torch.Tensor | None = None  # (the first round's logits, computed by the prefill)
    if proposer is None:
        first = target.prefill(prompt, logits=True).view(1, -1)
    else:
        proposer.prefill(prompt, target.prefill(prompt[:-1], hidden=features, layers=layers))
    stats.t_prefill = clock() - start

    out: list[int] = []
    root = prompt[-1]
    while len(out) < max_new_tokens:
        t0 = clock()
        # 1. Draft: the proposer grows a tree under the root (a model proposer: its policy decides
        #    the shape, one draft call per level), unless the back-off says a plain step pays more.
        # (no deeper than the tokens left minus one: a node at the last committable depth would
        #  only repeat the target's own bonus token there, so the last token is never drafted)
        builder = TreeBuilder(root, target.max_tree_rows, depth_limit=max_new_tokens - len(out) - 1)
        drafting = (proposer is not None and builder.depth_limit > 0
                    and (backoff is None or backoff.should_draft()))
        if drafting:
            proposer.propose(builder)
        tree = builder.freeze()
        t1 = clock()
        # 2. Verify: ONE target forward over the root and every drafted node (the first plain
        #    round's root was run by the prefill).
        prefix = target.length
        if first is not None:
            logits, rows, first = first, None, None
        else:
            logits, rows = tree_forward(target, tree, run.tree_order, run.lazy_head, keep_hidden=features,
                                        screen=run.screened_head,
                                        feature_layers=layers)
        t2 = clock()
        # 3. Accept: the path the target agrees with (greedy) or accepts (rejection sampling),
        #    plus one more token from the target (its argmax, or a draw from the residual R, which
        #    is the target itself at a fully accepted leaf).
        if sampling.greedy:
            path, bonus = greedy_accept(tree, logits)
        else:
            path, bonus = sample_accept(tree, logits, sampling, rng)
        if sync is not None:  # rank 0's decision (and random stream) on every rank
            random = not sampling.greedy or run.shared_random
            path, bonus = sync.decide(path, bonus, tree.max_depth, rng if random else None)
        # 4. Commit: keep the root's and the accepted nodes' KV rows in the target's cache; the
        #    proposer brings its own state in line and learns from the round (a feature proposer
        #    gets the target's features of the root and the path).
        if rows is not None:
            target.compact(prefix, rows[[0, *path]])
        if proposer is not None:
            proposer.observe(Outcome(tree, path, bonus, logits.features[[0, *path]] if features else None,
                                     drafted=drafting, overhead_ms=1e3 * (t1 - t0 + clock() - t2)))
        new = committed_tokens(tree, path, bonus)
        new = _truncate(new, max_new_tokens - len(out), stop)
        hit = stop_text is not None and stop_text.cut(out, new)
        if hit:
            new = new[:hit]
        out += new
        root = bonus
        t3 = clock()
        if not stats.rounds:
            stats.ttft = t3 - start
        # 5. Observe: per-round statistics and history adaptation.
        accepted = min(len(path), len(new))
        stats.rounds.append(
            RoundStats(
                committed=len(new),
                accepted=accepted,
                drafted=tree.num_drafted,
                depth=tree.max_depth,
                draft_calls=proposer.calls if drafting else 0,
                t_draft=t1 - t0,
                t_verify=t2 - t1,
                t_commit=t3 - t2,
                policy_state=proposer.state() if proposer is not None else {},
            )
        )
        if backoff is not None and builder.depth_limit > 0:  # (the last token is always plain: not its choice)
            # (not judged: a round whose draft model ran over the prompt, which paid a cost of
            #  starting, not of speculating; and a round whose proposer proposed nothing, which was
            #  a plain step plus a lookup: a text index without a match judged as a loser paused a
            #  winning text draft after its first rounds)
            judged = not (drafting and (proposer.catching_up or tree.num_drafted == 0))
            backoff.observe(drafting, len(new), t3 - t0, judged=judged)
        if on_round is not None:
            on_round(RoundEvent(new, tree, path, bonus, stats.rounds[-1]))
        if new[-1] in stop or hit:
            break

    if proposer is not None:  # (tokens committed past a stop or the length limit are not the request's)
        proposer.finish(len(prompt) + len(out))
    stats.new_tokens = len(out)
    stats.t_total = clock() - start
    sequences = torch.tensor([prompt + out], dtype=torch.long)
    return GenerationResult(sequences=sequences, stats=stats)


_truncate = truncate_round  # (a module name of its own: the mutant tests replace it)


class StopText:
    """Finds the first new token after which the generated text contains a stop string.

    Only a tail of the output is decoded with the new tokens: a stop string completed by them
    starts at most ``len(s) - 1`` characters before, and any earlier occurrence would have stopped
    an earlier round. Decoding the whole output every round made a long generation quadratic.
    The tail is generous (4 tokens per character plus 8: byte-level tokens can take up to 4 per
    character) so a boundary artifact at its start cannot reach the stop string.
    """

    def __init__(self, tokenizer: Any, strings: list[str]) -> None:
        self.tokenizer, self.strings = tokenizer, strings
        self.tail = 4 * max(len(x) for x in strings) + 8

    def cut(self, out: list[int], new: list[int]) -> int:
        """1-based length of ``new`` to keep (0: no stop string completed in this round)."""
        context = out[-self.tail :]
        for j in range(1, len(new) + 1):
            text = self.tokenizer.decode(context + new[:j])
            if any(s in text for s in self.strings):
                return j
        return 0


def _generate_batch(target: torch.nn.Module, draft: Any, prompts: list[list[int]], policy: DraftPolicy,
                    max_new_tokens: int, sampling: SamplingConfig, options: EngineOptions, stopping: StoppingConfig,
                    stop_text: StopText | None, seed: Any, generator: torch.Generator | None, truncate_prompt: bool,
                    allow_vocab_mismatch: bool, on_round: Any, trace: Any, backoff: Any,
                    given: torch.Tensor | None) -> GenerationResult:
    """:func:`generate` for several prompts: the same checks per row, then :mod:`dynatree.loop.batch`."""
    proposer_cls = proposer_for(draft) if policy.uses_draft else None
    tensor_parallel = distributed.RankSync.for_models(target, draft if policy.uses_draft else None) is not None
    batch.refuse(options, proposer_cls, on_round, trace, tensor_parallel)
    rngs = batch.row_generators(len(prompts), seed, generator)
    models, depth = _positioned(policy, target, draft, proposer_cls, max_new_tokens)
    prompts = [_fit_positions(p, max_new_tokens, depth, models, truncate_prompt) for p in prompts]
    asked_aot = options.engine == "aot"
    options = resolve_options(options, target)
    vocab = vocab_size(target)
    with torch.inference_mode(), eval_mode(models):
        plan = options.cache_options(next(target.parameters()).device.type).linear_plan  # (as a single prompt's)
        # The aot engine when asked for, or when "auto" chose it and the batch's own package is
        # built (building it unasked would cost minutes): runtime/aot_batch.py
        if options.engine == "aot" and (asked_aot or aot_batch.cached(target, plan or False)):
            target_kv = aot_batch.AOTBatchedKV(target, vocab, plan or False)
        else:
            target_kv = BatchedKV(target, vocab, plan or False)
        drafts = BatchDrafts(len(prompts), vocab, plan or False)  # (the rows' draft calls run together)
        lazy_head = _lazy_head(options, target_kv)
        # The batch's whole setup in one frozen context (each row's proposer gets a copy with its
        # own policy and sampler: batch.open_row_proposers).
        context = RunContext(
            target, target_kv, vocab, options, max(map(len, prompts)) + max_new_tokens,
            allow_vocab_mismatch=allow_vocab_mismatch, strategy=policy.name, max_new_tokens=max_new_tokens,
            stop=_eos_set(target, stopping.eos_token_id), stop_text=stop_text, sampling=sampling,
            lazy_head=lazy_head, screened_head=_screened_head(options, lazy_head),
            backoff=_pacer(backoff, proposer_cls is not None and sampling.greedy),
            pad_token_id=batch.pad_token(target, stopping.pad_token_id, stopping.eos_token_id),
            tree_rows=batch.BATCH_TREE_ROWS, draft_kv=drafts)
        proposers = batch.open_row_proposers(draft, proposer_cls, context, policy, sampling, rngs)
        result = batch.decode_batch(target_kv, proposers, prompts, rngs, context, drafts)
        if given is not None and given.shape[1] == max(map(len, prompts)):  # HF returns the prompts as given
            result.sequences[:, : given.shape[1]] = given.cpu()
    if given is not None and result.sequences.device != given.device:
        result = dataclasses.replace(result, sequences=result.sequences.to(given.device))
    return result


# ----------------------------------------------------------------------------- validation


def max_positions(model: torch.nn.Module) -> int | None:
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_positions(prompt_tokens: int, max_new_tokens: int, policy: DraftPolicy, target: torch.nn.Module,
                    draft: torch.nn.Module | None, truncate_prompt: bool = False) -> None:
    """Raise the one-line error :func:`generate` would raise for a run whose positions do not fit
    the models (without KV eviction), before anything is spent on it: the CLI calls this before it
    prints the prompt and before it compiles every graph for the run, whose cache is sized by
    ``max_new_tokens`` (10**9 of them would be an allocation of gigabytes, not an error)."""
    models, depth = run_positions(policy, target, draft, max_new_tokens)
    _fit_positions([0] * prompt_tokens, max_new_tokens, depth, models, truncate_prompt)


def run_positions(policy: DraftPolicy, target: torch.nn.Module, draft: Any,
                  max_new_tokens: int) -> tuple[list[torch.nn.Module], int]:
    """The models whose positions a run of ``policy`` fills, and the deepest tree it can grow: the
    policy's (never deeper than the run's new tokens: the loop limits every round's tree to the
    tokens left), or the proposer's own (the text of ``draft=None`` grows its own). What
    :func:`generate` checks positions against."""
    return _positioned(policy, target, draft, proposer_for(draft) if policy.uses_draft else None, max_new_tokens)


def _positioned(policy: DraftPolicy, target: torch.nn.Module, draft: Any,
                proposer_cls: type[Proposer] | None, max_new_tokens: int) -> tuple[list[torch.nn.Module], int]:
    models = [target] + (proposer_cls.models(draft) if proposer_cls is not None else [])
    depth = max(min(policy.max_depth(), max_new_tokens),
                proposer_cls.max_depth(draft) if proposer_cls is not None else 0)
    return models, depth


def _fit_positions(
    prompt: list[int], max_new_tokens: int, depth: int, models: list[torch.nn.Module], truncate: bool
) -> list[int]:
    """Refuse (or left-truncate) a run whose positions would exceed a model's maximum."""
    need_extra = max_new_tokens + depth
    for model in models:
        limit = max_positions(model)
        if limit is None:
            continue
        need = len(prompt) + need_extra
        if need <= limit:
            continue
        if truncate and need_extra < limit:
            prompt = prompt[len(prompt) - (limit - need_extra) :]
            continue
        if need_extra >= limit:  # truncating the prompt cannot help: fewer new tokens (or eviction) can
            most = limit - depth - (1 if truncate else len(prompt))
            fixes = [f"max_new_tokens (--max-new-tokens) can be at most {most} here"] if most > 0 else []
            hint = "; " + ", or ".join([*fixes, "pass options=EngineOptions(kv_window=N) (--kv-window) for "
                                                "StreamingLLM-style KV eviction"])
        else:
            hint = "" if truncate else ("; pass truncate_prompt=True (--truncate-prompt) to keep the last tokens of "
                                        "the prompt, or options=EngineOptions(kv_window=N) (--kv-window) for "
                                        "StreamingLLM-style KV eviction")
        raise DynaTreeError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + tree depth ({depth}) = {need} "
            f"positions exceeds {type(model).__name__}'s maximum of {limit} by {need - limit}{hint}"
        )
    return prompt


def _eos_set(target: torch.nn.Module, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        gen = getattr(target, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos_token_id is None:
            return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(int(t) for t in eos_token_id)

