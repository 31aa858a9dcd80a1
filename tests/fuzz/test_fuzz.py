"""A bounded fuzzing run, the one CI makes: fixed seeds, cpu and cuda-emu, nothing new found.

A failure here prints the minimal program of each new finding. Fix the bug, or save it as an
xfail regression (`python -m minicomp.fuzz --seed S --programs 1 --save-regressions`, see
docs/fuzz.md); a finding that matches a saved regression's signature does not fail this test.
"""

import pytest

from minicomp.fuzz.cli import finding_text, summary
from minicomp.fuzz.regression import known_signatures
from minicomp.fuzz.session import Session
from minicomp.fuzz.worker import Worker

# About half a minute of fuzzing on two cores: fixed programs, so a regression check of what
# they reach; `python -m minicomp.fuzz` (docs/fuzz.md) is the open-ended search.
SEEDS = range(24)


def test_fuzzing_fixed_seeds_finds_nothing_new(tmp_path):
    fuzzer_bugs = []

    def on_event(kind, value):
        if kind == "internal":
            fuzzer_bugs.append(value)

    with Worker(cache_dir=str(tmp_path / "cache")) as worker:
        session = Session(
            worker,
            ("cpu", "cuda-emu"),
            known=known_signatures(),
            shrink_seconds=60,
            on_event=on_event,
        )
        report = session.run(SEEDS)
    assert not fuzzer_bugs, "\n".join(fuzzer_bugs)
    assert report.cases == 2 * len(SEEDS)
    if report.findings:
        text = "\n\n".join([summary(report)] + [finding_text(f) for f in report.findings])
        pytest.fail(text, pytrace=False)
