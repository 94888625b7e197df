"""Tree speculation behind HF's own ``generate``: ``model.generate(..., custom_generate=...)``.

transformers 5.x lets ``GenerationMixin.generate`` hand its decoding loop to a user function, in
two ways that call it differently (this module follows both contracts as transformers 5.0 to 5.23,
the range ``pyproject.toml`` allows, define them; it reads no caller's stack frame):

* ``custom_generate=dynatree.hf.generate`` (a callable): HF first merges ``generation_config``
  with the keyword arguments, builds its logits processors and stopping criteria, puts the prompt
  into the streamer, then calls the function like its own ``_sample(model, input_ids, ...)``. It
  passes on the keywords the function declares that ``_sample`` lacks (``draft=``, ``strategy=``,
  ...), and none of ``generate``'s own ``assistant_model``, ``streamer`` and ``tokenizer``
  (``GenerationMixin._extract_generation_mode_kwargs``). So on this route the draft model is
  ``draft=``; streaming and ``stop_strings`` (which need the tokenizer) take one of the two
  routes below.
* ``custom_generate="path/to/this/repository"`` (with ``trust_remote_code=True``): HF loads
  ``custom_generate/generate.py``, which re-exports this function, and calls it with *all* of
  ``generate``'s raw arguments. We then run HF's ``generate`` ourselves with a closure as the
  callable, so the same preparation applies and nothing is dropped. A direct call,
  ``dynatree.hf.generate(model, ids, ...)`` with ``generate``'s arguments, does the same.

Both end in :func:`dynatree.generate`, the one decoding loop. What that loop cannot reproduce
exactly (beams, repetition penalties, ...) is refused with one line, not ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc
from transformers.generation.utils import GenerateDecoderOnlyOutput

from dynatree.catalog import DRAFT_TEMPERATURE
from dynatree.core.sampling import SamplingConfig
from dynatree.loop.flat_keywords import ENGINE
from dynatree.loop.generate import generate as _engine_generate
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.errors import DynaTreeError
from dynatree.runtime.inputs import check_causal_lm
from dynatree.policies import DraftPolicy
from dynatree.core.stats import GenerationStats, RoundEvent

# Processors HF builds from do_sample/temperature/top_k/top_p: the engine applies the same settings
# itself (read from generation_config), so these are the only ones allowed in the list.
_SAMPLING_WARPERS = (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper)
# Stopping criteria the engine reproduces: max_length/max_new_tokens, eos_token_id, stop_strings.
_OWN_CRITERIA = (sc.MaxLengthCriteria, sc.EosTokenCriteria, sc.StopStringCriteria)
# The generate argument a processor usually comes from, for the refusal message.
_PROCESSOR_ARGS = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "MinLengthLogitsProcessor": "min_length / min_new_tokens",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale / negative_prompt_ids",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "TypicalLogitsWarper": "typical_p",
    "MinPLogitsWarper": "min_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "TopHLogitsWarper": "top_h",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values",
    "WatermarkLogitsProcessor": "watermarking_config",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
}
_SUPPORTED = ("do_sample, temperature, top_k, top_p, max_new_tokens/max_length, eos_token_id, "
              "stop_strings, streamer, return_dict_in_generate")


@dataclass
class DynaTreeGenerateOutput(GenerateDecoderOnlyOutput):
    """HF's ``GenerateDecoderOnlyOutput`` (``sequences``; scores/logits/attentions are None)
    plus ``stats``: dynatree's per-round statistics of the run."""

    stats: GenerationStats | None = None


