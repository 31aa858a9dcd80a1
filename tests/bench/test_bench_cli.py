"""`minicomp bench` end to end: the table and its header, every JSON field, the PNG, the
load warning and the run without matplotlib."""

import argparse
import json
import os
import struct
import subprocess
import sys

import torch

from minicomp.bench import suite
from minicomp.bench.rows import read_rows

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ("gpt2", "vit-b16")
BACKENDS = ("eager", "minicomp-ss0")

# Every field of a result row and the types it may take (None where not measured).
FIELDS = {
    "model": str, "family": str, "size": str, "dtype": str, "batch": int, "device": str,
    "seq": (int, type(None)), "image": (int, type(None)), "backend": str, "status": str,
    "passed": bool, "error": (str, type(None)), "max_rel_err": float, "tolerance": float,
    "latency_ms": float, "latency_ms_min": float, "latency_ms_max": float,
    "latency_ms_q1": float, "latency_ms_q3": float, "repeats": int,
    **{f"speedup_vs_eager{s}": float for s in ("", "_q1", "_q3", "_min", "_max")},
    **{f"speedup_vs_inductor{s}": type(None) for s in ("", "_q1", "_q3", "_min", "_max")},
    "speedup_vs_eager_noisy": bool, "speedup_vs_inductor_noisy": type(None),
    "compile_s_cold": (float, type(None)), "compile_s_warm": (float, type(None)),
    "peak_mem_bytes": int, "memory_method": str, "graphs": (int, type(None)),
    "kernel_count": (int, type(None)), "aten_calls": (int, type(None)),
    "fallback_ops": (dict, type(None)),
}  # fmt: skip


