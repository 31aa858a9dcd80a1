"""The bench's outputs: the table, the JSON writer, the PNG writer and both chart drawers."""

import json
import struct
import sys

import pytest

from minicomp.bench import measure, png, report

BACKENDS = ["eager", "inductor", "minicomp-ss0"]


def _row(model, backend, ms, status="pass", **extra):
    row = {"model": model, "family": "text-decoder", "size": "small", "dtype": "float16",
           "batch": 1, "device": "cpu", "seq": 32, "image": None,
           **measure.empty_row(backend)}  # fmt: skip
    row.update(status=status, passed=status == "pass", latency_ms=ms, tolerance=1e-2)
    row.update(extra)
    return row


def _rows():
    rows = [
        _row("gpt2", "eager", 10.0, speedup_vs_eager=1.0, max_rel_err=0.0),
        _row("gpt2", "inductor", 5.0, speedup_vs_eager=2.0, max_rel_err=1e-3),
        _row("gpt2", "minicomp-ss0", 2.5, speedup_vs_eager=4.0, max_rel_err=2e-3,
             kernel_count=9, fallback_ops={"mm.default": "no lowering"}),
        _row("bert-base", "eager", 8.0, speedup_vs_eager=1.0, max_rel_err=0.0),
        _row("bert-base", "inductor", None, status="error", error="RuntimeError: boom"),
        _row("bert-base", "minicomp-ss0", 4.0, status="mismatch", max_rel_err=0.5),
    ]  # fmt: skip
    return rows


def test_table_shows_every_cell_and_explains_failures():
    text = report.table(_rows())
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["model", "dtype", "batch", "backend", "check"]
    gpt2 = next(line for line in lines if line.startswith("gpt2") and "minicomp-ss0" in line)
    assert "4.00x" in gpt2 and "2.500" in gpt2 and " 9 " in gpt2
    assert any(line.startswith("bert-base") and "ERROR" in line for line in lines)
    assert any(line.startswith("bert-base") and "MISMATCH" in line for line in lines)
    assert "  bert-base float16 b1 inductor: RuntimeError: boom" in lines
    assert "  bert-base float16 b1 minicomp-ss0: max relative error 0.5 > tolerance 0.01" in lines
    assert "  gpt2 float16: mm.default" in lines
    assert "" in lines[2:8]  # a blank line between the two models


def test_json_writer_creates_the_folder(tmp_path):
    path = tmp_path / "deep" / "out.json"
    report.write_json(str(path), {"schema": report.SCHEMA, "results": _rows()})
    assert json.loads(path.read_text())["results"][2]["kernel_count"] == 9


def test_png_round_trip_and_text():
    canvas = png.Canvas(40, 20)
    canvas.rect(5, 5, 15, 10, (255, 0, 0))
    end = canvas.text(20, 2, "1.5X", (0, 0, 255), scale=1)
    assert end == 20 + 4 * 6
    width, height, rows = png.read_png(canvas.png())
    assert (width, height) == (40, 20)
    assert rows[7][3 * 10 : 3 * 10 + 3] == bytes((255, 0, 0))
    assert rows[4][3 * 10 : 3 * 10 + 3] == bytes((255, 255, 255))
    blue = sum(row.count(bytes((0, 0, 255))) for row in rows)
    assert blue > 20  # "1.5X" drew pixels
    assert all(len(g) == png.GLYPH_H and max(g) < 32 for g in png.FONT.values())
    broken = bytearray(canvas.png())
    broken[40] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        png.read_png(bytes(broken))


def _color_run(rows, color):
    """The longest horizontal run of `color` in each row that has one."""
    runs = []
    pixel = bytes(color)
    for row in rows:
        best = run = 0
        for x in range(0, len(row), 3):
            run = run + 1 if row[x : x + 3] == pixel else 0
            best = max(best, run)
        if best:
            runs.append(best)
    return runs


def test_builtin_chart_draws_bars_proportional_to_speedups(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on the GPU machines
    path = tmp_path / "chart.png"
    assert report.write_chart(str(path), _rows(), BACKENDS, "test chart") == "builtin"
    width, height, rows = png.read_png(path.read_bytes())
    assert width > 500 and height > 150
    colors = report._colors(BACKENDS)
    inductor, minicomp = (
        _color_run(rows, colors["inductor"]),
        _color_run(rows, colors["minicomp-ss0"]),
    )
    # the legend's square is 14 wide; the bars are the long runs: 2x and 4x over eager
    assert max(minicomp) / max(inductor) == pytest.approx(2.0, rel=0.02)
    red = sum(row.count(bytes(report.FAIL_COLOR)) for row in rows)
    assert red > 0  # ERROR and FAIL labels for bert-base


def test_matplotlib_chart(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    assert report.write_chart(str(path), _rows(), BACKENDS, "test chart") == "matplotlib"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 500 and height > 150
