"""PNG figures in the style of the paper's: grouped bars, CDFs, lines over a parameter or time.

matplotlib runs headless (Agg): benchmarks run on servers and in CI.  Each
function draws one figure file and returns its name, so scenarios can list
what they drew.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

COLORS = {
    "sdn": "#1f77b4",
    "tcp": "#d62728",
    "bytewax -p 1": "#2ca02c",
    "bytewax -p 2": "#ff7f0e",
}


def _color(name: str, i: int) -> str:
    return COLORS.get(name, f"C{i}")


def grouped_bars(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    ylabel: str,
    note: str = "",
) -> str:
    """Bars per group (x) and series (colour); a missing value leaves a gap."""
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) + 2), 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None else 0.0 for v in values]
        ax.bar(xs, ys, width, label=name, color=_color(name, i))
    ax.set_xticks(range(len(groups)), groups, rotation=20 if len(groups) > 6 else 0)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, alpha=0.7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def cdf_panels(
    path: Path,
    title: str,
    panels: dict[str, dict[str, Sequence[float] | None]],
    xlabel: str = "latency (ms)",
) -> str:
    """One CDF panel per key of ``panels``; each curve is a quantile list (seconds)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), sharey=True)
    if len(panels) == 1:
        axes = [axes]
    for ax, (panel, curves) in zip(axes, panels.items(), strict=True):
        for i, (label, q) in enumerate(curves.items()):
            if not q:
                continue
            xs = [max(v * 1000.0, 1e-3) for v in q]
            ys = [k / (len(q) - 1) for k in range(len(q))]
            ax.plot(xs, ys, label=label, color=f"C{i}")
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(panel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("CDF")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def line_panels(
    path: Path,
    title: str,
    x: Sequence[float],
    xlabel: str,
    panels: dict[str, dict[str, Sequence[float | None]]],
) -> str:
    """One panel per key (its y label); one line per series, gaps where values are missing."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    if len(panels) == 1:
        axes = [axes]
    for ax, (ylabel, series) in zip(axes, panels.items(), strict=True):
        for i, (name, ys) in enumerate(series.items()):
            pts = [(a, b) for a, b in zip(x, ys, strict=True) if b is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name, color=_color(name, i))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xticks(list(x))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def time_series(
    path: Path,
    title: str,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    ylabel: str,
    markers: Sequence[tuple[float, str, str]] = (),
    xlabel: str = "time (s)",
    note: str = "",
) -> str:
    """Lines over time (one per series, x and y given), with labelled vertical markers.

    A marker is ``(x, label, series name or '')``: drawn dashed in that series'
    colour, or black solid for an event common to every series (a kill, say).
    """
    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(series)
    for i, (name, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, label=name, color=_color(name, i), drawstyle="steps-post")
    common = 0
    for x, label, owner in markers:
        if owner in series:
            color, style = _color(owner, names.index(owner)), "--"
        else:  # events common to every series: black, one line style each
            color, style = "black", ("-", ":", "-.", (0, (5, 1)))[common % 4]
            common += 1
        ax.axvline(x, color=color, linestyle=style, linewidth=1, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, alpha=0.7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def bar_panels(
    path: Path,
    title: str,
    panels: dict[str, dict[str, float | None]],
    note: str = "",
) -> str:
    """One panel per key (its y label), one bar per system in it; each panel its own scale
    (tuples/s and sentences/s differ by orders of magnitude), values written on the bars."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    if len(panels) == 1:
        axes = [axes]
    for ax, (ylabel, bars) in zip(axes, panels.items(), strict=True):
        names = list(bars)
        ys = [bars[n] or 0.0 for n in names]
        ax.bar(range(len(names)), ys, color=[_color(n, i) for i, n in enumerate(names)])
        for i, n in enumerate(names):
            label = "–" if bars[n] is None else f"{bars[n]:,.0f}"
            ax.text(i, ys[i], label, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=15)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, alpha=0.7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def rate_latency_panels(
    path: Path,
    title: str,
    columns: dict[str, dict[str, tuple[Sequence[float], Sequence[float], Sequence[float | None]]]],
    spans: dict[str, dict[str, Sequence[tuple[float, float]]]],
    xlabel: str = "time from the first scale request (s)",
) -> str:
    """Two rows (tuples/s, p99 ms) by one column per key of ``columns``; each series is
    ``(x, rate, p99 ms)``; ``spans[column][series]`` shades the windows of that series'
    reconfigurations in its colour."""
    fig, axes = plt.subplots(2, len(columns), figsize=(6 * len(columns), 6.5), squeeze=False)
    for c, (name, series) in enumerate(columns.items()):
        top, bottom = axes[0][c], axes[1][c]
        for i, (label, (xs, rates, p99)) in enumerate(series.items()):
            color = _color(label, i)
            top.plot(xs, rates, label=label, color=color, drawstyle="steps-post")
            pts = [(x, y) for x, y in zip(xs, p99, strict=True) if y is not None]
            if pts:
                bottom.plot(
                    *zip(*pts, strict=True), label=label, color=color, drawstyle="steps-post"
                )
            for x0, x1 in spans.get(name, {}).get(label, ()):
                for ax in (top, bottom):
                    ax.axvspan(x0, x1, color=color, alpha=0.12)
        top.set_title(name)
        top.set_ylabel("sink tuples/s")
        bottom.set_ylabel("p99 latency (ms)")
        bottom.set_yscale("log")
        bottom.set_xlabel(xlabel)
        top.set_ylim(bottom=0)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
