"""Tests of the `minicomp` command: its subcommands run in this process through cli.main (each
subprocess would spend seconds importing torch), the entry points and exit statuses in a real
subprocess."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import pytest

from minicomp import cli, config
from minicomp.backends import cache as build_cache
from minicomp.backends.cpu import compiler
from minicomp.tune.database import Record, TuningDatabase

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _subprocess(*args: str, cache_dir) -> subprocess.CompletedProcess:
    """`python -m ARGS` as a user runs it, with MINICOMP_CACHE_DIR naming ``cache_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMP_")}
    env["MINICOMP_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _minicomp(*args: str, cache_dir) -> subprocess.CompletedProcess:
    """`minicomp ARGS` run in this process with the cache_dir option naming ``cache_dir``: its
    status and what it printed, as a subprocess would give them."""
    out, err = io.StringIO(), io.StringIO()
    with config.patch(cache_dir=str(cache_dir)):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(list(args))
            except SystemExit as stop:  # argparse's --version and usage errors
                status = stop.code
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def test_config_lists_every_option(tmp_path):
    proc = _minicomp("config", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in config.names():
        assert name in proc.stdout
        assert "MINICOMP_" + name.upper() in proc.stdout


def test_cache_stats_and_clear(tmp_path):
    proc = _minicomp("cache", "stats", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.path.join(str(tmp_path), "kernels") in proc.stdout
    assert "libraries: 0" in proc.stdout

    source = "int answer(void) { return 42; }\n"
    path = compiler.compile_c(source, cc="cc", cflags="-fPIC -shared", cache_dir=str(tmp_path))
    size = sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(tmp_path / "kernels")
        for f in files
    )
    proc = _minicomp("cache", "stats", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "libraries: 1" in proc.stdout
    assert f"({size} bytes)" in proc.stdout

    proc = _minicomp("cache", "clear", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "removed 1 libraries" in proc.stdout
    assert not os.path.exists(path)
    assert "libraries: 0" in _minicomp("cache", "stats", cache_dir=tmp_path).stdout


def test_explain_of_a_missing_script_is_one_line(tmp_path):
    proc = _minicomp("explain", str(tmp_path / "absent.py"), cache_dir=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr == f"minicomp: error: no such script: {tmp_path / 'absent.py'}\n"


def test_explain_of_a_script_that_raises_shows_its_traceback_tail(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text("import sys\n\ndef main():\n    raise ValueError(sys.argv[1])\n\nmain()\n")
    assert cli.main(["explain", str(script), "bad input"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"minicomp: error: {script} raised ValueError: bad input\n")
    assert 'fails.py", line 4, in main' in err and "runpy" not in err


def test_explain_runs_a_script_and_summarises_every_graph_it_compiles(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "f = torch.compile(lambda x: torch.softmax(x * 2, -1) + 1, backend='minicomp')\n"
        "with torch.no_grad():\n"
        "    print('result', f(torch.randn(4, int(sys.argv[1]))).shape)\n"
    )
    proc = _minicomp("explain", str(script), "8", cache_dir=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "result torch.Size([4, 8])" in proc.stdout
    assert "3 ATen ops in -> 1 kernels out" in proc.stdout
    assert f"graph 1 of 1: inference, from <lambda> at {script}:3" in proc.stdout
    for field in ("ops in the graph", "kernels out", "calls made to ATen", "compile time"):
        assert f"  {field} " in proc.stdout
    assert "graph breaks: 0" in proc.stdout and "recompiles: 0" in proc.stdout
    assert "graph IR after" not in proc.stdout and "#pragma" not in proc.stdout  # on request


# A script whose function breaks the graph at a print (line 5) and is compiled again for
# another rank: two graphs, then two more.
BREAKING = """\
import torch

def f(x):
    y = x.sin() * 2
    print("graph break")
    return torch.cumsum(y, 0) + 1

g = torch.compile(f, backend="minicomp")
with torch.no_grad():
    g(torch.randn(4))
    g(torch.randn(4, 3))
"""


@pytest.fixture(scope="module")
def breaking_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "breaks.py"
    path.write_text(BREAKING)
    return path


def test_explain_names_the_graph_break_and_counts_recompiles(breaking_script, capsys):
    assert cli.main(["explain", str(breaking_script)]) == 0
    out = capsys.readouterr().out
    assert f'graph breaks: 1\n  {breaking_script}:5 in f\n      print("graph break")\n' in out
    assert "print" in out.split(f"{breaking_script}:5 in f")[1].splitlines()[2]
    assert "recompiles: 2" in out and "rank" in out
    assert "from f (resumed after line 5) at" in out
    assert "unsupported (no lowering): cumsum" in out


def test_explain_pass_prints_that_pass_or_names_the_valid_ones(breaking_script, capsys):
    assert cli.main(["explain", "--pass", "fuse", str(breaking_script)]) == 0
    out = capsys.readouterr().out
    assert out.count("): graph IR after fuse (") == 4
    assert cli.main(["explain", "--pass", "fusion", str(breaking_script)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("minicomp: error: no pass named 'fusion' ran; the passes that ran: ")
    assert "eliminate_dead_code" in err and ", fuse," in err and "Traceback" not in err


def test_explain_source_and_ir_never_repeat_the_runtime_header(breaking_script, capsys):
    from minicomp.backends.cpu.codegen import runtime_header

    assert cli.main(["explain", "--source", "--ir", str(breaking_script)]) == 0
    out = capsys.readouterr().out
    assert out.count("): generated source ====") == 4 and "kernel IR: " in out
    marker = max(runtime_header().splitlines(), key=len)
    assert out.count(marker) <= 1


def test_explain_out_writes_every_stage_as_files(breaking_script, tmp_path, capsys):
    out_dir = tmp_path / "explained"
    assert cli.main(["explain", "--out", str(out_dir), str(breaking_script)]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("wrote ") and f"files under {out_dir}: summary.txt, runtime.h" in last
    graphs = sorted(p.name for p in out_dir.iterdir() if p.is_dir())
    assert graphs == [f"graph-{k}-inference" for k in range(1, 5)]
    for name in graphs:
        folder = out_dir / name
        assert (folder / "aten_graph.py").is_file() and (folder / "graph_ir.txt").is_file()
        assert any((folder / "passes").glob("*-fuse.txt"))
        assert '#include "../runtime.h"' in (folder / "source.c").read_text()
    assert "graph breaks: 1" in (out_dir / "summary.txt").read_text()


# -- `minicomp cache`: the kernel builds and the tuning database ----------------------------


_DAY = 86400.0


def _cache(cache_dir, *args: str) -> subprocess.CompletedProcess:
    """`minicomp cache --cache-dir DIR ARGS`; the cache_dir option names another directory, so
    that the flag has to win."""
    return _minicomp(
        "cache", "--cache-dir", str(cache_dir), *args, cache_dir=str(cache_dir) + "-not-this-one"
    )


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _fails(proc: subprocess.CompletedProcess, *words: str) -> None:
    """The command failed with status 1 and one clear line, not a traceback."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("minicomp: error: ") and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr


def _seed(cache_dir, now=None) -> list[Record]:
    now = time.time() if now is None else now
    records = [
        Record("matmul", "f16[128,64]x[64,32]", "relu(out)", "sm_90", {"bm": 64}, time_us=12.5),
        Record("matmul", "f16[128,64]x[64,32]", "", "sm_80", {"bm": 32}, created=now - 40 * _DAY),
        Record("conv", "f32[8,3,32,32]", "", "sm_90", {"tile": [8, 8]}, version="0.0.1+tuning1"),
    ]
    db = TuningDatabase(os.path.join(str(cache_dir), "tuning.sqlite"))
    for record in records:
        db.store(record)
    return records


def _compile(cache_dir, value: int) -> str:
    """Build one real shared library into the kernel cache; return its build directory."""
    source = f"int answer(void) {{ return {value}; }}\n"
    path = compiler.compile_c(source, cc="cc", cflags="-fPIC -shared", cache_dir=str(cache_dir))
    return os.path.dirname(path)


def _fake_cubin(cache_dir) -> str:
    """A cubin build in the layout nvrtc.py writes (NVRTC itself is not needed to count it)."""
    folder = build_cache.entry_dir(str(cache_dir), "cubins", "ab" + "0" * 62)
    with build_cache.build_dir(str(cache_dir), "fake") as tmp:
        with open(os.path.join(tmp, "kernel.cubin"), "wb") as f:
            f.write(b"\x7fELF" + bytes(1000))
        build_cache.publish(tmp, folder, {"arch": "sm_90", "log": "", "resources": {}})
    return folder


def test_cache_list_show_and_stats(tmp_path):
    records = _seed(tmp_path)
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    for _ in range(2):
        assert db.lookup("matmul", "f16[128,64]x[64,32]", "relu(out)", "sm_90") is not None

    text = _ok(_cache(tmp_path, "list"))
    for record in records:
        assert record.key in text
    assert "3 records, 1 of other minicomp versions" in text
    assert "(minicomp 0.0.1+tuning1)" in text

    listed = json.loads(
        _ok(_cache(tmp_path, "list", "--template", "matmul", "--arch", "sm_90", "--json"))
    )
    assert listed == [db.get(records[0].key).to_json()]

    key = records[0].key
    text = _ok(_cache(tmp_path, "show", key[:6]))
    assert f"key:            {key}" in text and '{"bm": 64}' in text
    assert "hits:           2" in text
    assert json.loads(_ok(_cache(tmp_path, "show", key, "--json"))) == db.get(key).to_json()
    _fails(_cache(tmp_path, "show", "0123456789"), "no tuning record with key", "cache list")

    stats = json.loads(_ok(_cache(tmp_path, "stats", "--json")))
    assert stats["tuning"]["entries"] == 3 and stats["tuning"]["hits"] == 2
    assert stats["tuning"]["templates"] == {"conv": 1, "matmul": 2}
    assert stats["tuning"]["bytes"] >= os.path.getsize(tmp_path / "tuning.sqlite")
    assert stats["kernels"]["libraries"] == 0 and stats["cache_dir"] == str(tmp_path)
    text = _ok(_cache(tmp_path, "stats"))
    assert "entries: 3 (2 of this version" in text and "hits: 2" in text
    assert "templates: conv 1, matmul 2" in text


def test_cache_commands_on_an_empty_cache(tmp_path):
    assert "no tuning records" in _ok(_cache(tmp_path, "list"))
    assert json.loads(_ok(_cache(tmp_path, "list", "--json"))) == []
    _fails(_cache(tmp_path, "show", "abcd"), "no tuning database", "tuning.sqlite")
    _fails(_cache(tmp_path, "export", str(tmp_path / "out.json")), "nothing to export")
    assert not os.path.exists(tmp_path / "tuning.sqlite")  # reading never creates it


def test_cache_clear_keeps_tuning_records_unless_asked(tmp_path):
    _seed(tmp_path)
    library, cubin = _compile(tmp_path, 1), _fake_cubin(tmp_path)
    stats = json.loads(_ok(_cache(tmp_path, "stats", "--json")))["kernels"]
    assert (stats["libraries"], stats["cubins"]) == (1, 1)

    text = _ok(_cache(tmp_path, "clear"))
    assert "removed 1 libraries, 1 cubins" in text
    assert "kept 3 tuning records" in text and "clear --tuning" in text
    assert not os.path.exists(library) and not os.path.exists(cubin)
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    assert len(db.records()) == 3

    library = _compile(tmp_path, 2)
    result = json.loads(_ok(_cache(tmp_path, "clear", "--tuning", "--json")))
    assert result["tuning"]["records"] == 3 and "kernels" not in result
    assert db.records() == [] and os.path.exists(library)

    _seed(tmp_path)
    text = _ok(_cache(tmp_path, "clear", "--all"))
    assert "removed 1 libraries" in text and "removed 3 tuning records" in text
    assert db.records() == [] and not os.path.exists(library)


def test_cache_prune_by_age_then_by_size(tmp_path):
    now = time.time()
    old_build, new_build = _compile(tmp_path, 3), _compile(tmp_path, 4)
    os.utime(old_build, (now - 40 * _DAY, now - 40 * _DAY))
    old_record, *_ = (r for r in _seed(tmp_path) if r.arch == "sm_80")

    text = _ok(_cache(tmp_path, "prune", "--older-than", "30d"))
    assert "removed 1 kernel builds" in text and "removed 1 tuning records" in text
    assert old_record.key in text
    assert not os.path.exists(old_build) and os.path.exists(new_build)
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    assert old_record.key not in {r.key for r in db.records()} and len(db.records()) == 2

    assert "removed 0 kernel builds" in _ok(_cache(tmp_path, "prune", "--max-size", "2G"))
    result = json.loads(_ok(_cache(tmp_path, "prune", "--max-size", "0", "--json")))
    assert result["kernels"]["removed"] == [new_build]
    assert len(result["tuning"]["removed"]) == 2 and db.records() == []
    assert not os.path.exists(new_build)

    _fails(_cache(tmp_path, "prune"), "--older-than", "--max-size")
    _fails(_cache(tmp_path, "prune", "--older-than", "3x"), "bad duration '3x'")
    _fails(_cache(tmp_path, "prune", "--max-size", "lots"), "bad size 'lots'")


def test_cache_export_and_import_between_machines(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    records = _seed(here)
    exported = tmp_path / "sm90.json"
    assert "exported 2 tuning records" in _ok(
        _cache(here, "export", str(exported), "--arch", "sm_90")
    )
    result = json.loads(_ok(_cache(there, "import", str(exported), "--json")))
    assert (result["added"], result["replaced"], result["skipped"]) == (2, 0, 0)
    wanted = [r for r in records if r.arch == "sm_90"]
    assert TuningDatabase(there / "tuning.sqlite").records() == sorted(
        wanted, key=lambda r: (r.template, r.arch, r.signature)
    )
    text = _ok(_cache(there, "import", str(exported)))
    assert "0 added, 0 replaced by newer records, 2 skipped" in text

    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "minicomp-tuning", "format_version": 99, "records": []}')
    _fails(_cache(there, "import", str(bad)), "format version 99", str(bad))
    _fails(_cache(there, "import", str(tmp_path / "missing.json")), "cannot read")


def test_cache_errors_on_a_corrupt_database(tmp_path):
    path = tmp_path / "tuning.sqlite"
    path.write_bytes(b"this is not a database\n" * 200)
    _fails(_cache(tmp_path, "list"), str(path), "corrupt", "minicomp cache clear --tuning")
    proc = _cache(tmp_path, "stats")
    _fails(proc, "corrupt")
    assert "libraries: 0" in proc.stdout  # the kernel part is still reported
    _fails(_cache(tmp_path, "show", "abcd"), "corrupt")
    assert "removed the unreadable tuning database" in _ok(_cache(tmp_path, "clear", "--tuning"))
    assert not path.exists()
    assert json.loads(_ok(_cache(tmp_path, "list", "--json"))) == []


def test_cache_import_of_crafted_json_fails_in_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"records": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _fails(_cache(tmp_path, "import", str(deep)), str(deep), "nested too deeply")
    huge = tmp_path / "huge.json"
    record = {**Record("matmul", "s", "", "sm_90", {"bm": 64}).to_json(), "hits": 2**64}
    export = {"format": "minicomp-tuning", "format_version": 1, "records": [record]}
    huge.write_text(json.dumps(export))
    _fails(_cache(tmp_path, "import", str(huge)), "record 0: bad value for 'hits'")
    assert not os.path.exists(tmp_path / "tuning.sqlite")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("45m", 2700),
        ("12h", 43200),
        ("30d", 30 * _DAY),
        ("2W", 14 * _DAY),
        ("1.5h", 5400),
    ],
)
def test_parse_duration(text, seconds):
    assert cli.parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("100K", 102400),
        ("500M", 500 << 20),
        ("2G", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("64kb", 65536),
    ],
)
def test_parse_size(text, size):
    assert cli.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "3 days"])
def test_parse_duration_refuses_nonsense(text):
    with pytest.raises(cli.CliError, match="bad duration"):
        cli.parse_duration(text)


def test_cache_bundle_carries_tuning_records_and_cubins(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    records = _seed(here)
    cubin = _fake_cubin(here)
    bundle_file = tmp_path / "warm.tar.gz"
    text = _ok(_cache(here, "export", str(bundle_file)))
    assert "bundled 3 tuning records and 1 cubins" in text
    result = json.loads(_ok(_cache(there, "import", str(bundle_file), "--json")))
    assert (result["added"], result["cubins"]) == (3, 1)
    moved = os.path.join(there, os.path.relpath(cubin, here), "kernel.cubin")
    with open(moved, "rb") as f:
        assert f.read() == b"\x7fELF" + bytes(1000)
    assert len(TuningDatabase(there / "tuning.sqlite").records()) == len(records)
    again = json.loads(_ok(_cache(there, "import", str(bundle_file), "--json")))
    assert (again["added"], again["skipped"], again["cubins"]) == (0, 3, 0)

    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(bundle_file.read_bytes()[:200])
    _fails(_cache(tmp_path / "third", "import", str(truncated)), str(truncated))
    _fails(_cache(here, "export", str(bundle_file), "--arch", "sm_90"), "not a bundle")


def _compile_a_graph(cache_dir) -> None:
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    options = {"target": "cpu", "cache_dir": str(cache_dir), "graph_cache": True}
    x = torch.randn(5, 3)
    out = torch.compile(lambda x: torch.tanh(x) + 1, backend="minicomp", options=options)(x)
    assert torch.allclose(out, torch.tanh(x) + 1)


def test_cache_graphs_lists_the_compiled_graphs_and_clear_removes_them(tmp_path):
    assert "no compiled graphs" in _ok(_cache(tmp_path, "graphs"))
    _compile_a_graph(tmp_path)
    (entry,) = json.loads(_ok(_cache(tmp_path, "graphs", "--json")))
    assert (entry["kind"], entry["target"], entry["kernels"]) == ("inference", "cpu", 1)
    text = _ok(_cache(tmp_path, "graphs"))
    assert entry["key"][:16] in text and "1 compiled graph" in text
    assert "compiled graphs: 1" in _ok(_cache(tmp_path, "stats"))

    assert "1 compiled graphs" in _ok(_cache(tmp_path, "clear"))
    assert json.loads(_ok(_cache(tmp_path, "graphs", "--json"))) == []
    _compile_a_graph(tmp_path)
    assert "removed 1 compiled graphs" in _ok(_cache(tmp_path, "clear", "--tuning"))
    assert json.loads(_ok(_cache(tmp_path, "graphs", "--json"))) == []


def test_python_m_minicomp_fails_with_status_1_and_one_line(tmp_path):
    flag, env = tmp_path / "flag", tmp_path / "env"
    proc = _subprocess("minicomp", "cache", "--cache-dir", str(flag), "show", "ab", cache_dir=env)
    _fails(proc, "no tuning database", str(flag / "tuning.sqlite"))
    assert not flag.exists() and not env.exists()


def test_version_names_minicomp_and_torch(tmp_path):
    from importlib import metadata

    proc = _subprocess("minicomp.cli", "--version", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"minicomp {metadata.version('minicomp')} ")
    assert f"torch {metadata.version('torch')}" in proc.stdout


@pytest.mark.parametrize(
    "args, usage",
    [
        (("cache", "prune", "--bogus"), "usage: minicomp cache prune"),
        (("config", "--bogus"), "usage: minicomp config"),
        (("cache", "stats", "--older-than", "1d"), "usage: minicomp cache stats"),
    ],
)
def test_a_subcommand_error_prints_the_subcommand_usage(tmp_path, args, usage):
    proc = _minicomp(*args, cache_dir=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(usage), proc.stderr
    assert "unrecognized arguments" in proc.stderr


def test_cache_stats_names_the_precompiled_headers_and_their_size(tmp_path):
    header = compiler.precompiled_header(
        "static inline int twice(int x) { return 2 * x; }\n",
        cc="cc",
        cflags="-O1",
        cache_dir=str(tmp_path),
    )
    size = sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(tmp_path / "headers")
        for f in files
    )
    stats = json.loads(_ok(_cache(tmp_path, "stats", "--json")))["kernels"]
    assert stats["bytes_by_folder"]["headers"] == size
    assert stats["precompiled_headers"] == int(os.path.exists(header + ".gch"))
    text = _ok(_cache(tmp_path, "stats"))
    assert f"precompiled headers: {tmp_path / 'headers'}" in text
    assert "prelude.h.gch" in text
