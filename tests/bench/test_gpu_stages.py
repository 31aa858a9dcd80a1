"""The staged GPU run, rehearsed on the CPU as CI runs it: every stage end to end on cuda-emu
through benchmarks/gpu_run.sh, its files, its rows, the cache carried between stages, and
what a kill leaves behind."""

import os
import signal
import subprocess
import sys
import time

from minicomp.backends.cuda import sass
from minicomp.bench.kernels.families import FAMILIES
from minicomp.bench.rows import read_rows
from minicomp.bench.stages.stage import MAX_FILES
from minicomp.tune import bundle
from minicomp.tune.database import Record, TuningDatabase, default_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMIT = "rehearse"
TAG = f"emu-{time.strftime('%Y-%m-%d', time.gmtime())}-{COMMIT}"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMP_")}
    env.update(PYTHON=sys.executable, MINICOMP_COMMIT=COMMIT)
    return env


def _command(stage: str, tmp_path, *extra: str) -> list[str]:
    return [
        "bash", os.path.join(REPO, "benchmarks", "gpu_run.sh"), stage, "--rehearse",
        "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
        "--carry", str(tmp_path / "carry"), *extra,
    ]  # fmt: skip


def _carried_bundle(tmp_path) -> None:
    """A bundle from an "earlier stage" holding one tuning record, in the carry folder."""
    earlier = str(tmp_path / "earlier-cache")
    record = Record("matmul_tc", "f16[8,8]x[8,8]", "", "sm_90", {"bm": 64}, time_us=1.0)
    TuningDatabase(default_path(earlier)).store(record)
    bundle.write_bundle(earlier, str(tmp_path / "carry" / "kernels-x-cache.tar.gz"))


def _run_stage(stage: str, tmp_path) -> tuple[list[dict], str]:
    _carried_bundle(tmp_path)
    proc = subprocess.run(
        _command(stage, tmp_path), env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    files = sorted(os.listdir(out))
    assert 2 <= len(files) <= MAX_FILES, files
    assert all(f.startswith(f"{stage}-{TAG}") for f in files), files
    rows = read_rows(out / f"{stage}-{TAG}.jsonl")
    assert rows[0]["kind"] == "facts" and rows[0]["stage"] == stage and rows[0]["rehearsal"]
    assert rows[-1] == {**rows[-1], "kind": "end", "status": 0}
    assert not [r for r in rows if r["kind"] == "error"]
    log = (out / f"{stage}-{TAG}.log").read_text()
    assert "imported kernels-x-cache.tar.gz: 1 tuning records" in log
    carried = bundle.read_bundle(str(out / f"{stage}-{TAG}-cache.tar.gz"), str(tmp_path / "next"))
    assert carried["added"] == 1  # the next stage gets what this one was given
    return rows, log


def test_check_stage_rehearsal(tmp_path):
    rows, _ = _run_stage("check", tmp_path)
    (tests,) = [r for r in rows if r["kind"] == "tests"]
    assert tests["counts"].get("passed", 0) > 0 and tests["target"] == "cuda-emu"
    assert set(tests["counts"]) <= {"passed", "skipped"} and not tests["timed_out"]
    sanitizers = [r for r in rows if r["kind"] == "sanitizer"]
    assert [r["tool"].split()[0] for r in sanitizers] == ["memcheck", "racecheck", "synccheck"]
    for r in sanitizers:
        assert r["ok"] and len(r["workloads"]) == 8 and all(r["workloads"].values()), r
    assert (tmp_path / "out" / f"check-{TAG}-tests.jsonl").exists()


def test_kernels_stage_rehearsal(tmp_path):
    rows, _ = _run_stage("kernels", tmp_path)
    cases = [r for r in rows if r["kind"] == "case"]
    expected = [c.label for f in FAMILIES.values() for c in f.rehearsal_cases()]
    assert sorted(r["case"] for r in cases) == sorted(expected)
    for r in cases:
        assert not [k for k in r if k.endswith("error")], r
        for name in ("library", "mc0", "mc1"):
            assert r[f"{name}_rel_err"] <= r["tolerance"] and r[f"{name}_s"] > 0, (name, r)
    if sass.find_tool("cuobjdump"):
        assert all(r["mc0_sass_ok"] for r in cases)
        (f16,) = [r for r in cases if r["family"] == "matmul" and r["dtype"] == "float16"]
        meant = {op for k in f16["mc0_sass"] for op in k["intended"]}
        assert meant == {"HMMA", "LDSM", "LDGSTS"} and f16["mc0_sass"][0]["hmma"] > 0
    assert all(r["sdpa_backend"] == "flash (CPU)" for r in cases if r["family"] == "attention")
    assert [r for r in rows if r["kind"] == "peaks"][0]["float32_tflops"] > 0
    (overhead,) = [r for r in rows if r["kind"] == "overhead"]
    assert overhead["minicomp us"] > 0 and overhead["eager us"] > 0


def test_models_stage_rehearsal(tmp_path):
    rows, _ = _run_stage("models", tmp_path)
    models = [r for r in rows if r["kind"] == "model"]
    assert {(r["model"], r["batch"], r["backend"]) for r in models} >= {
        ("gpt2", 1, backend) for backend in ("eager", "inductor", "minicomp-ss0")
    }
    assert all(r["status"] == "pass" for r in models), [r["error"] for r in models]
    minicomp = [r for r in models if r["backend"] == "minicomp-ss0"]
    assert all(r["aten_calls"] == 0 and r["speedup_vs_inductor"] for r in minicomp)
    assert (tmp_path / "out" / f"models-{TAG}.png").exists()


def test_train_stage_rehearsal(tmp_path):
    rows, _ = _run_stage("train", tmp_path)
    trained = [r for r in rows if r["kind"] == "train"]
    assert {(r["model"], r["backend"]) for r in trained} == {
        (m, b) for m in ("gpt2", "resnet50") for b in ("eager", "inductor", "minicomp-ss0")
    }
    assert all(r["passed"] and r["step_ms"] > 0 for r in trained), trained
    assert all(r["graphs_run_eagerly"] == 0 for r in trained if r["backend"] == "minicomp-ss0")


def test_a_killed_stage_leaves_its_finished_rows_readable(tmp_path):
    rows_file = tmp_path / "out" / f"kernels-{TAG}.jsonl"
    proc = subprocess.Popen(
        _command("kernels", tmp_path),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if rows_file.exists() and any(r["kind"] == "case" for r in read_rows(rows_file)):
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rows = read_rows(rows_file)
    cases = [r for r in rows if r["kind"] == "case"]
    assert rows[0]["kind"] == "facts" and cases and "end" not in {r["kind"] for r in rows}
    assert all("mc0_s" in r and "library_s" in r for r in cases)
    with open(rows_file, "a") as f:
        f.write('{"kind": "case", "case": "cut sh')  # a write the kill cut in half
    assert read_rows(rows_file) == rows
