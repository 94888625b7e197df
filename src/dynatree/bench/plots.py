"""Matplotlib figures for the report. Each function takes plain numbers and writes one PNG.

Kept free of result-row parsing (that is ``report``'s job) so every figure can be drawn from any
source of numbers, and uses the non-interactive Agg backend so it works on a headless server.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 120


def _save(fig: "plt.Figure", path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _title(ax: "plt.Axes", title: str, fontsize: int) -> None:
    """Set a title wrapped to the figure's width (setup titles can be longer than a figure)."""
    width = max(20, int(ax.figure.get_figwidth() * 72 / (0.6 * fontsize)))
    lines = [w for line in title.split("\n") for w in textwrap.wrap(line, width) or [""]]
    ax.set_title("\n".join(lines), fontsize=fontsize)


def _color(label: str, i: int, colors: Mapping[str, str] | None) -> str:
    return (colors or {}).get(label, f"C{i % 10}")


def throughput_bars(
    labels: Sequence[str], means: Sequence[float], stds: Sequence[float], speedups: Sequence[float | None],
    title: str, path: Path, colors: Mapping[str, str] | None = None,
) -> Path:
    """Throughput per strategy (mean ± std over prompts), speedup written above each bar."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 + 1.1 * len(labels)), 4.2))
    xs = range(len(labels))
    ax.bar(xs, means, yerr=stds, capsize=4, color=[_color(lab, i, colors) for i, lab in enumerate(labels)],
           edgecolor="black", linewidth=0.5)
    top = max((m + s for m, s in zip(means, stds)), default=1.0)
    for x, m, s, sp in zip(xs, means, stds, speedups):
        if sp is not None:
            ax.text(x, m + s + 0.02 * top, f"{sp:.2f}×", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(xs), labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("throughput (generated tokens / s)")
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    _title(ax, title, 10)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def cost_profile_plot(profiles: Mapping[str, tuple[Sequence[int], Sequence[float]]], title: str, path: Path,
                      colors: Mapping[str, str] | None = None) -> Path:
    """Measured verify time (ms) against tree rows, one line per profile: the curve the tree
    budget is chosen from (flat = wide trees are cheap, steep = keep trees small)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, (label, (rows, ms)) in enumerate(profiles.items()):
        ax.plot(list(rows), list(ms), marker="o", label=label, color=_color(label, i, colors))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows in the verify forward (root + drafted nodes)")
    ax.set_ylabel("verify time (ms, median)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _title(ax, title, 10)
    return _save(fig, path)


def speedup_vs_length(
    series: Mapping[str, Sequence[tuple[int, float]]], title: str, path: Path, colors: Mapping[str, str] | None = None,
) -> Path:
    """Speedup over autoregressive against generation length, one line per strategy."""
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for i, (label, points) in enumerate(series.items()):
        pts = sorted(points)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, color=_color(label, i, colors))
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="autoregressive")
    ax.set_xlabel("generated tokens T")
    ax.set_ylabel("speedup vs autoregressive (×)")
    _title(ax, title, 10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def tokens_per_round_hist(
    data: Mapping[str, Sequence[int]], title: str, path: Path, colors: Mapping[str, str] | None = None,
) -> Path:
    """Share of rounds committing L tokens, grouped bars per L (one bar per strategy)."""
    data = {k: v for k, v in data.items() if v}
    hi = max((max(v) for v in data.values()), default=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * hi + 3.0), 4.0))
    width = 0.8 / max(len(data), 1)
    for i, (label, values) in enumerate(data.items()):
        shares = [sum(1 for v in values if v == n) / len(values) for n in range(1, hi + 1)]
        xs = [n - 0.4 + width * (i + 0.5) for n in range(1, hi + 1)]
        mean = sum(values) / len(values)
        ax.bar(xs, shares, width=width, color=_color(label, i, colors),
               label=f"{label} (mean {mean:.2f}, {len(values)} rounds)")
    ax.set_xlabel("tokens committed per round (L)")
    ax.set_ylabel("share of rounds")
    ax.set_xticks(range(1, hi + 1))
    _title(ax, title, 10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def heatmap(
    x_name: str, x_values: Sequence[object], y_name: str, y_values: Sequence[object],
    cells: Sequence[Sequence[float | None]], title: str, path: Path, value_name: str = "speedup (×)",
) -> Path:
    """``cells[j][i]`` is the value at (x_values[i], y_values[j]); missing cells stay blank."""
    import numpy as np

    grid = np.array([[np.nan if v is None else v for v in row] for row in cells], dtype=float)
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(x_values), 1.4 + 0.6 * len(y_values)))
    im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(x_values)), [str(v) for v in x_values])
    ax.set_yticks(range(len(y_values)), [str(v) for v in y_values])
    ax.set_xlabel(x_name)
    ax.set_ylabel(y_name)
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for j in range(grid.shape[0]):
        for i in range(grid.shape[1]):
            if np.isfinite(grid[j, i]):
                ax.text(i, j, f"{grid[j, i]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if grid[j, i] > mid else "white")
    fig.colorbar(im, ax=ax, label=value_name)
    _title(ax, title, 9)
    return _save(fig, path)
