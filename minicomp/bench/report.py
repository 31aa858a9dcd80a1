"""What a bench run shows: the terminal table, the JSON file and the PNG chart of speedups."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from minicomp.bench import png

SCHEMA = "minicomp-bench/1"
# The bars' colors, one per backend, in the order backends are listed.
PALETTE = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (148, 103, 189),
    (140, 86, 75),
    (23, 190, 207),
]
FAIL_COLOR = (214, 39, 40)
MIB = 1024 * 1024


def config_label(row: dict) -> str:
    """`gpt2 float16 b16`: the model configuration a row belongs to."""
    return f"{row['model']} {row['dtype']} b{row['batch']}"


def _num(value, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _status(row: dict) -> str:
    return {"pass": "ok", "mismatch": "MISMATCH", "error": "ERROR"}.get(row["status"], "?")


_COLUMNS = (
    # title, alignment, cell text
    ("model", "<", lambda r: r["model"]),
    ("dtype", "<", lambda r: r["dtype"]),
    ("batch", ">", lambda r: str(r["batch"])),
    ("backend", "<", lambda r: r["backend"]),
    ("check", "<", _status),
    ("rel.err", ">", lambda r: _num(r["max_rel_err"], ".1e")),
    ("ms", ">", lambda r: _num(r["latency_ms"], ".3f")),
    ("vs eager", ">", lambda r: _num(r["speedup_vs_eager"], ".2f", "x")),
    ("vs inductor", ">", lambda r: _num(r["speedup_vs_inductor"], ".2f", "x")),
    ("compile s", ">", lambda r: _num(r["compile_s_cold"], ".1f")),
    ("warm s", ">", lambda r: _num(r["compile_s_warm"], ".1f")),
    ("peak MiB", ">", lambda r: _num(_mib(r["peak_mem_bytes"]), ".1f")),
    ("kernels", ">", lambda r: _num(r["kernel_count"], "d")),
    ("ATen ops", ">", lambda r: _num(_count(r["fallback_ops"]), "d")),
)


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / MIB


def _count(ops: dict | None) -> int | None:
    return None if ops is None else len(ops)


def table(rows: list[dict]) -> str:
    """The results as an aligned text table, a blank line between model configurations,
    followed by each failure's error and minicomp's fallback ops per configuration."""
    cells = [[text(r) for _, _, text in _COLUMNS] for r in rows]
    header = [title for title, _, _ in _COLUMNS]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]

    def line(values: list[str]) -> str:
        parts = [f"{v:{align}{w}}" for v, (_, align, _), w in zip(values, _COLUMNS, widths)]
        return "  ".join(parts).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    previous = None
    for row, values in zip(rows, cells):
        if previous is not None and config_label(row) != previous:
            out.append("")
        previous = config_label(row)
        out.append(line(values))
    out.extend(_notes(rows))
    return "\n".join(out)


def _notes(rows: list[dict]) -> list[str]:
    notes = []
    for r in rows:
        if r["error"]:
            notes.append(f"  {config_label(r)} {r['backend']}: {r['error']}")
        elif r["status"] == "mismatch":
            notes.append(
                f"  {config_label(r)} {r['backend']}: max relative error {r['max_rel_err']:.3g}"
                f" > tolerance {r['tolerance']:g}"
            )
    out = ["", "failures:", *notes] if notes else []
    seen: dict[str, list[str]] = {}
    for r in rows:
        ops = r.get("fallback_ops")
        if ops and r["backend"].startswith("minicomp"):
            seen.setdefault(", ".join(ops), []).append(f"{r['model']} {r['dtype']}")
    if seen:
        out += ["", "ops minicomp ran as ATen calls:"]
        for ops, where in seen.items():
            out.append(f"  {', '.join(dict.fromkeys(where))}: {ops}")
    return out


def write_json(path: str, document: dict) -> None:
    """Write the run's document (see runner.run) to `path`, creating its folder."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=1, sort_keys=False)
        f.write("\n")


# -- the chart -----------------------------------------------------------------------------


