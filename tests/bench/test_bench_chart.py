"""The bench chart: matplotlib's PNG, a log speed-up axis centred on 1x, and the message
when matplotlib is missing."""

import struct
import sys

import pytest

from minicomp.bench import chart, measure

BACKENDS = ["eager", "inductor", "minicomp-ss0"]


def _row(model, backend, speedup, status="pass", q=None, noisy=False):
    row = {"model": model, "dtype": "float32", "batch": 1, **measure.empty_row(backend)}
    low, high = q or (speedup, speedup)
    row.update(status=status, passed=status == "pass", speedup_vs_eager=speedup,
               speedup_vs_eager_q1=low, speedup_vs_eager_q3=high,
               speedup_vs_eager_noisy=noisy)  # fmt: skip
    return row


def _rows():
    return [
        _row("gpt2", "eager", 1.0),
        _row("gpt2", "inductor", 2.0, q=(1.8, 2.2)),
        _row("gpt2", "minicomp-ss0", 0.043, q=(0.03, 0.2), noisy=True),
        _row("bert-base", "eager", 1.0),
        _row("bert-base", "inductor", None, status="error"),
        _row("bert-base", "minicomp-ss0", 4.0, q=(3.9, 4.1)),
    ]


def test_the_chart_has_a_log_axis_centred_on_1x():
    pytest.importorskip("matplotlib")
    fig = chart.draw(_rows(), BACKENDS, "test chart")
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    low, high = ax.get_ylim()
    assert low * high == pytest.approx(1.0) and high > 1 / 0.03  # past the lowest whisker
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.get_lines())  # 1x line
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert {"0.1x", "1x", "10x"} <= set(labels)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "gpt2\nfloat32 b1",
        "bert-base\nfloat32 b1",
    ]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["inductor", "minicomp-ss0"]
    texts = [t.get_text() for t in ax.texts]
    assert "0.0430x !" in texts and "4.00x" in texts and "ERROR" in texts
    bars = [p for p in ax.patches if p.get_height() != 0]
    assert len(bars) == 3  # a failed cell draws no bar
    assert {p.get_facecolor() for p in bars if p.get_x() < 0.5} != {bars[0].get_facecolor()}


def test_the_chart_is_written_as_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    chart.write(str(path), _rows(), BACKENDS, "test chart")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 400


def test_without_matplotlib_the_message_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert chart.missing() == chart.MISSING
    assert "pip install 'minicomp[bench]'" in chart.MISSING
