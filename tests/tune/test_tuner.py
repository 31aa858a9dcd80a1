"""Tests of the tuner with fake templates, runners and timers on the CPU, and of its parallel
NVRTC compilation of real generated kernels."""

import dataclasses
import functools
import io
import logging
import math
import os
import subprocess
import sys

import pytest
import torch

from minicomp import config
from minicomp.tune import compile_pool, tuner
from minicomp.tune.database import Record, TuningDatabase, TuningRecordWarning
from minicomp.tune.tuner import Workload, tune


@dataclasses.dataclass(frozen=True)
class Cfg:
    tile: int
    split: tuple = (1, 1)


class FakeTemplate:
    """A matmul "template" whose configs differ only in name; counts what the tuner asks."""

    name = "fake_matmul"

    def __init__(self, tiles=(16, 32, 64, 128)):
        self.tiles = tiles
        self.instantiated = []

    def heuristic(self, problem):
        return Cfg(self.tiles[0])

    def candidates(self, problem, level):
        tiles = self.tiles[:2] if level == 1 else self.tiles
        return [Cfg(t, (t // 16, 1)) for t in tiles]

    def instantiate(self, problem, config):
        self.instantiated.append(config)
        if config.tile < 0:
            raise ValueError("tile must be positive")
        return ("kernel", config)

    def signature(self, problem):
        m, n, k = problem
        return f"f32[{m}x{k}]x[{k}x{n}]"


class FakeRunner:
    """Runs candidate "kernels" as torch.matmul on the CPU. `times` maps a tile to the seconds
    the fake timer reports (each timing advances the fake clock by `cost`); `wrong` tiles
    compute a wrong result."""

    arch = "sm_test"
    l2_bytes = 0

    def __init__(self, problem, times, *, wrong=(), aten_time=None, clock=None, cost=0.0):
        self.problem = problem
        self.times = times
        self.wrong = set(wrong)
        self.clock = clock
        self.cost = cost
        self.loaded = []
        self.rendered = []
        self.timed = []
        self.compile_job = None
        self.aten = None
        if aten_time is not None:
            self.aten = self._launcher(None, aten_time)

    def render(self, kernel):
        self.rendered.append(kernel)
        return f"source of {kernel[1]}"

    def _launcher(self, config, seconds):
        def launch(w: Workload) -> None:
            a, b = w.inputs
            out = a @ b
            if config is not None and config.tile in self.wrong:
                out = out + 1.0
            w.outputs[0].copy_(out)

        launch.seconds = seconds
        launch.config = config
        return launch

    def load(self, kernel, source):
        config = kernel[1]
        self.loaded.append(config)
        return self._launcher(config, self.times[config.tile])

    def workload(self, seed):
        m, n, k = self.problem
        g = torch.Generator().manual_seed(seed)
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        return Workload([a, b], [torch.empty(m, n)])

    def timer(self, launch, workloads):
        launch(workloads[0])
        self.timed.append(launch.config)
        if self.clock is not None:
            self.clock.now += self.cost
        return launch.seconds


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


PROBLEM = (8, 6, 5)
TIMES = {16: 4e-6, 32: 3e-6, 64: 1e-6, 128: 2e-6}


@pytest.fixture
def db(tmp_path):
    return TuningDatabase(tmp_path / "tuning.sqlite")


def _options(**kw):
    kw.setdefault("search_space", 2)
    kw.setdefault("target", "cuda")
    return config.resolve(kw)


def _tune(template, runner, db, **kw):
    options = kw.pop("options", None) or _options()
    return tune(template, PROBLEM, options=options, runner=runner, database=db, **kw)


def test_level_0_picks_the_heuristic_without_building(db):
    template, runner = FakeTemplate(), FakeRunner(PROBLEM, TIMES)
    choice = _tune(template, runner, db, options=_options(search_space=0))
    assert choice == tuner.Choice(Cfg(16), "heuristic")
    assert template.instantiated == [] and runner.loaded == [] and db.records() == []


def test_tuning_picks_the_fastest_and_stores_it(db):
    template, runner = FakeTemplate(), FakeRunner(PROBLEM, TIMES)
    choice = _tune(template, runner, db, fusion="relu")
    assert choice.how == "tuned" and choice.config == Cfg(64, (4, 1))
    assert choice.time_us == pytest.approx(1.0) and not choice.aten
    # The heuristic config is the first candidate: four kernels, each built and timed once.
    assert runner.timed == [Cfg(16), Cfg(32, (2, 1)), Cfg(64, (4, 1)), Cfg(128, (8, 1))]
    assert runner.loaded == runner.timed and choice.candidates == 4
    (record,) = db.records()
    assert (record.template, record.signature, record.fusion, record.arch) == (
        "fake_matmul",
        "f32[8x5]x[5x6]",
        "relu",
        "sm_test",
    )
    assert record.config == {"tile": 64, "split": [4, 1], "_search_space": 2}
    assert record.time_us == pytest.approx(1.0) and record.candidates == 4


def test_a_database_hit_skips_building_every_candidate(db):
    _tune(FakeTemplate(), FakeRunner(PROBLEM, TIMES), db)
    template, runner = FakeTemplate(), FakeRunner(PROBLEM, TIMES)
    choice = _tune(template, runner, db)
    assert choice.how == "database" and choice.config == Cfg(64, (4, 1))
    assert isinstance(choice.config.split, tuple)  # JSON lists made tuples again
    assert template.instantiated == [] and runner.rendered == [] and runner.loaded == []
    assert db.records()[0].hits == 1


@pytest.mark.parametrize(
    "config",
    [{"tile": 4096, "split": [1, 1]}, {"tile": 64, "split": [4, 1], "unroll": 99}, {"tile": "x"}],
    ids=["not-a-candidate", "unknown-field", "wrong-type"],
)
def test_a_crafted_record_is_ignored_and_the_problem_tuned(db, config):
    _tune(FakeTemplate(), FakeRunner(PROBLEM, TIMES), db)
    (record,) = db.records()
    db.store(dataclasses.replace(record, config={**config, "_search_space": 2}))
    template, runner = FakeTemplate(), FakeRunner(PROBLEM, TIMES)
    with pytest.warns(TuningRecordWarning, match="fake_matmul"):
        choice = _tune(template, runner, db)
    assert choice.how == "tuned" and choice.config == Cfg(64, (4, 1))


def test_a_record_of_a_smaller_search_space_is_tuned_again(db):
    template = FakeTemplate()
    small = _tune(template, FakeRunner(PROBLEM, TIMES), db, options=_options(search_space=1))
    assert small.config == Cfg(32, (2, 1))  # level 1 sees tiles 16 and 32 only
    # Level 1 is served by its own record; level 2 searches again and replaces it.
    assert _tune(template, FakeRunner(PROBLEM, TIMES), db, level=1).how == "database"
    full = _tune(template, FakeRunner(PROBLEM, TIMES), db)
    assert full.how == "tuned" and full.config == Cfg(64, (4, 1))
    (record,) = db.records()
    assert record.config["_search_space"] == 2
    assert _tune(template, FakeRunner(PROBLEM, TIMES), db, level=1).config == Cfg(64, (4, 1))


def test_a_wrong_but_fast_candidate_is_rejected(db):
    runner = FakeRunner(PROBLEM, TIMES, wrong={64})
    choice = _tune(FakeTemplate(), runner, db)
    assert choice.config == Cfg(128, (8, 1)) and choice.rejected == 1
    assert Cfg(64, (4, 1)) not in runner.timed


def test_a_candidate_that_fails_to_build_is_dropped(db):
    template = FakeTemplate(tiles=(16, -1, 32))
    choice = _tune(template, FakeRunner(PROBLEM, {16: 2e-6, 32: 1e-6}), db)
    assert choice.config == Cfg(32, (2, 1)) and choice.candidates == 2  # 16 and 32


def test_the_budget_stops_measuring_and_keeps_the_best_so_far(db):
    clock = FakeClock()
    times = {16: 5e-6, 32: 2e-6, 64: 1e-6, 128: 1e-7}
    runner = FakeRunner(PROBLEM, times, clock=clock, cost=10.0)
    choice = _tune(FakeTemplate(), runner, db, options=_options(tune_budget=15), clock=clock)
    # 10 s per measurement, 15 s allowed: the reference (tile 16), then tile 32; tile 64 would
    # start past the budget. The faster 64 and 128 are never measured.
    assert runner.timed == [Cfg(16), Cfg(32, (2, 1))]
    assert choice.config == Cfg(32, (2, 1)) and choice.how == "tuned"
    assert choice.seconds == pytest.approx(20.0)
    assert db.records()[0].tuning_seconds == pytest.approx(20.0)


def test_budget_defaults_per_level():
    assert tuner.budget_seconds(_options(), 1) == 30.0
    assert tuner.budget_seconds(_options(), 2) == 300.0
    assert tuner.budget_seconds(_options(tune_budget=7), 2) == 7.0
    assert tuner.budget_seconds(_options(tune_budget=0), 2) == math.inf


def test_aten_wins_when_it_is_faster(db):
    runner = FakeRunner(PROBLEM, TIMES, aten_time=5e-7)
    choice = _tune(FakeTemplate(), runner, db)
    assert choice.aten and choice.aten_time_us == pytest.approx(0.5)
    assert choice.config == Cfg(64, (4, 1))  # still the best template config
    assert db.records()[0].time_us == pytest.approx(0.5)
    again = _tune(FakeTemplate(), FakeRunner(PROBLEM, TIMES), db)
    assert again.how == "database" and again.aten and again.config == Cfg(64, (4, 1))


def test_aten_loses_when_slower(db):
    choice = _tune(FakeTemplate(), FakeRunner(PROBLEM, TIMES, aten_time=3e-6), db)
    assert not choice.aten and choice.config == Cfg(64, (4, 1))
    assert choice.candidates == 5  # four template kernels and ATen


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def minicomp_log(monkeypatch):
    monkeypatch.setattr(tuner, "_noticed", set())
    handler = _Records()
    logger = logging.getLogger("minicomp")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_without_a_gpu_level_0_with_one_notice(db, minicomp_log):
    template = FakeTemplate()
    options = _options(target="cuda-emu")
    for _ in range(3):
        choice = tune(template, PROBLEM, options=options, runner=None, database=db)
        assert choice == tuner.Choice(Cfg(16), "heuristic")
    assert template.instantiated == [] and db.records() == []
    (line,) = [line for line in minicomp_log if "needs a CUDA GPU" in line]
    assert "cuda-emu" in line and "search_space=2" in line and "\n" not in line
    tuner.notice_untuned("cpu", 1)
    tuner.notice_untuned("cpu", 1)
    assert sum("target cpu" in line for line in minicomp_log) == 1


def test_progress_bar(db, capsys):
    clock = FakeClock()
    runner = FakeRunner(PROBLEM, TIMES, clock=clock, cost=2.0)
    _tune(FakeTemplate(), runner, db, progress=True, clock=clock)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith("tuning fake_matmul f32[8x5]x[5x6] [")
    assert "0/4 measured" not in err and "1/4 measured" in lines[0]
    assert "~6s left" in lines[0] and "best 4.0 us" in lines[0]
    assert "4/4 measured, best 1.0 us, ~0s left" in err
    assert lines[-1] == "tuned fake_matmul f32[8x5]x[5x6]: best 1.0 us (4 candidates, 8.0s)"
    # Quiet by default when stderr is not a terminal.
    _tune(FakeTemplate(), FakeRunner(PROBLEM, TIMES), TuningDatabase(db.path + "2"))
    assert capsys.readouterr().err == ""


def test_progress_bar_redraws_in_place_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    clock, stream = FakeClock(), Terminal()
    bar = tuner.ProgressBar("k", 4, clock.now + 100, clock, enabled=True, stream=stream)
    for done in range(1, 5):
        clock.now += 1
        bar.update(done, 3.0)
    bar.close("best 3.0 us")
    text = stream.getvalue()
    # A tqdm bar, redrawn with carriage returns on one line, then the summary on its own.
    assert text.count("\r") >= 4 and text.count("\n") == 1
    assert "tuning k |" in text and "2/4, measured, best 3.0 us, ~2s left" in text
    assert text.endswith("tuned k: best 3.0 us (4 candidates, 4.0s)\n")


def test_outputs_match_tolerates_rounding_not_errors():
    ref = torch.randn(64, 64, dtype=torch.float16)
    assert tuner.outputs_match(ref.clone(), ref)
    assert tuner.outputs_match((ref.float() * (1 + 1e-3)).half(), ref)
    assert not tuner.outputs_match(ref + 0.5, ref)
    bad = ref.clone()
    bad[3, 4] = float("nan")
    assert not tuner.outputs_match(bad, ref)
    assert tuner.outputs_match(bad, bad.clone())
    assert not tuner.outputs_match(ref.float(), ref)
    ints = torch.arange(10)
    assert tuner.outputs_match(ints.clone(), ints) and not tuner.outputs_match(ints + 1, ints)


def test_the_tuner_compiles_in_a_process_pool(db):
    # int() as the "compiler": a picklable job that fails on some sources.
    class IntRunner(FakeRunner):
        compile_job = int

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.compile_job = int

        def render(self, kernel):
            return "x" if kernel[1].tile == 64 else str(kernel[1].tile)

    runner = IntRunner(PROBLEM, TIMES)
    choice = _tune(FakeTemplate(), runner, db, options=_options(parallel_compile=2))
    assert choice.config == Cfg(128, (8, 1))  # 64 "failed to compile"
    assert Cfg(64, (4, 1)) not in runner.loaded


def test_fusion_signature_ignores_value_names():
    from graph_builder import GraphBuilder
    from schedule_graphs import one_group

    def group(prefix, scale):
        b = GraphBuilder()
        x = b.input(prefix + "x", (4, 8))
        y = b.compute(prefix + "y", (4, 8), lambda i, j: x[i, j] * scale)
        b.output(y)
        return one_group(b.build())

    first = tuner.fusion_signature(group("a", 2.0))
    assert first == tuner.fusion_signature(group("b", 2.0))
    assert first != tuner.fusion_signature(group("a", 3.0))


def test_parallel_compile_of_generated_cuda(tmp_path):
    from graph_builder import GraphBuilder
    from schedule_graphs import one_group

    from minicomp.backends.cuda import nvrtc
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.ir.func import Module
    from minicomp.schedule.cuda import schedule_cuda

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")

    def source(n: int, scale: float) -> str:
        b = GraphBuilder()
        x = b.input("x", (n,))
        y = b.compute("y", (n,), lambda i: x[i] * scale + 1.0)
        b.output(y)
        kernel = schedule_cuda(one_group(b.build()), {"x": (1,), "y": (1,)})
        return render_module(Module(f"k{n}", (kernel,)))

    sources = [source(256, 2.0), source(1000, 3.0), source(4096, 0.5)]
    sources.append(sources[0].replace("__global__", "__global__ not_cuda", 1))
    cache = str(tmp_path / "cache")
    # As the cuda runner's job, it names this process's NVRTC for the workers to build with.
    job = functools.partial(
        nvrtc.compile_cuda, arch="sm_80", cache_dir=cache, library=nvrtc.library_path()
    )
    errors = compile_pool.compile_parallel(job, sources, workers=3)
    assert errors[:3] == [None, None, None]
    assert errors[3] is not None and "CompileError" in errors[3]
    # The workers left the cubins in the disk cache: this process loads them, compiling none.
    nvrtc.clear_memory_cache()
    nvrtc.reset_compile_stats()
    for source in sources[:3]:
        nvrtc.compile_cuda(source, arch="sm_80", cache_dir=cache)
    stats = nvrtc.compile_stats()
    assert stats["disk_hits"] == 3 and stats["compiles"] == 0


def test_a_stored_record_of_another_arch_is_not_used(db):
    db.store(
        Record("fake_matmul", "f32[8x5]x[5x6]", "", "sm_other", {"tile": 16, "_search_space": 2})
    )
    assert _tune(FakeTemplate(), FakeRunner(PROBLEM, TIMES), db).how == "tuned"


# The checkout's root: what `import minicomp` needs first on the path (not the package's own
# folder, whose profile.py would shadow the standard library's, which torch._dynamo imports).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(tuner.__file__)))


def test_compile_workers_do_not_rerun_the_main_script(tmp_path):
    # A user's script without a __main__ guard must not run again in the workers (as it
    # would under multiprocessing's spawn), and a job's prints must not break the protocol.
    script = tmp_path / "user_script.py"
    marker = tmp_path / "ran"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {repr(REPO)})\n"
        f"open({repr(str(marker))}, 'a').write('x')\n"
        "from minicomp.tune import compile_pool\n"
        "errors = compile_pool.compile_parallel(print, ['a', 'b', 'c'], workers=2)\n"
        "bad = compile_pool.compile_parallel(int, ['1', 'x'], workers=2)\n"
        "print('RESULT', errors, bad[0], bad[1].split(':')[0])\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "RESULT [None, None, None] None ValueError" in done.stdout
    assert marker.read_text() == "x"


def test_compile_parallel_stops_at_the_deadline():
    clock = FakeClock()
    errors = compile_pool.compile_parallel(
        int, ["1", "2"], workers=1, deadline=clock.now - 1, clock=clock
    )
    assert errors == [compile_pool.BUDGET_SPENT] * 2


def test_only_static_float_groups_are_measured():
    from graph_builder import GraphBuilder
    from schedule_graphs import one_group

    from minicomp.ir import types as T
    from minicomp.ir.expr import size_var
    from minicomp.passes.graph.layout import layouts_for
    from minicomp.tune.cuda_runner import CudaRunner

    def group(shape, dtype=T.f32, symbol=None):
        b = GraphBuilder()
        if symbol is not None:
            b.symbol(symbol)
        x = b.input("x", shape, dtype)
        y = b.compute("y", shape, lambda i, j: x[i, j] * 2)
        b.output(y)
        g = b.build()
        return one_group(g), layouts_for(g)

    assert CudaRunner.can_measure(*group((4, 8)))
    assert not CudaRunner.can_measure(*group((size_var("s0"), 8), symbol="s0"))
    assert not CudaRunner.can_measure(*group((4, 8), T.i64))


@pytest.mark.gpu
def test_tuning_a_fused_matmul_on_the_gpu(tmp_path):
    options = {
        "search_space": 1,
        "target": "cuda",
        "cache_dir": str(tmp_path),
        "fallback": "error",
        "tune_budget": 120,
    }
    a = torch.randn(256, 192, device="cuda", dtype=torch.float16)
    b = torch.randn(192, 320, device="cuda", dtype=torch.float16)

    def fn(a, b):
        return torch.relu(a @ b) * 0.5

    torch._dynamo.reset()
    out = torch.compile(fn, backend="minicomp", options=options)(a, b)
    torch.testing.assert_close(out, fn(a, b), atol=2e-2, rtol=2e-2)
    db = TuningDatabase(tmp_path / "tuning.sqlite")
    (record,) = db.records()
    assert record.template.startswith("matmul") and record.arch.startswith("sm_")
    assert record.config["_search_space"] == 1 and record.candidates >= 2
    assert record.time_us > 0 and record.tuning_seconds > 0
    # A second compilation finds the record and tunes nothing.
    torch._dynamo.reset()
    out = torch.compile(fn, backend="minicomp", options=options)(a, b)
    torch.testing.assert_close(out, fn(a, b), atol=2e-2, rtol=2e-2)
    assert db.records()[0].hits == 1


class EstimatingRunner(FakeRunner):
    """A runner with a cost model instead of a timer, too large to check its candidates."""

    model = "a fake model"
    verifies = False


def test_a_model_ranks_candidates_unchecked_and_says_so(db):
    runner = EstimatingRunner(PROBLEM, TIMES, wrong=(64,))
    choice = _tune(FakeTemplate(), runner, db)
    # Unchecked, the (wrong) 64 wins on its estimate: a model cannot catch a wrong kernel.
    assert choice.config.tile == 64 and choice.how == "estimated" and choice.rejected == 0
    text = choice.describe()
    assert "ranked by a fake model" in text and "estimated, not measured" in text
    (record,) = db.records()
    assert record.arch == "sm_test" and record.time_us == pytest.approx(1.0)
    again = _tune(FakeTemplate(), EstimatingRunner(PROBLEM, TIMES), db)
    assert again.how == "database" and "a fake model" in again.describe()


def test_a_model_that_can_check_its_candidates_rejects_a_wrong_one(db):
    runner = EstimatingRunner(PROBLEM, TIMES, wrong=(64,))
    runner.verifies = True
    choice = _tune(FakeTemplate(), runner, db)
    assert choice.config.tile == 128 and choice.rejected == 1
