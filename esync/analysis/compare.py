"""Figures that compare named rows (a mode and its variant, e.g. ``ESync (fednova)``) across
network settings: what the benchmark report shows. The drawer's figures compare mode folders.

Over repeated runs a row is drawn as its median accuracy over time with a min–max band: one run
alone says little on a shared machine, and the band shows how far the repeats spread.

Every function draws into a matplotlib ``Figure`` it is given and returns whether it drew
anything, so callers and tests can read the plotted data back from the figure's axes.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from esync.common import modes
from esync.analysis.table import accuracy_series

# Variants of one mode share its colour; line styles and markers tell them apart.
STYLES = ("-", "--", "-.", ":")
MARKERS = (".", "x", "^", "s")


def row_styles(names: list[str]) -> dict[str, dict]:
    """Matplotlib keyword arguments per row: the mode's colour, one style per variant."""
    seen: dict[str, int] = {}
    found = {}
    for name in names:
        family = modes.family(name)
        index = seen.get(family, 0)
        seen[family] = index + 1
        found[name] = {"color": modes.colour(family, "0.5"),
                       "linestyle": STYLES[index % len(STYLES)],
                       "marker": MARKERS[index % len(MARKERS)]}
    return found


def draw_accuracy_rows(fig: Figure, summaries: dict[str, dict], labels: dict[str, str], *,
                       title: str, target: float | None = None) -> bool:
    """Test accuracy over time of each row (standalone SGD's in black, like every row)."""
    styles = row_styles(list(summaries))
    ax = fig.add_subplot()
    drawn = False
    for name, summary in summaries.items():
        series = accuracy_series(summary)
        if series is None:
            continue
        pairs = sorted(zip(series[0], series[1]))
        ax.plot([t for t, _ in pairs], [a for _, a in pairs], gid=name,
                markersize=4, label=labels.get(name, name), **styles[name])
        drawn = True
    if not drawn:
        return False
    if target is not None:
        ax.axhline(target, color="0.6", linewidth=0.8, linestyle=":", gid="target",
                   label=f"target {target:g}")
    ax.set_xlabel("Time (s)")
    ax.set_ylabel("Test accuracy")
    ax.set_ylim(0, 1)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    ax.set_title(title)
    return True


def accuracy_band(series: list[tuple[list[float], list[float]]],
                  xmax: float | None = None) -> tuple[np.ndarray, ...] | None:
    """``(times, median, low, high)`` over repeats of one row.

    Each repeat's accuracy is interpolated linearly between its own records, on the union of
    every repeat's record times (up to ``xmax``), and keeps its last value after its last record
    (a run that ended has that accuracy). The statistics start where every repeat has its first
    record, so that they are always over all repeats (a median of whichever runs happen to have
    begun would jump). None when no point has every repeat.
    """
    pairs = [sorted(zip(t, a)) for t, a in series if len(t)]
    if not pairs:
        return None
    grid = np.unique(np.concatenate([[t for t, _ in p] for p in pairs]))
    grid = grid[grid >= max(p[0][0] for p in pairs)]
    if xmax is not None:
        grid = grid[grid <= xmax]
    if not len(grid):
        return None
    stack = np.vstack([np.interp(grid, [t for t, _ in p], [a for _, a in p]) for p in pairs])
    return grid, np.median(stack, axis=0), stack.min(axis=0), stack.max(axis=0)


# A zoomed accuracy axis starts at this quantile of the medians drawn (the climb from chance
# takes the first seconds; the rows differ above it) and leaves this much room around the data.
ZOOM_QUANTILE = 0.1
ZOOM_STEP = 0.05


def zoomed_range(medians: list[np.ndarray], highs: list[np.ndarray],
                 target: float | None = None) -> tuple[float, float] | None:
    """The accuracy axis ``(low, high)`` where the rows differ: from the ``ZOOM_QUANTILE`` of
    every median point drawn (and below the target, so its line shows) to the highest band,
    both rounded outwards to ``ZOOM_STEP``; None when nothing was drawn."""
    points = np.concatenate([m for m in medians if len(m)]) if medians else np.array([])
    if not len(points):
        return None
    low = float(np.quantile(points, ZOOM_QUANTILE))
    if target is not None:
        low = min(low, target - ZOOM_STEP)
    high = max(float(np.max(h)) for h in highs if len(h))
    # (the small slack keeps a value on a step, e.g. 0.8, from rounding a step away)
    low = max(0.0, math.floor(low / ZOOM_STEP + 1e-9) * ZOOM_STEP)
    high = min(1.0, math.ceil(high / ZOOM_STEP - 1e-9) * ZOOM_STEP)
    return (low, high) if high > low else None


