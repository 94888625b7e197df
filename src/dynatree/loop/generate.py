"""The decoding loop: prefill, then rounds of draft -> verify -> accept -> commit -> observe.

State between rounds: both caches hold every committed token except the last one (the *root*),
which the next round feeds to the target together with the drafted tree. So each round costs one
target forward, whatever the tree's size, and no committed token is ever run twice.

Acceptance is greedy at temperature 0 and lossless rejection sampling otherwise
(:mod:`dynatree.core.verify`); one CPU generator drives every random draw of a run (the DySpec policies'
child sampling and the verifier's), so ``seed=`` or ``generator=`` makes a run reproducible.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any

import torch

from dynatree.runtime import distributed
from dynatree.core.draft_source import DraftSource, SourceContext
from dynatree.core.kv import KVModel
from dynatree.core.clock import sync_clock
from dynatree.loop import backoff as backoff_module
from dynatree.loop.backoff import Backoff
from dynatree.drafts.registry import source_for
from dynatree.drafts.suffix import TextDraft
from dynatree.runtime.cache import vocab_size
from dynatree.runtime.engines import cached_target, eval_mode, notice, resolve as resolve_options
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions
from dynatree.policies import DraftPolicy, RoundFeedback, make_policy
from dynatree.catalog import DRAFT_TEMPERATURE
from dynatree.core.sampling import DraftSampler, SamplesDraft, SamplingConfig, make_generator
from dynatree.core.stats import GenerationResult, GenerationStats, RoundEvent, RoundStats
from dynatree.runtime.streaming import StreamingConfig, StreamingKV, find_rope
from dynatree.core.tree import TreeBuilder, committed_tokens
from dynatree.core.verify import greedy_accept, sample_accept, tree_forward


def generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | TextDraft | None,
    input_ids: torch.Tensor | Sequence[int],
    strategy: str | DraftPolicy = "dynatree",
    max_new_tokens: int = 128,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    draft_temperature: float = DRAFT_TEMPERATURE,
    truncate_prompt: bool = False,
    allow_vocab_mismatch: bool = False,
    engine: str = "auto",
    compile: bool | str | None = None,
    buckets: Sequence[int] | None = None,
    tree_order: str = "bfs",
    stop_strings: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    lazy_head: bool | None = None,
    kv_window: int | None = None,
    kv_sinks: int = 4,
    cpu_linear: bool | None = None,
    on_round: Callable[[RoundEvent], None] | None = None,
    trace: str | PathLike | None = None,
    options: EngineOptions | None = None,
    backoff: bool | Backoff | None = None,
    **strategy_options: Any,
) -> GenerationResult:
    """Generate with tree speculative decoding: at temperature 0 the output equals the target's own
    greedy output; above it, the output follows the target's sampling distribution exactly.

    Args:
        target: any HF causal LM (GPTNeoX/Pythia, Llama, Qwen2, GPT-2, ...), unmodified.
        draft: a causal LM over the same vocabulary; None to draft from the text itself (the
            prompt and what has been written: no second model); a
            :class:`~dynatree.drafts.suffix.TextDraft` to tune that, or with ``model=`` to draft
            from both in one tree.
        input_ids: one prompt, ``[1, L]`` or ``[L]`` (batch size 1 only).
        strategy: ``"autoregressive"``, ``"linear"``, ``"fixed"``, ``"dynatree"``, ``"dyspec"``,
            ``"dyspec-threshold"``, one of them with options as the bench writes them
            (``"linear:k=5"``), or a policy object (a :class:`~dynatree.policies.DraftPolicy`).
        max_new_tokens: tokens to generate at most (the last round is truncated exactly).
        eos_token_id: stop after this token (or any of these). None uses the target's
            ``generation_config.eos_token_id``, as HF ``generate`` does; ``[]`` never stops early.
        temperature: 0 for greedy decoding; > 0 samples from the target at this temperature.
        top_k: sample only among the target's k most likely tokens (None or 0: off).
        top_p: nucleus sampling on the target distribution (None or 1: off).
        seed: seed of a fresh CPU generator for every random draw of the run (reproducible runs).
        generator: a CPU ``torch.Generator`` to draw from instead (advanced by the run). With
            neither, torch's global generator is used, so ``torch.manual_seed`` reproduces a run.
        draft_temperature: temperature of the draft distribution DySpec samples children from
            (default 0.6, as in DySpec); the other strategies choose children deterministically.
        truncate_prompt: left-truncate a prompt that would run past the models' maximum positions.
        allow_vocab_mismatch: skip the draft/target vocabulary-size check (draft logits are cut to
            the target's vocabulary).
        engine: ``"auto"`` (default: see :func:`dynatree.runtime.engines.resolve`), ``"hf"`` (dynamic HF
            cache, any tree size) or ``"static"`` (pre-allocated cache, tree sizes padded to buckets
            of up to 256 nodes; what ``compile`` needs).
        compile: ``torch.compile`` the static engine's model calls (one graph per bucket). True
            picks ``mode="reduce-overhead"`` (CUDA graphs) on GPU and the default mode on CPU; a
            string is passed as the mode. Compiled engines are kept per model and reused. None:
            decided with ``engine="auto"``, off otherwise.
        buckets: query-count buckets of the static engine (default 1, 2, 4, ..., 256): fewer
            buckets mean fewer compiled graphs, more padding.
        stop_strings: stop once the generated text contains one of these (the token completing it
            is kept, as with HF ``generate(stop_strings=..., tokenizer=...)``); needs ``tokenizer``.
        tokenizer: the tokenizer used to decode for ``stop_strings``.
        lazy_head: apply the target's LM head only to the tree nodes acceptance reads (None:
            automatically on CPU, where the head is a large share of a verify).
        tree_order: ``"bfs"`` (creation order) or ``"dfs"`` (depth-first; makes the tree mask
            block-sparse for the Triton tree-attention kernel, DySpec App. C).
        kv_window: StreamingLLM-style eviction (the first DynaTree paper version's baseline): keep only the ``kv_sinks``
            first tokens and the ``kv_window`` most recent ones in both caches, so a run may go
            past the models' maximum positions. Greedy output equals greedy autoregressive
            output *under the same eviction*, not the full-context output. RoPE models, hf engine.
        kv_sinks: attention-sink tokens kept with ``kv_window`` (StreamingLLM uses 4).
        cpu_linear: compute the linear layers of calls of up to 64 rows as ``(W @ x.T).T``
            (:mod:`dynatree.runtime.kernels.cpu_linear`): on the CPU it was measured on, a tree of a few
            nodes then costs less than one ``F.linear`` step. None: on for CPU models run with 2+
            torch threads (with 1 it measured slower). Applies to the autoregressive baseline too,
            so speedups compare equal machinery.
        on_round: called after every round with its :class:`~dynatree.core.stats.RoundEvent` (the
            committed tokens, the drafted tree, the accepted path): what streamers and the trace
            page are fed from, as soon as a round commits rather than at the end.
        trace: write a self-contained HTML page of every round's tree to this path
            (:mod:`dynatree.loop.trace`; token text needs ``tokenizer``).
        options: the engine settings above (``engine`` to ``cpu_linear``) as one
            :class:`~dynatree.options.EngineOptions`; keywords then left at their defaults defer to
            it, and one that contradicts it is refused.
        backoff: decode plain (one target step, no drafting) while speculative rounds commit
            tokens more slowly than plain steps do, probing again later
            (:class:`~dynatree.loop.backoff.Backoff`; a ``Backoff`` instance sets its thresholds;
            None: on, see ``dynatree.loop.backoff.ENABLED``).
            Greedy runs only: the output is the same either way; a sampled run's random draws
            would depend on timing. Off under tensor parallelism (ranks must build equal trees).
        **strategy_options: fields of the strategy's config (e.g. ``k=5`` for linear).
    """
    options = EngineOptions.merge(options, engine=engine, compile=compile, buckets=buckets, cpu_linear=cpu_linear,
                                  lazy_head=lazy_head, tree_order=tree_order, kv_window=kv_window, kv_sinks=kv_sinks)
    policy = make_policy(strategy, **strategy_options)
    sampling = SamplingConfig(temperature, top_k, top_p, draft_temperature)
    rng = make_generator(seed, generator)
    # Tensor-parallel target: every rank must draw the same numbers and commit the same tokens.
    sync = distributed.RankSync.for_models(target, draft if policy.uses_draft else None)
    if sync is not None:
        sync.share_generator(rng)
    if isinstance(policy, SamplesDraft):
        policy.use_sampler(DraftSampler(rng, sampling.draft_temperature))  # validated above
    prompt = _check_prompt(input_ids, target)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DynaTreeError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    policy.limit_depth(max_new_tokens)  # deeper nodes could never be committed
    vocab = vocab_size(target)
    # draft=None: speculate from the text itself (the suffix source)
    source_cls = source_for(draft) if policy.uses_draft else None
    models, depth = _positioned(policy, target, draft, source_cls)
    streaming = None
    if options.kv_window is not None:
        streaming = StreamingConfig(options.kv_window, options.kv_sinks)
        rope = find_rope(target)  # (a draft's own, when it evicts too, is found where its cache is opened)
        for m in models:
            streaming.check(m, depth, max_positions(m))
    else:
        prompt = _fit_positions(prompt, max_new_tokens, depth, models, truncate_prompt)
    stop = _eos_set(target, eos_token_id)
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if stop_strings:
        if tokenizer is None:
            raise DynaTreeError("stop_strings need a tokenizer (pass tokenizer=...)")
        if any(not isinstance(x, str) or not x for x in stop_strings):
            raise DynaTreeError(f"stop_strings must be non-empty strings, got {stop_strings!r}")
    stop_text = StopText(tokenizer, list(stop_strings)) if stop_strings else None
    options = resolve_options(options, target)

    with torch.inference_mode(), eval_mode(models):
        target_kv: KVModel = cached_target(target, vocab, options, len(prompt) + max_new_tokens)
        if streaming is not None:
            target_kv = StreamingKV(target_kv, streaming, rope)
        source = None
        if source_cls is not None:
            source = source_cls.open(draft, SourceContext(target, target_kv, vocab, options, len(prompt) + max_new_tokens,
                                                          streaming, allow_vocab_mismatch))
        lazy_head = options.lazy_head
        if lazy_head is None:
            lazy_head = target_kv.device.type == "cpu" and target_kv.supports_lazy_head()
        elif lazy_head and not target_kv.supports_lazy_head():
            raise DynaTreeError("lazy_head=True needs a model whose logits are head(hidden states) exactly")
        # The tree budget from the measured verify cost: the policy's (no draft model: no policy
        # budget) and the source's own (the text's proposal is cut to what pays for its rows).
        policy_cost = len(models) > 1 and policy.wants_cost_model()
        source_cost = source is not None and source.wants_cost_model()
        if streaming is None and (policy_cost or source_cost):
            from dynatree.core.costmodel import profile_for

            profile = profile_for(target_kv, target, options.engine, options.compile, lazy_head,
                                  options.buckets, options.cpu_linear, log=notice)
            if policy_cost:
                policy.use_cost_model(profile)
            if source_cost:
                source.use_cost_model(profile)
        recorder = None
        if trace is not None:
            from dynatree.loop.trace import TraceRecorder

            recorder = TraceRecorder(tokenizer, on_round)
            on_round = recorder
        pacer = None
        if backoff is None:
            backoff = backoff_module.ENABLED
        if backoff is not False and source is not None and sampling.greedy and sync is None:
            pacer = backoff if isinstance(backoff, Backoff) else Backoff()
        result = _decode(target_kv, source, prompt, policy, max_new_tokens, stop, vocab, sampling, rng,
                         options.tree_order, stop_text, lazy_head, sync, on_round, pacer)
    if recorder is not None:
        recorder.write(trace, result, policy)
    device = input_ids.device if isinstance(input_ids, torch.Tensor) else None
    if device is not None and result.sequences.device != device:  # back where the prompt came from
        result = dataclasses.replace(result, sequences=result.sequences.to(device))
    return result


def _decode(
    target: KVModel,
    source: DraftSource | None,
    prompt: list[int],
    policy: DraftPolicy,
    max_new_tokens: int,
    stop: set[int],
    vocab: int,
    sampling: SamplingConfig,
    rng: torch.Generator,
    tree_order: str = "bfs",
    stop_text: "StopText | None" = None,
    lazy_head: bool = False,
    sync: "distributed.RankSync | None" = None,
    on_round: Callable[[RoundEvent], None] | None = None,
    backoff: Backoff | None = None,
) -> GenerationResult:
    clock = sync_clock(target.device)
    stats = GenerationStats(strategy=policy.name, prompt_tokens=len(prompt))
    policy.reset()
    start = clock()

    # 0. Prefill: cache every prompt token but the last, which becomes the first round's root.
    #    A source that wants features also gets the target's final hidden states of those tokens.
    features = source is not None and source.wants_features
    hidden = target.prefill(prompt[:-1], hidden=features)
    if source is not None:
        source.prefill(prompt, hidden)
    stats.t_prefill = clock() - start

    out: list[int] = []
    root = prompt[-1]
    while len(out) < max_new_tokens:
        t0 = clock()
        # 1. Draft: the source grows a tree under the root (a model source: the policy decides
        #    the shape, one draft call per level), unless the back-off says a plain step pays more.
        builder = TreeBuilder(root)
        drafting = source is not None and (backoff is None or backoff.should_draft())
        if drafting:
            source.draft(builder, policy)
        tree = builder.freeze()
        t1 = clock()
        # 2. Verify: ONE target forward over the root and every drafted node.
        prefix = target.length
        logits, rows = tree_forward(target, tree, tree_order, lazy_head, keep_hidden=features)
        t2 = clock()
        # 3. Accept: the path the target agrees with (greedy) or accepts (rejection sampling),
        #    plus one more token from the target (its argmax, or a draw from the residual R, which
        #    is the target itself at a fully accepted leaf).
        if sampling.greedy:
            path, bonus = greedy_accept(tree, logits)
        else:
            path, bonus = sample_accept(tree, logits, sampling, rng)
        if sync is not None:  # rank 0's decision (and random stream) on every rank
            random = not sampling.greedy or isinstance(policy, SamplesDraft)
            path, bonus = sync.decide(path, bonus, tree.max_depth, rng if random else None)
        # 4. Commit: keep the root's and the accepted nodes' KV rows in both caches.
        target.compact(prefix, rows[[0, *path]])
        if source is not None:  # (a feature source gets the target's features of the root and path)
            source.commit(tree, path, bonus, logits.hidden[[0, *path]] if features else None)
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
                draft_calls=source.calls if drafting else 0,
                t_draft=t1 - t0,
                t_verify=t2 - t1,
                t_commit=t3 - t2,
                policy_state=policy.state(),
            )
        )
        if drafting or source is None:  # (a plain step taught the policy nothing)
            policy.observe(RoundFeedback(drafted=tree.num_drafted, accepted=len(path),
                                         overhead_ms=1e3 * (t1 - t0 + t3 - t2)))
        if backoff is not None:
            backoff.observe(drafting, len(new), t3 - t0)
        if on_round is not None:
            on_round(RoundEvent(new, tree, path, bonus, stats.rounds[-1]))
        if new[-1] in stop or hit:
            break

    if source is not None:
        source.finish()
    stats.new_tokens = len(out)
    stats.t_total = clock() - start
    sequences = torch.tensor([prompt + out], dtype=torch.long)
    return GenerationResult(sequences=sequences, stats=stats)


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


def _truncate(new: list[int], room: int, stop: set[int]) -> list[int]:
    """Cut a round's tokens at the first stop token (kept, as HF does) and at the token budget."""
    new = new[:room]
    for i, tok in enumerate(new):
        if tok in stop:
            return new[: i + 1]
    return new


# ----------------------------------------------------------------------------- validation
def _check_prompt(input_ids: torch.Tensor | Sequence[int], target: torch.nn.Module) -> list[int]:
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise DynaTreeError(
                f"batch size {ids.shape[0]} > 1 is not supported yet; call generate once per prompt"
            )
        ids = ids[0]
    if ids.dim() != 1:
        raise DynaTreeError(f"input_ids must be [1, L] or [L], got shape {tuple(torch.as_tensor(input_ids).shape)}")
    if ids.numel() == 0:
        raise DynaTreeError("empty prompt: input_ids has no tokens")
    if ids.dtype.is_floating_point:
        raise DynaTreeError("input_ids must be integer token ids")
    vocab = vocab_size(target)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise DynaTreeError(f"token id {hi if hi >= vocab else lo} out of range for the target vocabulary (size {vocab})")
    return ids.tolist()


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
    policy.limit_depth(max_new_tokens)
    models, depth = run_positions(policy, target, draft)
    _fit_positions([0] * prompt_tokens, max_new_tokens, depth, models, truncate_prompt)


def run_positions(policy: DraftPolicy, target: torch.nn.Module, draft: Any) -> tuple[list[torch.nn.Module], int]:
    """The models whose positions a run of ``policy`` (its depth already limited to the run's new
    tokens) fills, and the deepest tree it can grow: the policy's, or the draft source's own (the
    text source of ``draft=None`` grows its own). What :func:`generate` checks positions against."""
    return _positioned(policy, target, draft, source_for(draft) if policy.uses_draft else None)


def _positioned(policy: DraftPolicy, target: torch.nn.Module, draft: Any,
                source_cls: type[DraftSource] | None) -> tuple[list[torch.nn.Module], int]:
    models = [target] + (source_cls.models(draft) if source_cls is not None else [])
    depth = max(policy.max_depth(), source_cls.max_depth(draft) if source_cls is not None else 0)
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
            hint = "; " + ", or ".join([*fixes, "pass kv_window=N (--kv-window) for StreamingLLM-style KV eviction"])
        else:
            hint = "" if truncate else ("; pass truncate_prompt=True (--truncate-prompt) to keep the last tokens of "
                                        "the prompt, or kv_window=N (--kv-window) for StreamingLLM-style KV eviction")
        raise DynaTreeError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + tree depth ({depth}) = {need} "
            f"positions exceeds {type(model).__name__}'s maximum of {limit} by {need - limit}{hint}"
        )
    return prompt


def _eos_set(target: torch.nn.Module, eos_token_id: int | Sequence[int] | None) -> set[int]:
    if eos_token_id is None:
        gen = getattr(target, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos_token_id is None:
            return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(t) for t in eos_token_id}

