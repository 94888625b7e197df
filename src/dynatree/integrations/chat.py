"""Streaming text and a terminal chat loop on top of :func:`dynatree.generate`.

Text is printed as each round commits it (through the engine's ``on_round`` hook and HF's
``TextStreamer``, which holds back incomplete words and multi-byte characters), so the speculative
rounds are visible as bursts of several tokens. Chat prompts go through the tokenizer's own chat
template, the format an instruct model was trained on.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import torch
from transformers import TextStreamer

from dynatree.loop.generate import generate, max_positions, run_positions, with_text
from dynatree.errors import DynaTreeError
from dynatree.options import EngineOptions, StoppingConfig
from dynatree.core.sampling import SamplingConfig
from dynatree.policies import DraftPolicy, make_policy
from dynatree.core.stats import GenerationResult, GenerationStats, RoundEvent


class EchoStreamer(TextStreamer):
    """HF's ``TextStreamer`` writing to a chosen stream (default stdout), fed round by round."""

    def __init__(self, tokenizer: Any, out: TextIO | None = None, **decode_kwargs: Any) -> None:
        super().__init__(tokenizer, skip_prompt=False, skip_special_tokens=True, **decode_kwargs)
        self.out = out

    def on_round(self, event: RoundEvent) -> None:
        """``generate(on_round=...)`` hook: push the round's committed tokens."""
        self.put(torch.tensor(event.tokens, dtype=torch.long))

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        out = self.out or sys.stdout
        out.write(text + ("\n" if stream_end else ""))
        out.flush()


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ready for the reply."""
    if not getattr(tokenizer, "chat_template", None):
        raise DynaTreeError("this tokenizer has no chat template; drop --chat or use an instruct/chat model")
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(enc["input_ids"])


def chat_eos(target: torch.nn.Module, tokenizer: Any) -> list[int]:
    """Stop tokens for a reply: the model's generation_config EOS plus the tokenizer's (the
    end-of-turn token), since chat templates end a turn with the tokenizer's EOS."""
    eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    ids = set([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def status_line(stats: GenerationStats) -> str:
    """One line per turn: speed and tokens per round (what speculation buys)."""
    return (f"[{stats.strategy}] {stats.new_tokens} tokens in {stats.t_total:.2f}s = "
            f"{stats.tokens_per_second:.1f} tok/s | {stats.mean_committed:.2f} tokens/round over "
            f"{stats.num_rounds} rounds | acceptance {stats.acceptance:.0%}")


class ChatSession:
    """A conversation with the target, one :func:`dynatree.generate` call per turn.

    Each turn runs the whole conversation again from the chat template (the engine keeps no cache
    between calls). A conversation that outgrows the models' positions loses its oldest turns,
    whole (the system prompt stays), so the model never reads a message cut in the middle;
    :attr:`dropped` says how many the last turn dropped. Only a single message too long even on
    its own is left-truncated by the engine.
    """

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None, tokenizer: Any,
                 strategy: str | DraftPolicy = "dynatree", *, system: str | None = None,
                 out: TextIO | None = None, max_new_tokens: int = 256, sampling: SamplingConfig | None = None,
                 options: EngineOptions | None = None, seed: int | None = None, text: bool = True,
                 **strategy_options: Any) -> None:
        policy = make_policy(strategy, **strategy_options)  # (refuses a bad strategy before the first message)
        # the draft as generate() runs it, resolved once: a draft model joined by the text unless text=False
        draft = with_text(draft, text, max_new_tokens, (options or EngineOptions()).kv_window) if policy.uses_draft else draft
        self.target, self.draft, self.tokenizer, self.strategy = target, draft, tokenizer, strategy
        self.system, self.out, self.max_new_tokens = system, out, max_new_tokens
        self.sampling, self.options, self.seed = sampling, options or EngineOptions(), seed
        self.strategy_options = strategy_options
        self.messages: list[dict[str, str]] = []
        self.dropped = 0  # oldest turns the last turn() dropped to fit the models' positions
        self.max_positions, self.room = self._prompt_room()
        self.reset()

    def _prompt_room(self) -> tuple[int | None, int | None]:
        """The models' positions and how many of them a templated conversation may take: what is
        left after the reply and one drafted tree, as generate's position check counts. (None,
        None) when nothing limits it (no known maximum, or KV eviction). A reply length that
        leaves no room at all is refused here, before the first message is typed."""
        if self.options.kv_window is not None:
            return None, None
        policy = make_policy(self.strategy, **self.strategy_options)
        models, depth = run_positions(policy, self.target, self.draft, self.max_new_tokens)
        limits = [n for n in map(max_positions, models) if n is not None]
        if not limits:
            return None, None
        limit = min(limits)
        room = limit - self.max_new_tokens - depth
        if room < 1:
            raise DynaTreeError(
                f"max_new_tokens={self.max_new_tokens} and a tree of depth {depth} leave no room for the "
                f"conversation in the model's {limit} positions: use max_new_tokens (--max-new-tokens) of at "
                f"most {limit - depth - 1}")
        return limit, room

    def reset(self) -> None:
        """Forget the conversation (keeps the system prompt)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def turn(self, text: str) -> GenerationResult:
        """Send one user message; the reply is streamed to ``out`` and kept in the history."""
        before = list(self.messages)
        self.messages.append({"role": "user", "content": text})
        streamer = EchoStreamer(self.tokenizer, self.out)
        try:
            ids, dropped = self._fitting_prompt()
            result = generate(self.target, self.draft, ids, self.strategy, max_new_tokens=self.max_new_tokens,
                              sampling=self.sampling, options=self.options, seed=self.seed,
                              stopping=StoppingConfig(eos_token_id=chat_eos(self.target, self.tokenizer)),
                              truncate_prompt=True, tokenizer=self.tokenizer, on_round=streamer.on_round,
                              text=False,  # (self.draft is already what runs: the text is joined, or not wanted)
                              **self.strategy_options)
        except BaseException:
            self.messages = before  # the turn did not happen, nor did dropping turns for it
            raise
        finally:
            streamer.end()
        self.dropped = dropped
        new = result.sequences[0, result.sequences.shape[1] - result.stats.new_tokens:]
        reply = self.tokenizer.decode(new, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": reply.strip()})
        return result

    def _fitting_prompt(self) -> tuple[list[int], int]:
        """The conversation's token ids, its oldest turns (a user message and its reply) dropped
        until it fits :attr:`room`; the number dropped. The newest message is never dropped."""
        ids, dropped = chat_prompt(self.tokenizer, self.messages), 0
        first = 1 if self.messages[0]["role"] == "system" else 0
        while self.room is not None and len(ids) > self.room and len(self.messages) - first > 1:
            end = first + 1  # the oldest turn: its user message and everything up to the next one
            while end < len(self.messages) - 1 and self.messages[end]["role"] != "user":
                end += 1
            del self.messages[first:end]
            dropped += 1
            ids = chat_prompt(self.tokenizer, self.messages)
        return ids, dropped