def draw_accuracy_bands(fig: Figure, repeats: dict[str, list[dict]], labels: dict[str, str], *,
                        title: str, target: float | None = None, xmax: float | None = None,
                        marks: dict[str, float] | None = None, zoom: bool = False) -> bool:
    """Median test accuracy over time of each row across its repeats (``repeats[row]``: one
    summary per repeat), with a min–max band (gid ``<row>-band``) when there are several.
    ``marks``: vertical lines (label -> seconds), e.g. when a device slowed down. ``zoom``:
    the accuracy axis spans where the rows differ (``zoomed_range``), not 0-1: every tuned row
    climbs from chance within seconds, and the comparison is in the last few hundredths."""
    styles = row_styles(list(repeats))
    ax = fig.add_subplot()
    drawn = False
    medians, highs = [], []
    for name, summaries in repeats.items():
        series = [s for s in (accuracy_series(x) for x in summaries) if s is not None]
        band = accuracy_band([(s[0], s[1]) for s in series], xmax)
        if band is None:
            continue
        grid, mid, low, high = band
        medians.append(mid)
        highs.append(high)
        # Markers only where the line is too short to see (a point or two).
        style = dict(styles[name], marker=styles[name]["marker"] if len(grid) < 3 else None)
        n = len(series)
        ax.plot(grid, mid, gid=name, label=labels.get(name, name)
                + (f" (median of {n})" if n > 1 else ""), **style)
        if n > 1:
            ax.fill_between(grid, low, high, color=style["color"], alpha=0.15, linewidth=0,
                            gid=f"{name}-band")
        drawn = True
    if not drawn:
        return False
    if target is not None:
        ax.axhline(target, color="0.6", linewidth=0.8, linestyle=":", gid="target",
                   label=f"target {target:g}")
    for text, seconds in (marks or {}).items():
        ax.axvline(seconds, color="0.3", linewidth=0.8, linestyle="--", gid=f"mark-{text}",
                   label=text)
    ax.set_xlabel("Time (s)")
    span = zoomed_range(medians, highs, target) if zoom else None
    ax.set_ylabel("Test accuracy" + (" (axis zoomed)" if span else ""))
    ax.set_ylim(*(span or (0, 1)))
    if xmax:
        ax.set_xlim(0, xmax)
    else:
        ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    ax.set_title(title)
    return True


def draw_setting_bars(fig: Figure, values: dict[str, dict[str, float | None]],
                      labels: dict[str, str], *, ylabel: str, title: str) -> bool:
    """Grouped bars: one group per row, one bar per network setting (``values[row][setting]``).

    A missing value leaves a gap (NaN), never a misleading zero.
    """
    rows = [r for r in values if any(v is not None for v in values[r].values())]
    if not rows:
        return False
    settings = list(dict.fromkeys(s for r in rows for s in values[r]))
    width = 0.8 / len(settings)
    ax = fig.add_subplot()
    for i, setting in enumerate(settings):
        xs = [j + (i - (len(settings) - 1) / 2) * width for j in range(len(rows))]
        heights = [values[r].get(setting) for r in rows]
        ax.bar(xs, [float("nan") if h is None else h for h in heights], width=width,
               color=[modes.colour(modes.family(r), "0.5") for r in rows],
               hatch=None if i == 0 else "//", edgecolor="k", linewidth=0.3,
               label=setting, gid=setting)
    ax.set_xticks(range(len(rows)), [labels.get(r, r) for r in rows], rotation=30, ha="right",
                  fontsize="small")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    return True


def draw_time_to_target(fig: Figure, times: dict[str, dict[str, tuple | None]],
                        labels: dict[str, str], *, target: float, budget: float,
                        title: str) -> bool:
    """One panel per network setting, one horizontal bar per row: its median time to the
    target, with a min–max bar over the repeats (``times[row][setting]``: ``(median, low,
    high)``, None where the median run did not reach it). A row that did not reach the target
    gets no bar but a note at the budget, never a bar that looks like a time."""
    rows = [r for r in times if any(v is not None for v in times[r].values())]
    if not rows:
        return False
    settings = list(dict.fromkeys(s for r in times for s in times[r]))
    axes = fig.subplots(1, len(settings), sharey=True, squeeze=False)[0]
    ys = list(range(len(rows)))[::-1]
    # SSGD's Table 1 runs may pass the budget: the axis holds every range drawn
    right = 1.08 * max([budget] + [v[2] for r in rows for v in times[r].values()
                                   if v is not None and v[2] is not None])
    for ax, setting in zip(axes, settings):
        for y, row in zip(ys, rows):
            value = times[row].get(setting)
            if value is None or value[0] is None:
                ax.text(budget, y, f"not reached in {budget:g} s", va="center", ha="right",
                        fontsize="x-small", color="0.4", gid=f"{row}-{setting}-missed")
                continue
            mid, low, high = value
            ax.barh(y, mid, color=modes.colour(modes.family(row), "0.5"), edgecolor="k",
                    linewidth=0.3, gid=f"{row}-{setting}")
            if low is not None and high is not None and high > low:
                ax.errorbar(mid, y, xerr=[[mid - low], [high - mid]], color="k", capsize=3,
                            linewidth=0.8, gid=f"{row}-{setting}-range")
            ax.text(max(mid, high or mid) + 0.01 * right, y, f"{mid:.1f} s", va="center",
                    fontsize="x-small", gid=f"{row}-{setting}-value")
        ax.set_xlim(0, right)
        ax.set_title(setting, fontsize="small")
        ax.set_xlabel(f"Seconds to {target:g} (median, min–max)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys, [labels.get(r, r) for r in rows], fontsize="x-small")
    fig.suptitle(title)
    return True


def save(fig: Figure, folder: Path, stem: str) -> list[Path]:
    """PNG and SVG (text kept as text) of ``fig``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.tight_layout()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        for path in paths:
            fig.savefig(path, dpi=120)
    return paths