def generate(
    model: Any,
    inputs: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    prefix_allowed_tokens_fn: Any = None,
    synced_gpus: bool | None = None,
    assistant_model: torch.nn.Module | None = None,
    streamer: Any = None,
    negative_prompt_ids: torch.Tensor | None = None,
    negative_prompt_attention_mask: torch.Tensor | None = None,
    *,
    draft: torch.nn.Module | None = None,
    strategy: str | DraftPolicy = "dynatree",
    strategy_options: dict[str, Any] | None = None,
    engine_options: dict[str, Any] | None = None,
    trace: str | PathLike | None = None,
    stop_strings: str | list[str] | None = None,
    tokenizer: Any = None,
    **kwargs: Any,
) -> torch.LongTensor | DynaTreeGenerateOutput:
    """``model.generate(ids, custom_generate=dynatree.hf.generate, draft=draft, ...)``.

    Without a draft model the tree is drafted from the text itself (the prompt and what has been
    generated so far): a speedup with no second model; with one, the model and the text draft in
    one tree (``engine_options={"text": False}``: the model's tree alone). Takes the usual
    ``generate`` arguments (and a ``generation_config``) with HF's precedence, plus:

    Args:
        draft: the draft model (a causal LM over the target's vocabulary). On the callable route
            this is the way to give it: transformers does not pass ``assistant_model`` on to a
            callable ``custom_generate``. A direct call and the ``custom_generate/`` folder take
            ``assistant_model=`` too (one of the two).
        strategy: ``"dynatree"`` (default), ``"linear"``, ``"fixed"``, ``"dyspec"``,
            ``"dyspec-threshold"``, ``"autoregressive"``, or a policy object.
        strategy_options: the strategy's config fields, e.g. ``{"k": 4}`` for ``linear``. A dict
            rather than loose keywords because HF treats unknown keywords as model inputs.
        engine_options: engine settings (the fields of :class:`~dynatree.options.EngineOptions`:
            ``engine``, ``tree_order``, ``kv_window``, ...; or ``options=`` one of them),
            ``draft_temperature``, and further :func:`dynatree.generate` keywords (``seed``,
            ``backoff``, ...).
        trace: write the HTML trace of every round's tree to this path.

    Returns:
        What HF returns: the ``LongTensor`` of sequences (with the run's statistics as its
        ``.stats`` attribute), or with ``return_dict_in_generate=True`` a
        :class:`DynaTreeGenerateOutput` (a ``GenerateDecoderOnlyOutput`` with ``.stats``).
    """
    ours = dict(strategy=strategy, strategy_options=strategy_options, engine_options=engine_options, trace=trace)
    if draft is not None and assistant_model is not None:
        raise DynaTreeError("the draft model was given twice (draft= and assistant_model=): pass one")
    role = "draft" if draft is not None else "assistant_model"  # (refusals name the keyword the user wrote)
    draft = draft if draft is not None else assistant_model
    if _prepared_by_hf(logits_processor, stopping_criteria, generation_config, kwargs):
        # HF's callable route: everything is prepared; assistant_model, streamer and tokenizer were
        # not passed on (draft= was: it is ours), so none of them is here.
        return _run(model, inputs, generation_config, logits_processor, stopping_criteria, kwargs,
                    draft, streamer, tokenizer, stop_strings, **ours)

    # Raw generate() arguments (the custom_generate/ folder, or a direct call): let HF prepare them,
    # with a closure that keeps what its callable path would drop. The models' kinds and the ids'
    # form first: HF's preparation runs an encoder-decoder's encoder, and meets a list of ids with
    # an AttributeError.
    _front_door(model, draft, role, inputs if inputs is not None else kwargs.get("input_ids"))
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]

    def decode(model: Any, input_ids: torch.Tensor, logits_processor: Any = None, stopping_criteria: Any = None,
               generation_config: GenerationConfig | None = None, **model_kwargs: Any) -> Any:
        return _run(model, input_ids, generation_config, logits_processor, stopping_criteria, model_kwargs,
                    draft, streamer, tokenizer, stop_strings, **ours)

    return GenerationMixin.generate(
        model, inputs, generation_config, logits_processor, stopping_criteria, prefix_allowed_tokens_fn,
        synced_gpus, streamer=streamer, negative_prompt_ids=negative_prompt_ids,
        negative_prompt_attention_mask=negative_prompt_attention_mask, custom_generate=decode, **kwargs,
    )


