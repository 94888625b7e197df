"""The HTML trace: one section per round with the drafted tree, the accepted path and the bonus token.

The structure test always runs (stdlib HTML parser); the browser test renders the page in headless
Chromium and looks for the tree's colours in the screenshot, and skips where Chromium is absent.
"""

from __future__ import annotations

import functools
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

import dynatree
from dynatree.loop.trace import TraceRecorder, token_text
from dynatree.options import StoppingConfig
from tiny import perturbed, tiny_model
from tools import needs_tool
from tiny_tok import VOCAB, tiny_tokenizer

OPTIONS = {"tau": 0.0, "d0": 3, "d_max": 5, "max_nodes": 24, "window": 2}
NO_EOS = StoppingConfig(eos_token_id=())


@functools.lru_cache(maxsize=None)
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model("llama", 0, vocab=VOCAB)
    return target, perturbed(target)


class Page(HTMLParser):
    """Collects, per round section, the classes of its tree's node rectangles and its texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[dict] = []
        self.tags: set[str] = set()
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith("#"):
                self.external.append(a[key])
        if tag == "section" and "round" in (a.get("class") or ""):
            self.rounds.append({"id": a.get("id"), "nodes": [], "texts": []})
        elif tag == "rect" and self.rounds and (a.get("class") or "").startswith("node"):
            self.rounds[-1]["nodes"].append(a["class"])

    def handle_data(self, data: str) -> None:
        if self.rounds:
            self.rounds[-1]["texts"].append(data)


def traced_run(tmp_path: Path, tokenizer=None):
    target, draft = pair()
    ids = torch.randint(2, VOCAB - 2, (1, 6), generator=torch.Generator().manual_seed(2))
    path = tmp_path / "trace.html"
    recorder = TraceRecorder()  # a second recorder, chained through on_round, to compare against
    out = dynatree.generate(target, draft, ids, "dynatree", max_new_tokens=30, stopping=NO_EOS, trace=path,
                            tokenizer=tokenizer, on_round=recorder, **OPTIONS, text=False)
    return out, path, recorder.rounds


def test_trace_page_shows_every_round_tree_path_and_bonus(tmp_path: Path) -> None:
    tok = tiny_tokenizer()
    out, path, rounds = traced_run(tmp_path, tok)
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    assert not page.external and "script" not in page.tags  # self-contained
    assert len(page.rounds) == out.stats.num_rounds == len(rounds) >= 3
    assert sum(len(r.committed) for r in rounds) == out.stats.new_tokens
    for i, (sec, r, st) in enumerate(zip(page.rounds, rounds, out.stats.rounds)):
        assert sec["id"] == f"round-{i + 1}"
        assert sec["nodes"].count("node root") == 1 and sec["nodes"].count("node bonus") == 1
        assert sec["nodes"].count("node acc") == len(r.path)
        assert len(sec["nodes"]) == st.drafted + 2  # drafted nodes + root + bonus
        texts = " ".join(sec["texts"])
        assert token_text(tok, r.bonus)[:10] in texts
        assert f"L={st.committed}" in texts
    assert out.stats.mean_committed > 1.0  # so some rounds really have accepted paths to show
    assert any(r.path for r in rounds)


def test_trace_without_tokenizer_shows_token_ids(tmp_path: Path) -> None:
    out, path, rounds = traced_run(tmp_path)
    html = path.read_text(encoding="utf-8")
    assert f"#{rounds[0].bonus}" in html and html.count("<section") == out.stats.num_rounds


@needs_tool("chromium", "the trace page in a headless browser; apt-get install chromium")
def test_trace_renders_in_chromium(tmp_path: Path) -> None:
    from matplotlib.image import imread

    _, path, _ = traced_run(tmp_path, tiny_tokenizer())
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", f"--screenshot={shot}", "--window-size=1200,1400",
                    path.as_uri()], check=True, capture_output=True, timeout=120)
    rgb = (imread(shot)[..., :3] * 255).astype(np.int16)

    def pixels(color: tuple[int, int, int]) -> int:
        return int((np.abs(rgb - np.array(color)).sum(-1) < 12).sum())

    assert rgb.shape[:2] == (1400, 1200)
    assert pixels((0x2E, 0x8B, 0x3E)) > 500  # accepted path nodes (green)
    assert pixels((0xEE, 0x7D, 0x1A)) > 500  # bonus token nodes (orange)
    assert pixels((0x5B, 0x8F, 0xD6)) > 200  # draft-time bars of the timeline (blue)
