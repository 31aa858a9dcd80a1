"""torch.compile's `mode` reaches the minicomp backend and maps onto its options; tuning
without a GPU falls back to heuristics with one notice."""

import logging

import pytest
import torch

from minicomp import config
from minicomp.dynamo.backend import recording
from minicomp.tune import tuner


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in config.names():
        monkeypatch.delenv("MINICOMP_" + name.upper(), raising=False)
    config.reset()
    torch._dynamo.reset()
    yield
    config.reset()
    torch._dynamo.reset()


def _resolved(**compile_kw) -> config.Options:
    records = []
    x = torch.randn(8)
    with recording(records):
        out = torch.compile(lambda t: t.sin() * 2 + 1, backend="minicomp", **compile_kw)(x)
    torch.testing.assert_close(out, x.sin() * 2 + 1)
    (record,) = records
    assert record.error == ""
    return record.options


@pytest.mark.parametrize(
    ("mode", "search_space", "cuda_graphs"),
    [
        (None, 0, True),
        ("default", 0, True),
        ("reduce-overhead", 0, True),
        ("max-autotune", 2, True),
        ("max-autotune-no-cudagraphs", 2, False),
    ],
)
def test_torch_compile_modes(mode, search_space, cuda_graphs):
    options = _resolved(mode=mode)
    assert (options.search_space, options.cuda_graphs) == (search_space, cuda_graphs)


def test_explicit_options_win_over_the_mode(monkeypatch):
    # torch.compile refuses mode and options together; set/patch and the environment remain.
    with config.patch(search_space=1):
        assert _resolved(mode="max-autotune").search_space == 1
    torch._dynamo.reset()
    monkeypatch.setenv("MINICOMP_CUDA_GRAPHS", "1")
    assert _resolved(mode="max-autotune-no-cudagraphs").cuda_graphs is True
    torch._dynamo.reset()
    assert _resolved(options={"search_space": 1}).search_space == 1


def test_max_autotune_on_the_cpu_says_once_that_it_uses_heuristics(monkeypatch):
    monkeypatch.setattr(tuner, "_noticed", set())
    lines = []
    handler = logging.Handler()
    handler.emit = lambda r: lines.append(r.getMessage())
    logging.getLogger("minicomp").addHandler(handler)
    try:
        with config.patch(graph_cache=False):  # the notice comes from compiling, not a hit
            _resolved(mode="max-autotune")
            torch._dynamo.reset()
            _resolved(mode="max-autotune")
    finally:
        logging.getLogger("minicomp").removeHandler(handler)
    assert len([line for line in lines if "needs a CUDA GPU" in line]) == 1
