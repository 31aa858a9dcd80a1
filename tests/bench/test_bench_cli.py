"""`minicomp bench` end to end in a subprocess: the table, every JSON field, the PNG."""

import argparse
import json
import os
import subprocess
import sys

import torch

from minicomp.bench import png, suite
from minicomp.bench.rows import read_rows

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ("gpt2", "vit-b16")
BACKENDS = ("eager", "minicomp-ss0")

# Every field of a result row and the types it may take (None where not measured).
FIELDS = {
    "model": str, "family": str, "size": str, "dtype": str, "batch": int, "device": str,
    "seq": (int, type(None)), "image": (int, type(None)), "backend": str, "status": str,
    "passed": bool, "error": (str, type(None)), "max_rel_err": float, "tolerance": float,
    "latency_ms": float, "latency_ms_min": float, "latency_ms_max": float, "repeats": int,
    "speedup_vs_eager": float, "speedup_vs_inductor": type(None),
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
        "--repeats", "2", "--warmup", "1", "--json", str(out_json), "--chart", str(out_png),
        "--jsonl", str(out_rows),
    ]  # fmt: skip
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    for title in ("backend", "check", "ms", "vs eager", "vs inductor", "compile s", "warm s",
                  "peak MiB", "kernels", "ATen ops"):  # fmt: skip
        assert title in header
    for model in MODELS:
        for backend in BACKENDS:
            row = [line.split() for line in lines if line.startswith(f"{model} ")]
            assert [model, "float32", "1", backend, "ok"] in [r[:5] for r in row]
    assert "bench [" in proc.stderr and "4/4" in proc.stderr  # the progress bar
    assert not os.path.exists(tmp_path / "user-cache")

    document = json.loads(out_json.read_text())
    assert document["schema"] == "minicomp-bench/1"
    meta = document["meta"]
    assert meta["device"] == "cpu" and meta["memory_method"] == "rss-sampled"
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
        assert r["max_rel_err"] <= r["tolerance"] == 1e-3 and r["repeats"] == 2
        assert r["latency_ms_min"] <= r["latency_ms"] <= r["latency_ms_max"]
    eager = {r["model"]: r for r in results if r["backend"] == "eager"}
    for r in results:
        if r["backend"] == "eager":
            assert r["compile_s_cold"] is None and r["kernel_count"] is None
            assert r["speedup_vs_eager"] == 1.0
            continue
        assert r["compile_s_cold"] > 0 and r["compile_s_warm"] > 0
        assert r["graphs"] == 1 and r["kernel_count"] > 0
        assert r["aten_calls"] >= len(r["fallback_ops"]) > 0  # the matmuls, at least
        expected = eager[r["model"]]["latency_ms"] / r["latency_ms"]
        assert abs(r["speedup_vs_eager"] - expected) < 1e-9
    assert {r["seq"] for r in results if r["model"] == "gpt2"} == {32}
    assert {r["image"] for r in results if r["model"] == "vit-b16"} == {32}

    width, height, rows = png.read_png(out_png.read_bytes())
    assert width > 300 and height > 100 and len(rows) == height


def test_defaults_follow_the_device_and_bad_values_fail_in_one_line(capsys):
    from minicomp import cli
    from minicomp.bench import options, runner

    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    settings = runner.settings_from_args(parser.parse_args(["--device", "cpu"]))
    assert settings.backends == ["eager", "inductor", "minicomp-ss0"]
    assert (settings.dtypes, settings.batch, settings.size) == (["float32"], [1], "full")
    assert settings.models == suite.model_names() and settings.json == "minicomp-bench-cpu.json"
    args = ["--device", "cpu", "--batch", "1,16", "--dtypes", "bfloat16", "--json", ""]
    settings = runner.settings_from_args(parser.parse_args(args))
    assert settings.batch == [1, 16] and settings.dtypes == ["bfloat16"] and settings.json == ""

    bad = [
        (["--models", "gpt2,nope"], "unknown model nope; choose from resnet50"),
        (["--backends", "tvm"], "unknown backend tvm; choose from eager"),
        (["--batch", "0"], "batch sizes are positive"),
        (["--repeats", "0"], "--repeats must be at least 1"),
    ]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], "no CUDA device is available"))
    for argv, words in bad:
        assert cli.main(["bench", "--device", "cpu", *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("minicomp: error: ") and words in err and err.count("\n") == 1
