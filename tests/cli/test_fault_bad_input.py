"""Text that is not UTF-8 -- on the command line, typed into ``dynatree chat``, in a bench prompt
file -- is refused in one line naming where the first bad byte is, never a traceback from inside
the tokenizer; a chat goes on after such a line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dynatree import DynaTreeError
from dynatree.bench.datasets import load_prompts
from dynatree.cli import app
from dynatree.cli.common import check_utf8
from cli_helpers import error_lines, subprocess_env
from tiny_tok import tiny_tokenizer

ENV = subprocess_env()


# ------------------------------------------------------------------------------------ not UTF-8


@pytest.mark.parametrize("raw, message", [
    (b"the \xff\xfe fox", "byte 0xff at byte offset 4"),
    ("d\u00e9j\u00e0 ".encode() + b"\xc3", "byte 0xc3 at byte offset 7"),  # a character cut in half at the end
    (b"\xe2\x82 euro", "byte 0xe2 at byte offset 0"),
], ids=["invalid bytes", "cut at the end", "cut at the start"])
def test_check_utf8_names_the_first_bad_byte(raw: bytes, message: str) -> None:
    text = raw.decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv or stdin
    with pytest.raises(DynaTreeError) as info:
        check_utf8(text, "--prompt")
    assert str(info.value) == f"--prompt is not valid UTF-8: {message}"
    check_utf8(raw.decode("utf-8", "replace"), "--prompt")  # valid text passes


def test_generate_with_a_prompt_that_is_not_utf8(model_dirs) -> None:
    """The real command line: the bytes go through argv as a shell would pass ``$(cat file)``."""
    cmd = [os.fsencode(sys.executable), b"-m", b"dynatree", b"generate", b"--target", model_dirs[0].encode(),
           b"--draft", model_dirs[1].encode(), b"--prompt", b"the \xff fox", b"--max-new-tokens", b"4"]
    done = subprocess.run(cmd, capture_output=True, env=ENV, timeout=600)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Traceback" not in err
    assert error_lines(err) == ["error: --prompt is not valid UTF-8: byte 0xff at byte offset 4"]
    assert done.stdout == b""


@pytest.mark.slow
def test_chat_skips_a_line_that_is_not_utf8_and_goes_on(model_dirs) -> None:
    """With a strict stdin decoder (a UTF-8 locale other than C.UTF-8 gives one) Python would raise
    UnicodeDecodeError from input(); the chat reports the line instead and carries on."""
    cmd = [sys.executable, "-m", "dynatree", "chat", "--target", model_dirs[0], "--draft", model_dirs[1],
           "--max-new-tokens", "4", "--threads", "1"]
    done = subprocess.run(cmd, input=b"the \xff fox\nthe dog\n/exit\n", capture_output=True, timeout=600,
                          env={**ENV, "PYTHONIOENCODING": "utf-8:strict"})
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "Traceback" not in err
    assert error_lines(err) == ["error: the message is not valid UTF-8: byte 0xff at byte offset 4; not sent"]
    assert done.stdout.decode("utf-8", "replace").count("tokens/round") == 1  # the next line was answered


@pytest.mark.parametrize("content, suffix, message", [
    (b"the fox\n\nthe \xff dog\n", ".txt", "is not UTF-8 text: byte 0xff at byte offset 13 (invalid start byte); "
                                           "save it as UTF-8"),
    ("the fox\n\nthe dog\n".encode("utf-16"), ".txt", "is not UTF-8 text: byte 0xff at byte offset 0 (invalid "
                                                      "start byte); save it as UTF-8"),
    (b"\xef\xbb\xbfthe fox\n\nthe \xe2\x82\n", ".txt", "is not UTF-8 text: byte 0xe2 at byte offset 16"),
    (b"the fox\n\nthe \x00 dog\n", ".txt", "has a NUL byte at byte offset 13 (a UTF-16 or binary file?); save it "
                                           "as UTF-8 text"),
    (b'{"text": "the \x00 fox"}\n', ".jsonl", "has a NUL byte at byte offset 14"),
], ids=["invalid byte", "UTF-16", "byte-order mark, then a cut character", "NUL in .txt", "raw NUL in .jsonl"])
def test_a_prompt_file_that_is_not_utf8_text(tmp_path: Path, content: bytes, suffix: str, message: str) -> None:
    path = tmp_path / f"prompts{suffix}"
    path.write_bytes(content)
    with pytest.raises(DynaTreeError) as info:
        load_prompts(str(path), tiny_tokenizer(), 2, 64)
    assert f"prompt file {path} {message}" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_byte_order_mark_and_escaped_nul_are_kept_lossless(tmp_path: Path) -> None:
    """What the refusals above leave alone: a UTF-8 byte-order mark (Windows editors write one) is
    not part of the text, and a NUL written as the JSON escape \\u0000 is deliberate."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "the fox"}\n{"text": "the \\u0000 dog"}\n')
    assert load_prompts(str(path), tiny_tokenizer(), 2, 64) == ["the fox", "the \x00 dog"]


def test_bench_with_a_prompt_file_that_is_not_utf8(model_dirs, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"the fox\n\nthe \xff dog\n")
    res = CliRunner().invoke(app, ["bench", "--target", model_dirs[0], "--draft", model_dirs[1], "--dataset",
                                   str(prompts), "--num-prompts", "2", "--strategies", "autoregressive",
                                   "--output", str(tmp_path / "r.jsonl"), "--no-progress"])
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    assert error_lines(res.stderr) == [f"error: prompt file {prompts} is not UTF-8 text: byte 0xff at byte offset "
                                       "13 (invalid start byte); save it as UTF-8"]
