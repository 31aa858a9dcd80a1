"""Tuning without a GPU: on cuda-emu, search space 1 ranks a template's candidates by the
performance lens's estimate, checks them where the problem is small, stores the ranking apart
from measured records, and explain says the choice came from the model."""

import warnings

import pytest
import torch

from minicomp import config
from minicomp.explain import explain
from minicomp.lens.devices import get_device
from minicomp.schedule.templates import matmul_tc
from minicomp.tune.database import TuningDatabase, default_path
from minicomp.tune.lens_runner import LensRunner


def mm_relu(a, b):
    return torch.relu(a @ b)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """The module's own cache, apart from the suite's (what tuning stores here is inspected):
    the emulator's precompiled headers are built once for all of its tests."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tuned(cache):
    torch.manual_seed(0)
    a, b = torch.randn(64, 96, dtype=torch.float16), torch.randn(96, 80, dtype=torch.float16)
    options = {"target": "cuda-emu", "search_space": 1, "cache_dir": cache, "tune_budget": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback or an untuned notice fails the test
        e = explain(mm_relu, a, b, options=options)
    return e, options, (a, b)


def test_search_space_1_on_cuda_emu_ranks_by_the_lens(tuned):
    e, options, _ = tuned
    ((group, template, choice),) = e.records[0].tuning
    assert template == "matmul_tc" and choice.how == "estimated"
    assert choice.model == "the lens's estimate on H100 SXM" and choice.candidates >= 2
    assert choice.rejected == 0  # small enough to check: every candidate matched
    text = e.report()
    assert "ranked by the lens's estimate on H100 SXM" in text
    assert "estimated, not measured" in text
    # The estimate is stored under the lens's own key, never mistaken for a measurement.
    db = TuningDatabase(default_path(options["cache_dir"]))
    (record,) = db.records()
    assert record.arch == "lens-h100" and record.time_us == pytest.approx(choice.time_us)


def test_the_chosen_config_has_the_lowest_estimate(tuned):
    e, options, (a, b) = tuned
    ((_, _, choice),) = e.records[0].tuning
    record = e.records[0]
    op = next(n for n in record.graph.nodes if hasattr(n, "members"))
    from minicomp.passes.graph.layout import layouts_for
    from minicomp.schedule.templates.problem import matmul_problem

    layouts = layouts_for(record.graph)
    problem = matmul_problem(op, layouts)
    runner = LensRunner(op, layouts, config.resolve(options), get_device("h100"))
    estimates = {}
    # The tuner's candidates: the heuristic's config (here split in 2 inside the kernel, not
    # a level-1 tiling) and the level-1 ones.
    heuristic = matmul_tc.TEMPLATE.heuristic(problem)
    assert heuristic.splits == 2
    for cfg in dict.fromkeys([heuristic, *matmul_tc.TEMPLATE.candidates(problem, 1)]):
        kernel = matmul_tc.TEMPLATE.instantiate(problem, cfg)
        launch = runner.load(kernel, runner.render(kernel))
        estimates[cfg] = launch.estimate(runner.workload(0))
    assert len(set(estimates.values())) > 1  # the lens tells the candidates apart
    assert choice.config == min(estimates, key=estimates.get)
    assert choice.time_us == pytest.approx(min(estimates.values()) * 1e6)


def test_the_compiled_result_matches_eager(tuned):
    _, options, (a, b) = tuned
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.compile(mm_relu, backend="minicomp", options=options)(a, b)
    torch._dynamo.reset()
    torch.testing.assert_close(out, mm_relu(a.float(), b.float()).half(), rtol=2e-2, atol=2e-2)


def test_cost_model_measure_keeps_cuda_emu_at_level_0(cache, monkeypatch):
    from minicomp.tune import tuner

    monkeypatch.setattr(tuner, "_noticed", set())
    a, b = torch.randn(16, 32, dtype=torch.float16), torch.randn(32, 16, dtype=torch.float16)
    options = {"target": "cuda-emu", "search_space": 1, "cost_model": "measure"}
    e = explain(mm_relu, a, b, options={**options, "cache_dir": cache})
    ((_, _, choice),) = e.records[0].tuning
    assert choice.how == "heuristic" and "search space 0" in choice.describe()


def test_explain_with_the_lens_shows_each_kernels_estimate(cache):
    a, b = torch.randn(16, 32, dtype=torch.float16), torch.randn(32, 16, dtype=torch.float16)
    options = {"target": "cuda-emu", "lens": True, "lens_device": "a100"}
    e = explain(mm_relu, a, b, options={**options, "cache_dir": cache})
    (name,) = [k.name for k in e.records[0].kernels]
    estimate = e.records[0].estimates[name]
    assert "us on A100" in estimate and "of roofline" in estimate
    assert f"kernel IR: {name} (estimated {estimate})" in e.ir()