def _front_door(model: Any, draft: Any, role: str, ids: Any) -> None:
    """What a direct call is refused for before HF prepares anything: a target or draft
    that is not a causal LM, and ids that are not HF's ``[batch, length]`` tensor (their values are
    the engine's to check, :func:`dynatree.runtime.inputs.prompt_ids`, still before any model call)."""
    check_causal_lm(model, "target")
    if draft is not None:
        check_causal_lm(draft, role)
    if ids is not None and not isinstance(ids, torch.Tensor):
        raise DynaTreeError(f"inputs must be a [B, L] tensor of token ids, as for HF's generate, got a "
                            f"{type(ids).__name__}")
    if isinstance(ids, torch.Tensor) and ids.dim() != 2:
        raise DynaTreeError(f"inputs must be [B, L] (batch, length), as for HF's generate, got shape "
                            f"{tuple(ids.shape)}")
    if isinstance(ids, torch.Tensor) and ids.shape[1] == 0:
        raise DynaTreeError(f"empty prompt: input_ids of shape {tuple(ids.shape)} has no tokens")


def _prepared_by_hf(processors: Any, criteria: Any, config: Any, model_kwargs: dict[str, Any]) -> bool:
    """Whether HF's ``generate`` prepared this call and calls us as its decoding method (the
    callable route): it then passes its built processor and criteria lists, the merged
    ``generation_config`` and model keywords that always include ``use_cache``. A direct call
    with raw arguments has not all four, so HF prepares it first."""
    return (isinstance(processors, lp.LogitsProcessorList) and isinstance(criteria, sc.StoppingCriteriaList)
            and isinstance(config, GenerationConfig) and "use_cache" in model_kwargs)


def _run(
    model: Any,
    input_ids: torch.Tensor,
    config: GenerationConfig,
    processors: Any,
    criteria: Any,
    model_kwargs: dict[str, Any],
    draft: torch.nn.Module | None,
    streamer: Any,
    tokenizer: Any,
    stop_strings: str | list[str] | None,
    *,
    strategy: str | DraftPolicy,
    strategy_options: dict[str, Any] | None,
    engine_options: dict[str, Any] | None,
    trace: str | PathLike | None,
) -> torch.LongTensor | DynaTreeGenerateOutput:
    """The prepared call: refuse what the engine cannot reproduce, run it, shape the result as HF."""
    _refuse_unsupported(model, input_ids, config, processors, criteria, model_kwargs)
    if draft is not None:
        check_causal_lm(draft, "draft")
    # No draft model: the engine drafts from the text itself (prompt and output so far).
    if stop_strings and tokenizer is None:
        raise DynaTreeError("stop_strings need a tokenizer, and transformers does not pass tokenizer= on to a "
                            "custom_generate callable: call dynatree.hf.generate(model, ids, ..., tokenizer=tok) "
                            "or use the custom_generate/ folder")
    max_new = int(config.max_length) - int(input_ids.shape[1])
    if max_new < 1:
        raise DynaTreeError(f"nothing to generate: max_length {config.max_length} <= prompt length {input_ids.shape[1]}")
    extra = dict(engine_options or {})  # engine settings, draft_temperature, and generate's other keywords
    engine = EngineOptions.merge(extra.pop("options", None), **{k: extra.pop(k) for k in ENGINE if k in extra})
    draft_temperature = extra.pop("draft_temperature", DRAFT_TEMPERATURE)
    sampling = SamplingConfig(draft_temperature=draft_temperature)
    if config.do_sample:
        sampling = SamplingConfig(float(config.temperature), config.top_k, config.top_p, draft_temperature)
    eos = config.eos_token_id
    stopping = StoppingConfig(eos_token_id=() if eos is None else eos, stop_strings=stop_strings or ())
    def put(event: RoundEvent) -> None:
        streamer.put(torch.tensor(event.tokens, dtype=torch.long))
    on_round = put if streamer is not None else None
    mask = model_kwargs.get("attention_mask")
    if input_ids.shape[0] > 1:
        if streamer is not None:  # (HF's own streamers refuse batches too)
            raise DynaTreeError("a streamer follows one prompt: pass a batch without streamer=")
        stopping = StoppingConfig(stopping.eos_token_id, stopping.stop_strings, pad_token_id=_pad_id(config))
    try:
        result = _engine_generate(
            model, draft, input_ids, strategy, max_new_tokens=max_new, attention_mask=mask, sampling=sampling,
            options=engine,
            stopping=stopping, tokenizer=tokenizer, on_round=on_round, trace=trace, **extra, **(strategy_options or {}),
        )
    finally:
        if streamer is not None:
            streamer.end()
    sequences = result.sequences.to(input_ids.device)
    if config.return_dict_in_generate:
        return DynaTreeGenerateOutput(sequences=sequences, stats=result.stats)
    sequences.stats = result.stats  # type: ignore[attr-defined]  # a LongTensor, as HF returns, plus stats
    return sequences


