"""The kernel benchmarks' terminal table: a line per case, a summary per family."""

from __future__ import annotations

import math

from minicomp.bench.kernels.families import FAMILIES


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def header(levels) -> str:
    cells = [f"{'case':44}", f"{'lib':>7}"]
    cells += [f"{'mc' + str(lv):>7}" for lv in levels] + [f"{'ind':>7}"]
    cells += [f"{'best/lib':>8}", f"{'roof':>5}", "  notes"]
    legend = "TFLOP/s; best/lib = best minicomp over the library; roof = its fraction of the peak"
    return legend + "\n" + " ".join(cells)


def best_level(row: dict, levels) -> int | None:
    """The search space whose kernel ran fastest in `row` (None when none ran)."""
    timed = [lv for lv in levels if row.get(f"mc{lv}_s")]
    return min(timed, key=lambda lv: row[f"mc{lv}_s"]) if timed else None


def line(row: dict, levels) -> str:
    """One case's line in the stage's table."""
    best = best_level(row, levels)
    cells = [f"{row['case'][:44]:44}", f"{_num(row.get('library_tflops'), '7.1f')}"]
    cells += [f"{_num(row.get(f'mc{lv}_tflops'), '7.1f')}" for lv in levels]
    cells.append(f"{_num(row.get('inductor_tflops'), '7.1f')}")
    ratio = row.get(f"mc{best}_vs_library") if best is not None else None
    roof = row.get(f"mc{best}_roofline") if best is not None else None
    cells += [f"{_num(ratio, '7.2f')}x", f"{_num(roof, '5.2f')}"]
    notes = []
    for name in ["library", *(f"mc{lv}" for lv in levels), "inductor"]:
        if row.get(f"{name}_wrong"):
            notes.append(f"WRONG {name} ({row[f'{name}_rel_err']:.1e})")
        if row.get(f"{name}_error"):
            notes.append(f"{name}: {row[f'{name}_error'][:90]}")
    for lv in levels:
        if row.get(f"mc{lv}_sass_missing"):
            notes.append(f"SASS mc{lv} lacks {','.join(row[f'mc{lv}_sass_missing'])}")
    if row.get("sdpa_backend"):
        notes.append(f"sdpa={row['sdpa_backend']}")
    if row.get("error"):
        notes.append(row["error"][:120])
    return " ".join(cells) + "  " + "; ".join(notes)


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summary(rows: list[dict], levels) -> str:
    """Per family: how many cases, the geometric mean of the best minicomp over the library
    and over Inductor, wrong results and SASS misses."""
    out = ["", "family      cases  best/library  best/inductor  wrong  sass-missing"]
    for family in FAMILIES:
        mine = [r for r in rows if r.get("family") == family]
        if not mine:
            continue
        vs_lib, vs_ind = [], []
        for r in mine:
            best = best_level(r, levels)
            if best is not None:
                vs_lib.append(r.get(f"mc{best}_vs_library"))
                vs_ind.append(r.get(f"mc{best}_vs_inductor"))
        wrong = sum(any(k.endswith("_wrong") for k in r) for r in mine)
        sass = sum(any(r.get(f"mc{lv}_sass_missing") for lv in levels) for r in mine)
        lib, ind = geomean(vs_lib), geomean(vs_ind)
        out.append(
            f"{family:10} {len(mine):6}  {_num(lib, '11.2f')}x  {_num(ind, '12.2f')}x"
            f"  {wrong:5}  {sass:12}"
        )
    return "\n".join(out)