def _bars(rows: list[dict], backends: list[str]) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(configuration, [(backend, row)]) for every configuration, eager left out: its
    speedup is 1 by definition, drawn as the reference line instead."""
    groups: dict[str, list[tuple[str, dict]]] = {}
    for r in rows:
        if r["backend"] != "eager":
            groups.setdefault(config_label(r), []).append((r["backend"], r))
    order = {b: i for i, b in enumerate(backends)}
    return [(k, sorted(v, key=lambda br: order.get(br[0], 99))) for k, v in groups.items()]


def _colors(backends: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    names = [b for b in backends if b != "eager"]
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(names)}


def write_chart(path: str, rows: list[dict], backends: list[str], title: str) -> str:
    """A PNG bar chart of each backend's speedup over eager per configuration at `path`;
    matplotlib draws it when importable, else the built-in writer. Returns which one did."""
    try:
        import matplotlib  # noqa: F401 - optional
    except ImportError:
        draw_builtin_chart(path, rows, backends, title)
        return "builtin"
    draw_matplotlib_chart(path, rows, backends, title)
    return "matplotlib"


def _speedup_text(row: dict) -> str:
    if row["status"] != "pass":
        return "FAIL" if row["status"] == "mismatch" else "ERROR"
    speedup = row["speedup_vs_eager"]
    return "no eager time" if speedup is None else f"{speedup:.2f}x"


def draw_matplotlib_chart(path: str, rows: list[dict], backends: list[str], title: str) -> None:
    """The chart drawn with matplotlib's object API (no pyplot: no global state touched)."""
    # matplotlib is optional (write_chart checks it is there) and slow to import.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups, colors = _bars(rows, backends), _colors(backends)
    count = sum(len(bars) for _, bars in groups)
    fig = Figure(figsize=(10, 1.5 + 0.28 * (count + len(groups))))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    y, ticks, labels = 0, [], []
    for label, bars in groups:
        for backend, row in bars:
            speedup = row["speedup_vs_eager"] if row["status"] == "pass" else None
            ax.barh(y, speedup or 0, color=[c / 255 for c in colors[backend]], height=0.8)
            ax.text(speedup or 0, y, " " + _speedup_text(row), va="center", fontsize=7)
            ticks.append(y)
            labels.append(f"{label}  {backend}")
            y -= 1
        y -= 1
    ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel("speedup over eager (higher is better)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def draw_builtin_chart(path: str, rows: list[dict], backends: list[str], title: str) -> None:
    """The chart drawn with the built-in PNG writer: one horizontal bar per backend, grouped
    by configuration, a dashed line at 1x."""
    groups, colors = _bars(rows, backends), _colors(backends)
    bar_h, gap, margin = 16, 5, 16
    label_w = max(
        [png.text_width(b) for b in colors] + [png.text_width(g) for g, _ in groups] + [0]
    )
    left = margin + label_w + 12
    plot_w = 520
    top_y = margin + 56
    bottom_y = top_y + sum((len(b) + 1) * (bar_h + gap) + 6 for _, b in groups)
    canvas = png.Canvas(left + plot_w + 110, bottom_y + 40 + margin)
    speedups = [r["speedup_vs_eager"] for _, bars in groups for _, r in bars if _drawable(r)]
    top = max([1.0, *speedups]) * 1.1
    scale = plot_w / top
    canvas.text(margin, margin, title[:90])
    x = margin
    for backend, color in colors.items():  # the legend
        canvas.rect(x, margin + 24, x + 14, margin + 38, color)
        x = canvas.text(x + 20, margin + 25, backend) + 16
    one = left + round(scale)
    for dash in range(top_y, bottom_y, 8):  # the eager line, dashed, under everything else
        canvas.rect(one, dash, one + 2, dash + 4, (128, 128, 128))
    y = top_y
    for label, bars in groups:
        canvas.text(margin, y, label, (60, 60, 60))
        y += bar_h + gap
        for backend, row in bars:
            canvas.text(margin + 12, y + 1, backend, (90, 90, 90))
            end = left
            if _drawable(row):
                end = left + max(1, round(row["speedup_vs_eager"] * scale))
                canvas.rect(left, y, end, y + bar_h, colors[backend])
            text = _speedup_text(row)
            canvas.rect(end + 3, y, end + 9 + png.text_width(text), y + bar_h, (255, 255, 255))
            text_color = (0, 0, 0) if row["status"] == "pass" else FAIL_COLOR
            canvas.text(end + 6, y + 1, text, text_color)
            y += bar_h + gap
        y += 6
    canvas.rect(left, y, left + plot_w, y + 2, (0, 0, 0))
    for tick in _ticks(top):
        tx = left + round(tick * scale)
        canvas.rect(tx, y, tx + 2, y + 6, (0, 0, 0))
        canvas.text(tx - png.text_width(f"{tick:g}x") // 2, y + 10, f"{tick:g}x")
    canvas.save(path)


def _drawable(row: dict) -> bool:
    return row["status"] == "pass" and row["speedup_vs_eager"] is not None


def _ticks(top: float) -> list[float]:
    """Round tick values from 0 to `top`, at most about six."""
    for step in (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100):
        if top / step <= 6:
            break
    return [i * step for i in range(int(top / step) + 1)]