def _pad_id(config: GenerationConfig) -> int | None:
    """HF's pad token for a batch's finished rows: ``pad_token_id``, else the first EOS token."""
    if config.pad_token_id is not None:
        return int(config.pad_token_id)
    eos = config.eos_token_id
    if eos is None:
        return None
    return int(eos) if isinstance(eos, int) else int(list(eos)[0])


def _refuse_unsupported(model: Any, input_ids: torch.Tensor, config: GenerationConfig, processors: Any,
                        criteria: Any, model_kwargs: dict[str, Any]) -> None:
    """One clear line for anything whose output the engine would not reproduce exactly."""
    check_causal_lm(model, "target")
    checks = [
        ((config.num_beams or 1) > 1, f"beam search (num_beams={config.num_beams})"),
        ((config.num_return_sequences or 1) > 1, f"num_return_sequences={config.num_return_sequences}"),
        (getattr(config, "penalty_alpha", None) is not None, "contrastive search (penalty_alpha)"),
        (getattr(config, "prompt_lookup_num_tokens", None) is not None, "prompt_lookup_num_tokens"),
        (bool(getattr(config, "output_scores", False) or getattr(config, "output_logits", False)),
         "output_scores / output_logits"),
        (bool(config.output_attentions or config.output_hidden_states), "output_attentions / output_hidden_states"),
        (model_kwargs.get("inputs_embeds") is not None, "inputs_embeds"),
    ]
    for bad, what in checks:
        if bad:
            raise DynaTreeError(f"{what} is not supported by dynatree custom_generate; supported: {_SUPPORTED}")
    # (a batch's attention_mask, left padding only, is checked with its ids by the engine)
    if input_ids.shape[1] == 0:  # (inputs_embeds were refused above: these are ids, and none)
        raise DynaTreeError(f"empty prompt: input_ids of shape {tuple(input_ids.shape)} has no tokens")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise DynaTreeError("a filled past_key_values is not supported by dynatree (it keeps its own caches)")
    for proc in processors or []:
        if not isinstance(proc, _SAMPLING_WARPERS):
            name = type(proc).__name__
            raise DynaTreeError(f"{_PROCESSOR_ARGS.get(name, name)} is not supported by dynatree custom_generate "
                                f"(it changes the distribution the tree is verified against); supported: {_SUPPORTED}")
    for crit in criteria or []:
        if not isinstance(crit, _OWN_CRITERIA):
            name = "max_time" if isinstance(crit, sc.MaxTimeCriteria) else f"stopping criterion {type(crit).__name__}"
            raise DynaTreeError(f"{name} is not supported by dynatree custom_generate; supported: {_SUPPORTED}")


__all__ = ["DynaTreeGenerateOutput", "generate"]
