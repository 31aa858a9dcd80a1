"""The worker process: a crash or a hang is the outcome of the case that caused it, and the
next case runs in a fresh process."""

import os

import torch

from minicomp.fuzz.check import CRASH, HANG, PASS
from minicomp.fuzz.program import Case, InputSpec, Program, Ref, Step
from minicomp.fuzz.worker import Worker

PLANTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted.py")
INPUTS = (InputSpec("a", (3,), torch.float32, seed=1),)
WITH_EXP = Program(INPUTS, (Step("v0", "exp", (Ref("a"),)),), ("v0",))
WITH_SIN = Program(INPUTS, (Step("v0", "sin", (Ref("a"),)),), ("v0",))


def test_a_segfault_is_a_crash_and_the_next_case_runs():
    with Worker(compiler=f"{PLANTED}:segfault_on_exp") as worker:
        assert worker.run(Case(WITH_SIN, "cpu")).status == PASS
        crash = worker.run(Case(WITH_EXP, "cpu"))
        after = worker.run(Case(WITH_SIN, "cpu"))
    assert (crash.status, crash.pattern) == (CRASH, "SIGSEGV")
    assert after.status == PASS
    assert worker.starts == 2


def test_a_case_past_the_timeout_is_a_hang():
    with Worker(compiler=f"{PLANTED}:hang_on_exp", timeout=3) as worker:
        # The first case also waits for the child to import torch: give it time.
        worker.timeout = 120
        assert worker.run(Case(WITH_SIN, "cpu")).status == PASS
        worker.timeout = 3
        assert worker.run(Case(WITH_EXP, "cpu")).status == HANG
