"""A self-contained HTML picture of a run: every round's drafted tree and a cost/L timeline.

``dynatree.generate(..., trace="trace.html")`` or ``dynatree generate --trace trace.html``.

Per round the page draws the tree the policy drafted (root on the left, one column per depth):
each node shows its token as text and its draft probability q(token | parent), its shade grows
with q, the accepted path is green and the target's bonus token orange. So one look shows where
the draft was confident (deep, narrow chains) and where it hedged (several siblings), and where
the target disagreed. Above, a timeline gives every round's draft / verify / commit time as a
stacked bar and L (tokens committed) as a line; bars link to their round. The page is one HTML
file: inline CSS and SVG, no scripts, nothing fetched.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynatree.core.stats import GenerationResult, RoundEvent, RoundStats

if TYPE_CHECKING:
    from dynatree.policies import DraftPolicy

COL, ROW, NODE_W, NODE_H = 104, 36, 88, 30  # tree layout (px)


@dataclass
class TracedRound:
    """What the page needs of one round, as plain Python (tensors converted once)."""

    tokens: list[int]  # tree node tokens, node 0 = root (the last committed token)
    parent: list[int]
    depth: list[int]
    q: list[float]  # draft probability of each node given its parent (1 for the root)
    path: list[int]  # accepted drafted nodes, root excluded
    bonus: int
    committed: list[int]  # tokens this round added to the output (after EOS/budget/stop cuts)
    stats: RoundStats


class TraceRecorder:
    """``on_round`` hook that keeps every round (and forwards it to ``then``), then writes the page."""

    def __init__(self, tokenizer: Any = None, then: Callable[[RoundEvent], None] | None = None) -> None:
        self.tokenizer, self.then = tokenizer, then
        self.rounds: list[TracedRound] = []

    def __call__(self, event: RoundEvent) -> None:
        tree = event.tree
        self.rounds.append(TracedRound(
            tokens=tree.tokens.tolist(), parent=tree.parent.tolist(), depth=tree.depth.tolist(),
            q=tree.logq.exp().tolist(), path=list(event.path), bonus=int(event.bonus),
            committed=list(event.tokens), stats=event.stats,
        ))
        if self.then is not None:
            self.then(event)

    def write(self, path: str | PathLike, result: GenerationResult, policy: DraftPolicy | None = None) -> Path:
        """Render the page for ``result`` to ``path`` (UTF-8) and return the path."""
        out = Path(path)
        out.write_text(render(self.rounds, result, self.tokenizer, policy), encoding="utf-8")
        return out


# ---------------------------------------------------------------------------------- rendering
def token_text(tokenizer: Any, token: int) -> str:
    """A token as readable text: decoded, with spaces/newlines/tabs made visible."""
    if tokenizer is None:
        return f"#{token}"
    text = tokenizer.decode([token])
    if "\ufffd" in text and hasattr(tokenizer, "convert_ids_to_tokens"):
        text = str(tokenizer.convert_ids_to_tokens(token))  # a piece of a multi-byte character: its raw token
    text = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    return text if text else f"#{token}"


def render(rounds: list[TracedRound], result: GenerationResult, tokenizer: Any = None, policy: DraftPolicy | None = None) -> str:
    """The whole page as one HTML string."""
    stats = result.stats
    name = policy.name if policy is not None else stats.strategy
    config = policy.config if policy is not None else None
    settings = ""
    if config is not None and dataclasses.is_dataclass(config):
        settings = " ".join(f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config))
    s = stats.summary()
    facts = [
        ("strategy", name), ("new tokens", s["new_tokens"]), ("rounds", s["rounds"]),
        ("mean L", f"{s['mean_committed']:.2f}"), ("acceptance", f"{s['acceptance']:.1%}"),
        ("mean drafted", f"{s['mean_drafted']:.1f}"), ("tok/s", f"{s['tokens_per_second']:.1f}"),
        ("total", f"{s['t_total'] * 1e3:.0f} ms"), ("prefill", f"{s['t_prefill'] * 1e3:.0f} ms"),
        ("draft / verify / commit", f"{s['t_draft'] * 1e3:.0f} / {s['t_verify'] * 1e3:.0f} / "
                                    f"{s['t_commit'] * 1e3:.0f} ms"),
    ]
    head = "".join(f"<div class='fact'><b>{html.escape(str(v))}</b><span>{k}</span></div>" for k, v in facts)
    prompt_ids = result.sequences[0, : stats.prompt_tokens].tolist()
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>dynatree trace: {html.escape(name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>dynatree trace <small>{html.escape(name)}</small></h1>",
        f"<div class='facts'>{head}</div>",
        f"<p class='settings'>{html.escape(settings)}</p>" if settings else "",
        _LEGEND,
        "<h2>Timeline <small>bars: draft / verify / commit time per round; line: L, tokens committed</small></h2>",
        _timeline(rounds),
        "<h2>Text <small>one shade per round; hover for the round</small></h2>",
        _text(prompt_ids, rounds, tokenizer),
        "<h2>Rounds</h2>",
        *(_round(i, r, tokenizer) for i, r in enumerate(rounds)),
        "</body></html>",
    ]
    return "\n".join(parts)


def _timeline(rounds: list[TracedRound]) -> str:
    if not rounds:
        return "<p>no rounds</p>"
    height, pad, top = 150, 64, 14
    bar = max(6, min(26, 900 // len(rounds)))
    width = pad * 2 + bar * len(rounds)
    t_max = max(r.stats.t_draft + r.stats.t_verify + r.stats.t_commit for r in rounds) or 1.0
    l_max = max(max(r.stats.committed for r in rounds), 1)
    y0 = top + height
    out = [f"<svg class='timeline' width='{width}' height='{y0 + 34}' xmlns='http://www.w3.org/2000/svg'>",
           f"<text x='4' y='{top + 4}' class='axis'>{t_max * 1e3:.1f} ms</text>",
           f"<text x='{width - pad + 4}' y='{top + 4}' class='axis lax'>L={l_max}</text>",
           f"<line x1='{pad}' y1='{y0}' x2='{width - pad}' y2='{y0}' class='base'/>"]
    points = []
    for i, r in enumerate(rounds):
        x = pad + i * bar
        st = r.stats
        y = y0
        rects = []
        for part, cls in ((st.t_draft, "draft"), (st.t_verify, "verify"), (st.t_commit, "commit")):
            h = height * part / t_max
            y -= h
            rects.append(f"<rect x='{x + 1}' y='{y:.1f}' width='{bar - 2}' height='{h:.1f}' class='{cls}'/>")
        tip = (f"round {i + 1}: L={st.committed}, accepted {st.accepted} of {st.drafted} drafted, depth {st.depth}, "
               f"draft {st.t_draft * 1e3:.1f} ms, verify {st.t_verify * 1e3:.1f} ms, commit {st.t_commit * 1e3:.1f} ms")
        out.append(f"<a href='#round-{i + 1}'><g><title>{html.escape(tip)}</title>"
                   f"<rect x='{x}' y='{top}' width='{bar}' height='{height}' class='hit'/>{''.join(rects)}</g></a>")
        points.append((x + bar / 2, y0 - height * st.committed / l_max))
        if len(rounds) <= 60 or i % 10 == 0:
            out.append(f"<text x='{x + bar / 2}' y='{y0 + 14}' class='tick'>{i + 1}</text>")
    out.append("<polyline class='lline' points='" + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + "'/>")
    out += [f"<circle cx='{px:.1f}' cy='{py:.1f}' r='2.5' class='ldot'/>" for px, py in points]
    out.append(f"<text x='{pad}' y='{y0 + 30}' class='axis'>round</text></svg>")
    return "<div class='scroll'>" + "".join(out) + "</div>"


def _text(prompt: list[int], rounds: list[TracedRound], tokenizer: Any) -> str:
    if tokenizer is None:
        pieces = [" ".join(map(str, r.committed)) + " " for r in rounds]
        lead = " ".join(map(str, prompt)) + " "
    else:
        lead = tokenizer.decode(prompt, skip_special_tokens=True)
        # decode cumulatively so that word pieces join as they do in the full text
        pieces, done, ids = [], lead, list(prompt)
        for r in rounds:
            ids += r.committed
            text = tokenizer.decode(ids, skip_special_tokens=True)
            pieces.append(text[len(done):] if text.startswith(done) else tokenizer.decode(r.committed))
            done = text
    spans = "".join(f"<a href='#round-{i + 1}' class='chunk c{i % 2}' title='round {i + 1}: L={len(r.committed)}'>"
                    f"{html.escape(p)}</a>" for i, (r, p) in enumerate(zip(rounds, pieces)))
    return f"<div class='text'><span class='prompt'>{html.escape(lead)}</span>{spans}</div>"


def _round(i: int, r: TracedRound, tokenizer: Any) -> str:
    st = r.stats
    state = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in st.policy_state.items())
    breadth = [0] * len(r.tokens)
    for p in r.parent[1:]:
        breadth[p] += 1
    widths = [sum(1 for d in r.depth if d == k) for k in range(1, max(r.depth) + 1)]
    head = (f"<b>round {i + 1}</b> L={st.committed} (accepted {st.accepted} + bonus) | drafted {st.drafted} nodes, "
            f"depth {st.depth}, nodes per level {widths or [0]} | draft {st.t_draft * 1e3:.1f} ms, "
            f"verify {st.t_verify * 1e3:.1f} ms, commit {st.t_commit * 1e3:.1f} ms"
            + (f" | policy {html.escape(state)}" if state else ""))
    return (f"<section id='round-{i + 1}' class='round'><div class='rhead'>{head}</div>"
            f"<div class='scroll'>{_tree_svg(r, tokenizer, breadth)}</div></section>")


def _tree_svg(r: TracedRound, tokenizer: Any, breadth: list[int]) -> str:
    n = len(r.tokens)
    # the bonus token as an extra node under the last accepted node
    anchor = r.path[-1] if r.path else 0
    parent = r.parent + [anchor]
    depth = r.depth + [r.depth[anchor] + 1]
    kids: list[list[int]] = [[] for _ in range(n + 1)]
    for c in range(1, n + 1):
        kids[parent[c]].append(c)
    # leaves take consecutive rows in depth-first order; a parent sits midway between its children
    # (children always have larger indices than their parent, so reverse index order is bottom-up)
    y: dict[int, float] = {}
    row, stack = 0, [0]
    while stack:
        node = stack.pop()
        if not kids[node]:
            y[node] = row
            row += 1
        stack.extend(reversed(kids[node]))
    for node in range(n, -1, -1):
        if kids[node]:
            y[node] = (y[kids[node][0]] + y[kids[node][-1]]) / 2
    accepted = {0, *r.path}
    left, top = 8, 22
    width = left + (max(depth) + 1) * COL
    height = top + row * ROW + 4
    out = [f"<svg class='tree' width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"]
    for d in range(max(depth) + 1):
        out.append(f"<text x='{left + d * COL + NODE_W / 2}' y='14' class='dlabel'>{'root' if d == 0 else f'd{d}'}</text>")
    pos = {v: (left + depth[v] * COL, top + y[v] * ROW) for v in range(n + 1)}
    for c in range(1, n + 1):
        (px, py), (cx, cy) = pos[parent[c]], pos[c]
        x1, y1, x2, y2 = px + NODE_W, py + NODE_H / 2, cx, cy + NODE_H / 2
        cls = "edge acc" if (c in accepted or c == n) else "edge"
        out.append(f"<path d='M{x1},{y1} C{x1 + 8},{y1} {x2 - 8},{y2} {x2},{y2}' class='{cls}'/>")
    for v in range(n + 1):
        x, yy = pos[v]
        token = r.bonus if v == n else r.tokens[v]
        text = token_text(tokenizer, token)
        short = text if len(text) <= 11 else text[:10] + "\u2026"
        if v == n:
            cls, sub, fill = "node bonus", "bonus", ""
            tip = f"bonus token {token} ({text}) from the target"
        elif v == 0:
            cls, sub, fill = "node root", "root", ""
            tip = f"root: last committed token {token} ({text}); {breadth[0]} children"
        else:
            q = r.q[v]
            cls = "node acc" if v in accepted else "node"
            sub = f"q={q:.2f}"
            fill = "" if v in accepted else f" style='fill: rgba(30,110,200,{0.12 + 0.6 * q:.2f})'"
            cum = math.prod(r.q[u] for u in _ancestors(r.parent, v))
            tip = (f"node {v}: token {token} ({text}), depth {depth[v]}, q={q:.3f}, path q={cum:.3f}, "
                   f"{breadth[v]} children" + (", accepted" if v in accepted else ""))
        out.append(f"<g><title>{html.escape(tip)}</title><rect x='{x}' y='{yy}' width='{NODE_W}' height='{NODE_H}' "
                   f"rx='5' class='{cls}'{fill}/><text x='{x + NODE_W / 2}' y='{yy + 13}' class='tok'>"
                   f"{html.escape(short)}</text><text x='{x + NODE_W / 2}' y='{yy + 25}' class='q'>{sub}</text></g>")
    out.append("</svg>")
    return "".join(out)


def _ancestors(parent: list[int], node: int) -> list[int]:
    """Drafted nodes from the first level down to ``node`` (the root excluded)."""
    chain = []
    while node > 0:
        chain.append(node)
        node = parent[node]
    return chain


_LEGEND = (
    "<div class='legend'><span class='sw root'></span>root (last committed token)"
    "<span class='sw draft'></span>drafted node, darker = higher draft probability q"
    "<span class='sw acc'></span>accepted by the target<span class='sw bonus'></span>bonus token (target)"
    "<span class='sw tdraft'></span>draft time<span class='sw tverify'></span>verify time"
    "<span class='sw tcommit'></span>commit time<span class='sw tl'></span>L</div>"
)

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:20px 28px;color:#1d2733;background:#fafbfc}
h1{font-size:22px;margin:0 0 10px} h2{font-size:16px;margin:22px 0 8px} small{color:#6b7785;font-weight:normal}
.facts{display:flex;flex-wrap:wrap;gap:8px}.fact{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:5px 10px}
.fact b{display:block;font-size:16px}.fact span{color:#6b7785;font-size:12px}
.settings{color:#4b5866;font:12px ui-monospace,monospace;margin:8px 0}
.legend{font-size:12px;color:#4b5866;margin:6px 0}.sw{display:inline-block;width:12px;height:12px;border-radius:3px;margin:0 4px 0 12px;vertical-align:-2px}
.sw.root{background:#4a5866}.sw.draft{background:rgba(30,110,200,.45)}.sw.acc{background:#2e8b3e}.sw.bonus{background:#ee7d1a}
.sw.tdraft{background:#5b8fd6}.sw.tverify{background:#f0a24a}.sw.tcommit{background:#a3acb6}.sw.tl{background:#2e8b3e;height:3px;vertical-align:3px}
.scroll{overflow-x:auto;background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:6px}
.timeline .draft{fill:#5b8fd6}.timeline .verify{fill:#f0a24a}.timeline .commit{fill:#a3acb6}.timeline .hit{fill:transparent}
.timeline a:hover .hit{fill:#eef3f8}.timeline .base{stroke:#9aa5b1}.lline{fill:none;stroke:#2e8b3e;stroke-width:2}.ldot{fill:#2e8b3e}
.axis,.tick{font-size:10px;fill:#6b7785}.tick{text-anchor:middle}.lax{fill:#2e8b3e}
.text{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:10px;white-space:pre-wrap;font:13px ui-monospace,monospace}
.text .prompt{color:#8a95a1}.chunk{color:inherit;text-decoration:none;border-radius:3px}.chunk.c0{background:#e3effc}.chunk.c1{background:#fdf0dc}
.round{margin:12px 0}.rhead{font-size:13px;margin-bottom:4px}.round:target .scroll{border-color:#2e8b3e;box-shadow:0 0 0 2px #cde8d2}
.tree .node{fill:rgba(30,110,200,.3);stroke:#6e8fb4;stroke-width:1}.tree .node.acc{fill:#2e8b3e;stroke:#1f6a2c}
.tree .node.root{fill:#4a5866;stroke:#333}.tree .node.bonus{fill:#ee7d1a;stroke:#b55a0c;stroke-dasharray:4 2}
.tree .tok{font:12px ui-monospace,monospace;text-anchor:middle;fill:#10202f}.tree .q{font-size:10px;text-anchor:middle;fill:#33414f}
.tree .acc~.tok,.tree .acc~.q,.tree .root~.tok,.tree .root~.q,.tree .bonus~.tok,.tree .bonus~.q{fill:#fff}
.tree .edge{fill:none;stroke:#9db3c9;stroke-width:1.2}.tree .edge.acc{stroke:#2e8b3e;stroke-width:2.6}
.dlabel{font-size:11px;fill:#6b7785;text-anchor:middle}
"""
