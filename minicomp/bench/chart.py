"""The bench chart: each backend's speed-up over eager per model configuration (matplotlib).

Bars rise from the 1x line for a speed-up and hang below it for a slow-down, on a log axis
centred on 1x, so 2x and 0.5x are the same distance from it. Each bar is the median of the
per-round ratios, its whisker their interquartile range; a noisy cell is hatched and marked
"!" as in the table. matplotlib is optional (`pip install 'minicomp[bench]'`): without it
the bench prints MISSING and draws nothing.
"""

from __future__ import annotations

import math

from minicomp.bench.stats import significant

MISSING = (
    "no chart: matplotlib is not installed (pip install 'minicomp[bench]'); "
    "the table and the JSON file are complete without it"
)
FAIL_COLOR = "#d62728"
# 1-2-5 steps for the speed-up axis, from 1/1000x to 1000x.
_STEPS = sorted({m * 10.0**e for e in range(-3, 3) for m in (1, 2, 5)} | {1000.0})


def missing() -> str | None:
    """Why no chart can be drawn here (matplotlib is not installed), or None."""
    try:
        import matplotlib  # noqa: F401 - optional, and only needed for a chart
    except ImportError:
        return MISSING
    return None


def config_label(row: dict) -> str:
    """The x-axis label of a row's model configuration."""
    return f"{row['model']}\n{row['dtype']} b{row['batch']}"


def _groups(rows: list[dict], backends: list[str]) -> list[tuple[str, list[dict]]]:
    """(configuration, its rows in `backends` order) per configuration, eager left out: its
    speed-up is 1 by definition, the reference line."""
    order = {b: i for i, b in enumerate(backends)}
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["backend"] != "eager":
            groups.setdefault(config_label(r), []).append(r)
    return [(k, sorted(v, key=lambda r: order.get(r["backend"], 99))) for k, v in groups.items()]


def _drawn(row: dict) -> bool:
    return row["status"] == "pass" and row.get("speedup_vs_eager") is not None


def _limit(rows: list[dict], upright: bool) -> float:
    """The axis reaches from 1/limit to limit: past every bar and whisker with room for the
    labels beyond them (more when `upright`, turned on end), and 2x at least."""
    far = [2.0]
    for r in rows:
        if _drawn(r):
            for key in ("speedup_vs_eager", "speedup_vs_eager_q1", "speedup_vs_eager_q3"):
                value = r.get(key) or r["speedup_vs_eager"]
                far.append(max(value, 1 / value))
    return max(far) ** (1.3 if upright else 1.1) * 1.6


def _ticks(limit: float) -> list[float]:
    ticks = [t for t in _STEPS if 1 / limit <= t <= limit]
    if len(ticks) > 11:  # a wide range: powers of ten only
        ticks = [t for t in ticks if math.log10(t).is_integer()]
    return ticks


def draw(rows: list[dict], backends: list[str], title: str):
    """The chart as a matplotlib Figure (the object API and the Agg canvas: no pyplot, so
    no global state and no display needed)."""
    # matplotlib is optional (see missing()) and slow to import.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    groups = _groups(rows, backends)
    shown = [b for b in backends if b != "eager"]
    palette = [f"C{i}" for i in range(10)]
    colors = {b: palette[i % len(palette)] for i, b in enumerate(shown)}
    width = 0.8 / max(1, len(shown))
    upright = len(shown) > 3  # narrow bars: their labels stand on end
    fig = Figure(figsize=(max(6.4, 1.6 + 0.45 * len(shown) * len(groups)), 6 if upright else 5.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_yscale("log")
    limit = _limit([r for _, rs in groups for r in rs], upright)
    ax.set_ylim(1 / limit, limit)
    for g, (_, group) in enumerate(groups):
        for r in group:
            x = g + (shown.index(r["backend"]) - (len(shown) - 1) / 2) * width
            _bar(ax, x, width, r, colors[r["backend"]], upright)
    ax.axhline(1.0, color="black", linewidth=1.0, zorder=3)
    ticks = _ticks(limit)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.grid(axis="y", color="#dddddd", linewidth=0.6, zorder=0)
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    if len(groups) > 4:
        for label in ax.get_xticklabels():
            label.set(rotation=30, horizontalalignment="right")
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel("speed-up over eager (log scale; above 1x is faster)")
    ax.set_title(title, fontsize=10, pad=24)
    handles = [Patch(color=colors[b], label=b) for b in shown]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(shown),
              fontsize=8, frameon=False, borderaxespad=0.2)  # fmt: skip
    fig.text(
        0.01, 0.01,
        "bar: median of the per-round ratios; whisker: their interquartile range; "
        "hatched and !: noisy (see the table's footnote)",
        fontsize=7, color="#555555",
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _bar(ax, x: float, width: float, row: dict, color: str, upright: bool) -> None:
    """One cell: a bar from 1x to its median with its IQR whisker, or its failure's word;
    `upright` turns the value's label (narrow bars)."""
    if not _drawn(row):
        word = {"mismatch": "FAIL"}.get(row["status"], "ERROR")
        ax.text(x, 1.0, word, rotation=90, ha="center", va="bottom", fontsize=7,
                color=FAIL_COLOR, zorder=4)  # fmt: skip
        return
    value = row["speedup_vs_eager"]
    noisy = bool(row.get("speedup_vs_eager_noisy"))
    ax.bar(x, value - 1.0, bottom=1.0, width=width * 0.92, color=color, zorder=2,
           hatch="///" if noisy else None, edgecolor="white" if noisy else color)  # fmt: skip
    q1, q3 = row.get("speedup_vs_eager_q1"), row.get("speedup_vs_eager_q3")
    if q1 is not None and q3 is not None:
        ax.errorbar(x, value, yerr=[[value - q1], [q3 - value]], fmt="none", ecolor="black",
                    elinewidth=0.8, capsize=2, zorder=4)  # fmt: skip
    text = significant(value) + "x" + (" !" if noisy else "")
    end = q3 if value >= 1 and q3 is not None else q1 if q1 is not None else value
    ax.annotate(text, (x, end), xytext=(0, 3 if value >= 1 else -3), textcoords="offset points",
                ha="center", va="bottom" if value >= 1 else "top", fontsize=7,
                rotation=90 if upright else 0, zorder=5)  # fmt: skip


def write(path: str, rows: list[dict], backends: list[str], title: str) -> None:
    """Draw the chart and save it as a PNG at `path` (requires matplotlib: see missing())."""
    draw(rows, backends, title).savefig(path, dpi=120)
