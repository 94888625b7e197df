"""Streaming output, ``--chat`` and ``dynatree chat``: unit tests, the CLI through typer's runner,
and the chat loop in a real terminal (tmux; skipped where tmux is absent)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import dynatree
from dynatree.integrations.chat import ChatSession, EchoStreamer, chat_prompt
from dynatree.cli import app
from tools import needs_tool
from cli_helpers import SRC, reference_reply


def loaded(model_dirs: tuple[str, str]):
    from dynatree.loading import models

    target, tok = models.load_model(model_dirs[0])
    draft, _ = models.load_model(model_dirs[1])
    return target, draft, tok


def test_text_is_written_round_by_round(model_dirs) -> None:
    """The streamer writes while the run is still going: writes interleave with later rounds."""
    target, draft, tok = loaded(model_dirs)
    log: list[tuple[str, str]] = []

    class Log(io.StringIO):
        def write(self, text: str) -> int:
            log.append(("write", text))
            return len(text)

    streamer = EchoStreamer(tok, Log())

    def on_round(event) -> None:
        log.append(("round", ""))
        streamer.on_round(event)

    ids = tok("the quick brown fox jumps", return_tensors="pt").input_ids
    out = dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=24,
                            stopping=dynatree.StoppingConfig(eos_token_id=()), on_round=on_round, text=False)
    streamer.end()
    kinds = [k for k, _ in log]
    assert kinds.count("round") == out.stats.num_rounds >= 3
    last_round = len(kinds) - 1 - kinds[::-1].index("round")
    assert "write" in kinds[:last_round]  # some text came out before the last round ran
    assert "".join(t for k, t in log if k == "write") == tok.decode(out.sequences[0, ids.shape[1]:],
                                                                     skip_special_tokens=True) + "\n"


def test_cli_generate_streams_the_same_text(model_dirs) -> None:
    target, _, tok = loaded(model_dirs)
    prompt = "the lazy dog"
    res = CliRunner().invoke(app, ["generate", "--target", model_dirs[0], "--draft", model_dirs[1], "--prompt", prompt,
                                   "--max-new-tokens", "20", "-o", "max_nodes=8"])
    assert res.exit_code == 0, res.output
    ids = tok(prompt).input_ids
    ref = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert res.stdout == prompt + tok.decode(ref[0, len(ids):], skip_special_tokens=True) + "\n"
    assert "tokens/round" in res.stderr


def test_cli_generate_chat_uses_the_template_and_prints_only_the_reply(model_dirs, tmp_path: Path) -> None:
    target, _, tok = loaded(model_dirs)
    trace = tmp_path / "t.html"
    res = CliRunner().invoke(app, ["generate", "--target", model_dirs[0], "--draft", model_dirs[1], "--chat",
                                   "--prompt", "the fox", "--max-new-tokens", "16", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    ids = chat_prompt(tok, [{"role": "user", "content": "the fox"}])
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert res.stdout == reference_reply(target, ids, tok, 16) + "\n"
    assert trace.read_text(encoding="utf-8").count("<section") >= 1


def test_chat_without_a_template_is_refused(model_dirs) -> None:
    _, _, tok = loaded(model_dirs)
    plain = tok.__class__.from_pretrained(model_dirs[0])
    plain.chat_template = None
    with pytest.raises(dynatree.DynaTreeError, match="no chat template"):
        chat_prompt(plain, [{"role": "user", "content": "hi"}])


def test_chat_session_keeps_the_conversation(model_dirs) -> None:
    target, draft, tok = loaded(model_dirs)
    out = io.StringIO()
    session = ChatSession(target, draft, tok, "linear", text=False, system="be brief", out=out, max_new_tokens=10, k=3)
    session.turn("the fox")
    first = session.messages[-1]["content"]
    session.turn("the dog")
    roles = [m["role"] for m in session.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    # the second turn saw the first reply: its prompt is the template over the whole history
    ids = chat_prompt(tok, session.messages[:4])
    assert session.messages[4]["content"] == reference_reply(target, ids, tok, 10).strip()
    assert first in out.getvalue()  # the reply was streamed to the session's output
    session.reset()
    assert [m["role"] for m in session.messages] == ["system"]


def test_chat_command_through_the_runner(model_dirs) -> None:
    target, _, tok = loaded(model_dirs)
    res = CliRunner().invoke(app, ["chat", "--target", model_dirs[0], "--draft", model_dirs[1], "--max-new-tokens", "8"],
                             input="the fox\n/reset\nthe dog\n/exit\n")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("tokens/round") == 2 and "(conversation cleared)" in res.stdout
    # after /reset the second turn is a fresh conversation
    reply = reference_reply(target, chat_prompt(tok, [{"role": "user", "content": "the dog"}]), tok, 8)
    assert f"bot> {reply}\n" in res.stdout


@needs_tool("tmux", "the real-terminal check")
def test_chat_in_a_real_terminal(model_dirs) -> None:
    """tmux runs ``dynatree chat`` on a pseudo-terminal; we type a message and read the screen."""
    sock = f"dynatree-test-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    cmd = (f"PYTHONPATH={SRC} {sys.executable} -m dynatree chat --target {model_dirs[0]} --draft {model_dirs[1]} "
           "--max-new-tokens 8; echo CHAT-EXITED $?; sleep 30")

    def screen() -> str:
        return subprocess.run(tmux + ["capture-pane", "-p", "-t", "chat"], capture_output=True, text=True).stdout

    def wait_for(text: str, count: int = 1) -> str:  # (capture-pane drops trailing spaces: "you>")
        deadline = time.monotonic() + 240  # generous: only a readiness wait, never asserted on
        while time.monotonic() < deadline:
            if screen().count(text) >= count:
                return screen()
            time.sleep(0.5)
        raise AssertionError(f"{text!r} never appeared:\n{screen()}")

    subprocess.run(tmux + ["new-session", "-d", "-s", "chat", "-x", "140", "-y", "40", cmd], check=True)
    try:
        wait_for("you>")
        subprocess.run(tmux + ["send-keys", "-t", "chat", "the quick fox", "Enter"], check=True)
        wait_for("tokens/round")
        wait_for("you>", 2)
        subprocess.run(tmux + ["send-keys", "-t", "chat", "/exit", "Enter"], check=True)
        final = wait_for("CHAT-EXITED")
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
    lines = final.splitlines()
    assert any(line.startswith("you> the quick fox") for line in lines)
    assert "bot>" in final, final  # (the random model's reply may hold control characters)
    status = [line for line in lines if "tokens/round" in line]
    assert len(status) == 1 and "tok/s" in status[0]
    assert "CHAT-EXITED 0" in final
