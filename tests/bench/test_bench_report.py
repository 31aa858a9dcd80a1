"""The bench's table, its header lines and the JSON writer."""

import json

from minicomp.bench import measure, report

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
    assert "4.00x" in gpt2 and " 2.50 " in gpt2 and " 9 " in gpt2
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


def test_preamble_says_threads_rounds_memory_and_warnings():
    meta = {
        "settings": {"device": "cpu", "size": "small", "repeats": 7, "warmup": 2},
        "device_name": "x86_64", "threads": 1, "cores": 2, "memory_method": "cpu-tensors",
        "warnings": ["warning: the load average before the run was 9.0, more than the 2 cores"],
    }  # fmt: skip
    lines = report.preamble(meta)
    assert max(len(line) for line in lines) <= report.WIDTH
    text = " ".join(" ".join(lines).split())
    assert "on cpu (x86_64), 1 thread, 2 usable cores" in text
    assert "7 rounds after 2 warm-up calls" in text and "rotating order" in text
    assert "median of the per-round ratios" in text and "torch.profiler" in text
    assert lines[-1].startswith("warning: the load average")
