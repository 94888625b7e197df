"""Ctrl-C in ``dynatree generate`` and ``dynatree chat``: the text so far stays on screen (and is
ended by a newline), the exit code is 130, the last line says "interrupted", no traceback, and no
half-written file (``--trace`` is written only for a finished run).

The real CLI runs in a subprocess on a "parrot" model: a tiny Llama whose layers add nothing and
whose head always picks " the", so a reply never ends by itself (no EOS, a 32k-position budget)
and SIGINT always lands mid-generation, however slow the machine.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from cli_helpers import save_pair, subprocess_env
from tiny import tiny_model
from tiny_tok import VOCAB, tiny_tokenizer

WORD = " the"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")


def parrot() -> torch.nn.Module:
    """A tiny Llama that predicts ``WORD`` after every token: the residual stream is the token's
    embedding (attention and MLP outputs zeroed), every embedding shares a large first component,
    and only ``WORD``'s head row reads it."""
    [word] = tiny_tokenizer()(WORD).input_ids
    model = tiny_model("llama", 0, vocab=VOCAB, max_positions=1 << 15)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding, head = model.model.embed_tokens.weight, model.lm_head.weight
        embedding.normal_(0, 0.02)
        embedding[:, 0] = 10.0
        head.normal_(0, 0.02)
        head[:, 0] = 0.0
        head[word, 0] = 10.0
    return model


def default_sigint() -> None:
    """In the child, before exec: SIGINT back to its default. A suite started in the background by a
    non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: Ctrl-C would never reach the CLI and the test would wait for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def parrots(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return save_pair(tmp_path_factory.mktemp("parrots"), parrot())


class Running:
    """A CLI subprocess whose stdout is collected as it arrives (a thread drains the pipe)."""

    def __init__(self, argv: list[str], stdin: bytes | None = None) -> None:
        env = subprocess_env(PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "dynatree", *argv, "--threads", "1"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     preexec_fn=default_sigint)
        self.out = bytearray()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        if stdin is not None:
            self.proc.stdin.write(stdin)
            self.proc.stdin.flush()

    def _drain(self) -> None:
        while chunk := self.proc.stdout.read1(4096):
            self.out.extend(chunk)

    def wait_for(self, pattern: str) -> str:
        """The stdout so far once it matches ``pattern``; the deadline only stops a hung run."""
        deadline = time.monotonic() + 600
        while not re.search(pattern, seen := self.out.decode("utf-8", "replace")):
            assert self.proc.poll() is None, f"ended before the signal:\n{seen}\n{self.proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, f"{pattern!r} never appeared:\n{seen}"
            time.sleep(0.05)
        return seen

    def interrupt(self) -> tuple[int, str, str]:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=600)  # (a child that ignored the signal fails here, it does not hang)
        err = self.proc.stderr.read().decode()
        self.reader.join(timeout=60)
        return code, self.out.decode("utf-8", "replace"), err


def assert_interrupted(code: int, err: str) -> None:
    assert code == 130, err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()][-1] == "interrupted"


@pytest.mark.slow
def test_ctrl_c_in_generate_keeps_the_text_and_writes_no_trace(parrots, tmp_path: Path) -> None:
    target, draft = parrots
    trace = tmp_path / "trace.html"
    run = Running(["generate", "--target", str(target), "--draft", str(draft), "--prompt", "the fox",
                   "--max-new-tokens", "30000", "--trace", str(trace)])
    before = run.wait_for(f"the fox(?:{WORD}){{5}}")
    code, out, err = run.interrupt()
    assert_interrupted(code, err)
    assert out.startswith(before)  # what was on screen stays there
    assert re.fullmatch(f"the fox(?:{WORD})+\n", out), out  # whole words, then the line is ended
    assert not trace.exists()  # no half a trace page


@pytest.mark.slow
def test_ctrl_c_in_a_chat_reply_keeps_the_text(parrots) -> None:
    target, draft = parrots
    run = Running(["chat", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "30000"],
                  stdin=b"the quick fox\n")
    before = run.wait_for(f"bot> (?:{WORD}){{5}}")
    code, out, err = run.interrupt()
    assert_interrupted(code, err)
    assert out.startswith(before)
    assert re.fullmatch(f"dynatree chat .*\nyou> bot> (?:{WORD})+\n", out), out


@pytest.mark.slow
def test_ctrl_c_at_the_chat_prompt_ends_the_line(parrots) -> None:
    target, draft = parrots
    run = Running(["chat", "--target", str(target), "--draft", str(draft)])
    run.wait_for("you> $")
    code, out, err = run.interrupt()
    assert_interrupted(code, err)
    assert out.endswith("you> \n")  # "interrupted" then starts a line of its own


def test_an_error_raised_while_ctrl_c_unwinds_is_still_an_interrupt() -> None:
    """A Ctrl-C that lands inside a torch function mode's enter/exit leaves its stack one short,
    and the next exit raises RuntimeError("trying to pop from empty mode stack") with the
    KeyboardInterrupt as its context (seen once in the bench's Ctrl-C test): exit code 130 and
    "interrupted", as for the interrupt itself. A RuntimeError of its own stays an error."""
    import typer

    from dynatree.cli.common import after_interrupt, friendly_errors

    def unwinding() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("trying to pop from empty mode stack")

    def broken() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(typer.Exit) as exit_info:
        friendly_errors(unwinding)()
    assert exit_info.value.exit_code == 130
    with pytest.raises(RuntimeError, match="a bug"):
        friendly_errors(broken)()
    try:
        unwinding()
    except RuntimeError as err:
        assert after_interrupt(err)
