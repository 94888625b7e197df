"""A chat that outgrows the model's positions drops its oldest turns, whole, and says so; a reply
length that leaves no room for any conversation is refused before the first message.

The target is a tiny Llama with only 64 positions, so a few turns overflow it.
"""

from __future__ import annotations

import io

import pytest
import torch
from typer.testing import CliRunner

from dynatree import DynaTreeError, EngineOptions
from dynatree.integrations import chat
from dynatree.integrations.chat import ChatSession, chat_prompt
from dynatree.cli import app
from cli_helpers import error_lines, reference_reply, save_pair
from tiny import perturbed, tiny_model
from tiny_tok import VOCAB, tiny_tokenizer

POSITIONS = 64
MESSAGES = ["the quick brown fox jumps over the lazy dog", "speculative decoding verifies a tree",
            "the lazy dog sleeps", "the fox jumps over the dog again", "a tree of the quick brown fox"]


@pytest.fixture(scope="module")
def small() -> tuple[torch.nn.Module, torch.nn.Module, object]:
    target = tiny_model("llama", 0, vocab=VOCAB, max_positions=POSITIONS)
    return target, perturbed(target), tiny_tokenizer()


@pytest.fixture(scope="module")
def small_dirs(small, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    target, draft = save_pair(tmp_path_factory.mktemp("small"), *small)
    return str(target), str(draft)


def test_oldest_turns_are_dropped_whole_and_the_system_prompt_stays(small) -> None:
    target, draft, tok = small
    session = ChatSession(target, draft, tok, "linear", text=False, system="be brief", out=io.StringIO(), max_new_tokens=8, k=3)
    assert session.max_positions == POSITIONS and session.room == POSITIONS - 8 - 3
    dropped = []
    for text in MESSAGES:
        session.turn(text)
        dropped.append(session.dropped)
        roles = [m["role"] for m in session.messages]
        assert roles[0] == "system" and session.messages[0]["content"] == "be brief"
        assert roles[1:] == ["user", "assistant"] * (len(roles) // 2)  # whole turns only
        assert session.messages[-2] == {"role": "user", "content": text}  # the newest message is kept
        asked = chat_prompt(tok, session.messages[:-1])
        assert len(asked) <= session.room  # nothing left for the engine to cut mid-message
        # the reply is the target's own greedy reply to exactly that (shortened) conversation
        assert session.messages[-1]["content"] == reference_reply(target, asked, tok, 8).strip()
    assert dropped[0] == 0 and sum(dropped) >= 2


def test_an_interrupted_turn_restores_the_dropped_turns(small, monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft, tok = small
    session = ChatSession(target, draft, tok, "linear", text=False, out=io.StringIO(), max_new_tokens=8, k=3)
    for text in MESSAGES[:3]:
        session.turn(text)
    before = [dict(m) for m in session.messages]

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    long = MESSAGES[3] * 2
    assert len(chat_prompt(tok, [*before, {"role": "user", "content": long}])) > session.room  # turns are dropped
    monkeypatch.setattr(chat, "generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.turn(long)
    assert session.messages == before


def test_a_reply_length_with_no_room_left_is_refused_up_front(small) -> None:
    target, draft, tok = small
    with pytest.raises(DynaTreeError) as info:
        ChatSession(target, draft, tok, "linear", text=False, max_new_tokens=61, k=3)
    assert str(info.value) == ("max_new_tokens=61 and a tree of depth 3 leave no room for the conversation in the "
                               "model's 64 positions: use max_new_tokens (--max-new-tokens) of at most 60")
    with pytest.raises(DynaTreeError, match="of at most 63$"):
        ChatSession(target, None, tok, "autoregressive", max_new_tokens=10**9)
    unlimited = ChatSession(target, draft, tok, "linear", text=False, max_new_tokens=60, k=3,
                            options=EngineOptions(kv_window=16))
    assert unlimited.room is None  # KV eviction: any length fits


def test_cli_chat_past_the_context(small_dirs) -> None:
    messages = "".join(f"{m}\n" for m in MESSAGES) + "/exit\n"
    res = CliRunner().invoke(app, ["chat", "--target", small_dirs[0], "--draft", small_dirs[1],
                                   "--max-new-tokens", "8", "--system", "be brief"], input=messages)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert res.stdout.count("tokens/round") == len(MESSAGES)
    assert "oldest turn(s) dropped: the conversation no longer fits the model's 64 positions)" in res.stdout


def test_cli_chat_with_too_long_replies_is_one_line(small_dirs) -> None:
    res = CliRunner().invoke(app, ["chat", "--target", small_dirs[0], "--draft", small_dirs[1],
                                   "--max-new-tokens", "1000000000"], input="hi\n")
    assert res.exit_code == 2
    assert error_lines(res.stderr) == [
        # depth 32: the text's proposals (--text, the default) reach deeper than the policy's 9
        "error: max_new_tokens=1000000000 and a tree of depth 32 leave no room for the conversation in the model's "
        "64 positions: use max_new_tokens (--max-new-tokens) of at most 31"]
    assert "you>" not in res.stdout  # refused before the conversation started