def test_bench_prints_the_table_and_writes_json_and_png(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMP_")}
    env["MINICOMP_CACHE_DIR"] = str(tmp_path / "user-cache")  # the bench must not use it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    out_rows = tmp_path / "rows.jsonl"
    command = [
        sys.executable, "-m", "minicomp", "bench", "--models", ",".join(MODELS),
        "--size", "small", "--backends", ",".join(BACKENDS), "--device", "cpu",
        "--repeats", "3", "--warmup", "1", "--json", str(out_json), "--chart", str(out_png),
        "--jsonl", str(out_rows), "--threads", "1",
    ]  # fmt: skip
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    lines = proc.stdout.splitlines()
    assert lines[0].startswith("minicomp bench on cpu (") and ", 1 thread, " in lines[0]
    assert lines[1].startswith("timing: 3 rounds after 1 warm-up calls")
    header = next(line for line in lines if line.startswith("model "))
    for title in ("backend", "check", "ms", "vs eager", "IQR", "vs inductor", "compile s",
                  "warm s", "peak MiB", "kernels", "ATen ops"):  # fmt: skip
        assert title in header
    for model in MODELS:
        for backend in BACKENDS:
            row = [line.split() for line in lines if line.startswith(f"{model} ")]
            assert [model, "float32", "1", backend, "ok"] in [r[:5] for r in row]
    assert "bench:" not in proc.stderr  # no progress bar: stderr is not a terminal
    assert not os.path.exists(tmp_path / "user-cache")

    document = json.loads(out_json.read_text())
    assert document["schema"] == "minicomp-bench/2"
    meta = document["meta"]
    assert meta["device"] == "cpu" and meta["memory_method"] == "cpu-tensors"
    assert meta["threads"] == 1 and meta["settings"]["threads"] == 1
    assert meta["settings"]["models"] == list(MODELS) and meta["versions"]["torch"]
    results = document["results"]
    assert [(r["model"], r["backend"]) for r in results] == [
        (m, b) for m in MODELS for b in BACKENDS
    ]
    assert read_rows(out_rows) == results  # the same rows, each appended as it was measured
    for r in results:
        assert set(r) == set(FIELDS), set(r) ^ set(FIELDS)
        for name, kind in FIELDS.items():
            assert isinstance(r[name], kind), (r["model"], r["backend"], name, r[name])
        assert r["passed"] is True and r["status"] == "pass" and r["error"] is None
        assert r["max_rel_err"] <= r["tolerance"] == 1e-3 and r["repeats"] == 3
        assert r["latency_ms_min"] <= r["latency_ms_q1"] <= r["latency_ms"]
        assert r["latency_ms"] <= r["latency_ms_q3"] <= r["latency_ms_max"]
        assert r["peak_mem_bytes"] > 0  # at least the output
    for r in results:
        if r["backend"] == "eager":
            assert r["compile_s_cold"] is None and r["kernel_count"] is None
            assert r["speedup_vs_eager"] == 1.0 and r["speedup_vs_eager_noisy"] is False
            continue
        assert r["compile_s_cold"] > 0 and r["compile_s_warm"] > 0
        assert r["graphs"] == 1 and r["kernel_count"] > 0
        assert r["aten_calls"] >= len(r["fallback_ops"]) > 0  # the matmuls, at least
        assert r["speedup_vs_eager_min"] <= r["speedup_vs_eager_q1"] <= r["speedup_vs_eager"]
        assert r["speedup_vs_eager"] <= r["speedup_vs_eager_q3"] <= r["speedup_vs_eager_max"]
    assert {r["seq"] for r in results if r["model"] == "gpt2"} == {32}
    assert {r["image"] for r in results if r["model"] == "vit-b16"} == {32}

    data = out_png.read_bytes()  # matplotlib's (the dev extra installs it)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 600 and height > 400


def test_defaults_follow_the_device_and_bad_values_fail_in_one_line(capsys):
    from minicomp import cli
    from minicomp.bench import machine, options, runner

    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    settings = runner.settings_from_args(parser.parse_args(["--device", "cpu"]))
    assert settings.backends == ["eager", "inductor", "minicomp-ss0"]
    assert (settings.dtypes, settings.batch, settings.size) == (["float32"], [1], "full")
    assert settings.models == suite.model_names() and settings.json == "minicomp-bench-cpu.json"
    assert settings.threads == machine.usable_cores() and settings.max_spread == 0.25
    args = ["--device", "cpu", "--batch", "1,16", "--dtypes", "bfloat16", "--json", ""]
    settings = runner.settings_from_args(parser.parse_args(args))
    assert settings.batch == [1, 16] and settings.dtypes == ["bfloat16"] and settings.json == ""

    bad = [
        (["--models", "gpt2,nope"], "unknown model nope; choose from resnet50"),
        (["--backends", "tvm"], "unknown backend tvm; choose from eager"),
        (["--batch", "0"], "batch sizes are positive"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--max-spread", "0"], "--max-spread must be positive"),
    ]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], "no CUDA device is available"))
    for argv, words in bad:
        assert cli.main(["bench", "--device", "cpu", *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("minicomp: error: ") and words in err and err.count("\n") == 1


def _eager_only(**extra):
    from minicomp.bench.options import Settings

    fields = dict(models=["gpt2"], backends=["eager"], size="small", repeats=2, warmup=1,
                  json="", chart="", progress=False)  # fmt: skip
    return Settings(**{**fields, **extra})


def test_a_loaded_machine_is_warned_about(monkeypatch, capsys):
    from minicomp.bench import machine, runner

    cores = machine.usable_cores()
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 3.5, 1.0, 1.0))
    document = runner.run(_eager_only())
    out = " ".join(capsys.readouterr().out.split())  # the warning wraps at 100 columns
    warning = f"the load average before the run was {cores + 3.5:.1f}, more than the {cores} core"
    assert warning in out and out.index(warning) < out.index(" model ")  # above the table
    assert document["meta"]["load_average"]["start"] == cores + 3.5
    assert len(document["meta"]["warnings"]) == 2  # before and after the run

    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    runner.run(_eager_only())
    assert "warning" not in capsys.readouterr().out
    assert machine.load_warning(None, 2, "now") is None  # an OS without a load average


def test_without_matplotlib_the_table_is_printed_and_the_chart_explained(
    monkeypatch, capsys, tmp_path
):
    from minicomp.bench import chart, runner

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    runner.run(_eager_only(chart=str(tmp_path / "chart.png")))
    out = capsys.readouterr().out
    assert "gpt2" in out and "model " in out
    assert chart.MISSING in out and not (tmp_path / "chart.png").exists()


def test_threads_are_set_for_the_run(monkeypatch):
    from minicomp.bench import runner

    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # restored after the test, as is torch's count
    before = torch.get_num_threads()
    try:
        with open(os.devnull, "w") as devnull:
            document = runner.run(_eager_only(threads=1), out=devnull)
        assert document["meta"]["threads"] == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(before)
