"""Interleaved rounds, per-round ratios and the noisy flag, with timings planted through a
fake timer (measure.time_rounds' `timer`), so every number is known in advance."""

import statistics

import pytest

from minicomp.bench import measure, report, stats

BACKENDS = ["eager", "inductor", "minicomp-ss0"]


def _planted(times: dict[str, list[float]]):
    """A timer that returns each backend's planted milliseconds in turn and records the
    order of the calls; the 'callables' are the backends' names."""
    left = {name: list(values) for name, values in times.items()}
    calls = []

    def timer(fn, inputs, device):
        calls.append(fn)
        return left[fn].pop(0)

    return timer, calls


def _rows(times: dict[str, list[float]], threshold: float = stats.NOISY_SPREAD) -> dict:
    timer, _ = _planted(times)
    fns = {name: name for name in times}
    rounds = len(next(iter(times.values())))
    samples, errors = measure.time_rounds(fns, (), rounds, "cpu", timer=timer)
    rows = []
    for name in times:
        row = {"model": "gpt2", "dtype": "float32", "batch": 1, **measure.empty_row(name)}
        row.update(status="pass", passed=True, max_rel_err=0.0, tolerance=1e-3)
        rows.append(row)
    measure.record_timings(rows, samples, errors, threshold)
    return {r["backend"]: r for r in rows}


def test_rounds_rotate_the_order():
    timer, calls = _planted({name: [1.0] * 4 for name in BACKENDS})
    samples, errors = measure.time_rounds({b: b for b in BACKENDS}, (), 4, "cpu", timer=timer)
    assert errors == {} and all(len(s) == 4 for s in samples.values())
    e, i, m = BACKENDS
    assert calls == [e, i, m, i, m, e, m, e, i, e, i, m]


def test_a_planted_noisy_cell_is_flagged_with_the_median_of_per_round_ratios():
    # Round 1: a load spike slows eager tenfold. minicomp's rounds swing widely.
    eager = [100.0, 10.0, 12.0, 10.0, 10.0]
    inductor = [50.0, 5.0, 6.0, 5.0, 5.0]  # 2x in every round, spike or not
    minicomp = [10.0, 11.0, 100.0, 1.0, 5.0]
    rows = _rows({"eager": eager, "inductor": inductor, "minicomp-ss0": minicomp})

    ratios = [e / m for e, m in zip(eager, minicomp)]  # 10, 0.909, 0.12, 10, 2
    mc = rows["minicomp-ss0"]
    assert mc["speedup_vs_eager"] == pytest.approx(statistics.median(ratios)) == 2.0
    # Not the mean of the ratios, the ratio of the medians, nor that of the best times.
    assert statistics.mean(ratios) == pytest.approx(4.606, abs=1e-3)
    assert statistics.median(eager) / statistics.median(minicomp) == pytest.approx(1.0)
    assert min(eager) / min(minicomp) == pytest.approx(10.0)
    assert (mc["speedup_vs_eager_min"], mc["speedup_vs_eager_max"]) == (0.12, 10.0)
    assert mc["speedup_vs_eager_q1"] == pytest.approx(10 / 11)
    assert mc["speedup_vs_eager_q3"] == 10.0
    assert mc["speedup_vs_eager_noisy"] is True
    assert mc["latency_ms"] == 10.0 and mc["latency_ms_min"] == 1.0 and mc["repeats"] == 5

    ind = rows["inductor"]
    assert ind["speedup_vs_eager"] == 2.0 and ind["speedup_vs_eager_noisy"] is False
    assert (ind["speedup_vs_eager_q1"], ind["speedup_vs_eager_q3"]) == (2.0, 2.0)
    assert rows["eager"]["speedup_vs_eager"] == 1.0 and ind["speedup_vs_inductor"] == 1.0

    text = report.table(list(rows.values()))
    lines = text.splitlines()
    (line,) = [x for x in lines if x.startswith("gpt2") and "minicomp-ss0" in x]
    assert "2.00x !" in line and "0.909-10.0" in line
    (ind_line,) = [x for x in lines if x.startswith("gpt2") and " inductor " in x]
    assert "!" not in ind_line and "2.00x" in ind_line
    note = " ".join(text[text.index("! noisy:") :].split())  # wrapped at 100 columns
    assert "more than 25% of their median" in note and "gpt2 float32 b1 (minicomp-ss0)" in note


def test_the_threshold_decides_what_is_noisy():
    times = {"eager": [10.0] * 4, "minicomp-ss0": [5.0, 5.0, 4.0, 6.0]}
    spread = stats.Spread.of([10 / t for t in times["minicomp-ss0"]])
    assert 0.1 < spread.relative_iqr < 0.5
    assert _rows(times, threshold=0.5)["minicomp-ss0"]["speedup_vs_eager_noisy"] is False
    assert _rows(times, threshold=0.1)["minicomp-ss0"]["speedup_vs_eager_noisy"] is True
    quiet = report.table(list(_rows(times, threshold=0.5).values()))
    assert "!" not in quiet


def test_a_backend_failing_while_timed_is_an_error_and_the_others_go_on():
    def timer(fn, inputs, device):
        if fn == "minicomp-ss0":
            raise RuntimeError("segfault, nearly")
        return 1.0

    fns = {b: b for b in BACKENDS}
    samples, errors = measure.time_rounds(fns, (), 3, "cpu", timer=timer)
    assert errors == {"minicomp-ss0": "while timed: RuntimeError: segfault, nearly"}
    assert len(samples["eager"]) == len(samples["inductor"]) == 3
    assert samples["minicomp-ss0"] == []


def test_small_ratios_keep_their_digits():
    assert stats.significant(0.043) == "0.0430"
    assert stats.significant(0.00123) == "0.00123"
    assert stats.significant(4.0) == "4.00"
    assert stats.significant(12.34) == "12.3"
    assert stats.significant(1081.2) == "1081"
    rows = _rows({"eager": [1.0] * 3, "minicomp-ss0": [23.25] * 3})  # 0.043x
    assert "0.0430x" in report.table(list(rows.values()))


def test_spread_of_one_value_and_of_none():
    one = stats.Spread.of([3.0])
    assert (one.median, one.q1, one.q3, one.low, one.high) == (3.0,) * 5
    assert one.relative_iqr == 0.0 and not one.noisy()
    with pytest.raises(ValueError):
        stats.Spread.of([])
    assert stats.round_ratios([4.0, 6.0], [2.0, 0.0]) == [2.0]


def test_a_backend_that_compiles_again_while_timed_is_an_error():
    import torch._dynamo.utils

    def timer(fn, inputs, device):
        if fn == "inductor":  # as if a guard failed and Dynamo compiled a new graph
            torch._dynamo.utils.counters["stats"]["unique_graphs"] += 1
        return 1.0

    samples, errors = measure.time_rounds({b: b for b in BACKENDS}, (), 2, "cpu", timer=timer)
    assert errors == {"inductor": "while timed: Dynamo compiled the model again (a guard failed)"}
    assert samples["inductor"] == [] and len(samples["minicomp-ss0"]) == 2
