"""What a bench run shows: the terminal table with its header and footnotes, the JSON file.

The chart is chart.py's."""

from __future__ import annotations

import json
import os
import textwrap

from minicomp.bench.stats import NOISY_SPREAD, significant

# 2: speed-ups are medians of per-round ratios, with their quartiles, extremes and a noisy
# flag; peak memory on the CPU counts tensors (cpu-tensors), no longer the resident set.
SCHEMA = "minicomp-bench/2"
MIB = 1024 * 1024
NOISY_MARK = "!"
WIDTH = 100  # the prose around the table wraps here


def config_label(row: dict) -> str:
    """`gpt2 float16 b16`: the model configuration a row belongs to."""
    return f"{row['model']} {row['dtype']} b{row['batch']}"


def _num(value, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _sig(value, suffix: str = "") -> str:
    return "-" if value is None else significant(value) + suffix


def _speedup(base: str):
    """The cell text of a speed-up: the median of the per-round ratios, marked when noisy."""

    def text(row: dict) -> str:
        value = row.get(f"speedup_vs_{base}")
        if value is None:
            return "-"
        noisy = row.get(f"speedup_vs_{base}_noisy")
        return significant(value) + "x" + (f" {NOISY_MARK}" if noisy else "")

    return text


def _iqr(base: str):
    """The cell text of a speed-up's interquartile range (none against itself)."""

    def text(row: dict) -> str:
        q1, q3 = row.get(f"speedup_vs_{base}_q1"), row.get(f"speedup_vs_{base}_q3")
        if q1 is None or q3 is None or row["backend"] == base:
            return "-"
        return f"{significant(q1)}-{significant(q3)}"

    return text


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
    ("ms", ">", lambda r: _sig(r["latency_ms"])),
    ("vs eager", ">", _speedup("eager")),
    ("IQR", ">", _iqr("eager")),
    ("vs inductor", ">", _speedup("inductor")),
    ("IQR", ">", _iqr("inductor")),
    ("compile s", ">", lambda r: _num(r["compile_s_cold"], ".1f")),
    ("warm s", ">", lambda r: _num(r["compile_s_warm"], ".1f")),
    ("peak MiB", ">", lambda r: _sig(_mib(r["peak_mem_bytes"]))),
    ("kernels", ">", lambda r: _num(r["kernel_count"], "d")),
    ("ATen ops", ">", lambda r: _num(_count(r["fallback_ops"]), "d")),
)


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / MIB


def _count(ops: dict | None) -> int | None:
    return None if ops is None else len(ops)


def table(rows: list[dict], max_spread: float = NOISY_SPREAD) -> str:
    """The results as an aligned text table, a blank line between model configurations,
    followed by footnotes: what a noisy mark means (`max_spread`: the threshold the rows
    were flagged with), each failure's error and minicomp's fallback ops per configuration."""
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
    out.extend(_noise_notes(rows, max_spread))
    out.extend(_notes(rows))
    return "\n".join(out)


def _noise_notes(rows: list[dict], max_spread: float) -> list[str]:
    noisy: dict[str, list[str]] = {}
    for r in rows:
        if r.get("speedup_vs_eager_noisy") or r.get("speedup_vs_inductor_noisy"):
            noisy.setdefault(config_label(r), []).append(r["backend"])
    out = []
    if noisy:
        note = (
            f"{NOISY_MARK} noisy: the middle half of the cell's per-round ratios spans more than "
            f"{max_spread:.0%} of their median (--max-spread). The median is still the best "
            "estimate, but measure it again, with more --repeats or on a quieter machine, "
            "before quoting it. Noisy: "
            + "; ".join(f"{label} ({', '.join(names)})" for label, names in noisy.items())
            + "."
        )
        out += ["", *_wrap(note)]
    rounds = [r["repeats"] for r in rows if r.get("repeats")]
    if rounds and min(rounds) < 3:
        out += ["", f"With {min(rounds)} round(s) the spread says little: use --repeats 3 or more."]
    return out


def plural(count: int, noun: str) -> str:
    """`1 thread`, `2 threads`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def preamble(meta: dict) -> list[str]:
    """The lines above the table: what was run on what, how each column was measured, and
    the warnings that bear on every number (a loaded machine)."""
    settings = meta["settings"]
    threads = f", {plural(meta['threads'], 'thread')}" if settings["device"] == "cpu" else ""
    items = [
        f"minicomp bench on {settings['device']} ({meta['device_name']}){threads}, "
        f"{meta['cores']} usable cores; {settings['size']} models",
        f"timing: {settings['repeats']} rounds after {settings['warmup']} warm-up calls; each "
        "round runs every backend once, in rotating order",
        "ms: the median over the rounds; vs eager, vs inductor: the median of the per-round "
        "ratios; IQR: their interquartile range",
        f"peak MiB: {MEMORY_METHODS.get(meta['memory_method'], meta['memory_method'])}",
        *meta.get("warnings", []),
    ]
    return [line for item in items for line in _wrap(item)]


def _wrap(text: str) -> list[str]:
    """Prose around the table, wrapped at WIDTH, continuation lines indented (option names
    such as --max-spread are not broken at their hyphens)."""
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


MEMORY_METHODS = {
    "cpu-tensors": "tensors the backend keeps between calls, plus one call's peak of tensor "
    "allocations (torch.profiler), weights and inputs excluded",
    "cuda-max-allocated": "torch.cuda.max_memory_allocated over the warm-up calls, minus what "
    "was allocated before the compile (weights, inputs)",
}


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
