"""`minicomp profile`: each kernel a model runs, estimated on a named GPU without one.

The model runs once on cuda-emu with the lens option: every launch runs whole and counts a
sample of its blocks (lens/counts.py); NVRTC builds the same source for the device's
architecture for registers, shared memory and spills (and, with cuobjdump installed, SASS
instruction classes); lens/estimate.py turns both into a time per launch. The report is a
table like Nsight Compute's summary, sorted by estimated time, with its assumptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minicomp import config
from minicomp.lens.devices import get_device
from minicomp.lens.profile import Profile, lens_options, profile_session
from minicomp.lens.session import recording


def profile(
    fn: Callable,
    *args: Any,
    device: str = "h100",
    options: dict | None = None,
    sample_only: bool = False,
    **kwargs: Any,
) -> Profile:
    """Compile `fn` with minicomp for cuda-emu as the cuda target would compile it on `device`
    (a key of lens/devices.py: h100, h200, a100), run it once on these (CPU) arguments, and
    estimate every kernel launch on `device`.

    With `sample_only` each launch runs only the blocks it counts: fast on large problems, but
    `fn`'s result is garbage (see lens.session.LensSession)."""
    import torch

    target = get_device(device)
    torch._dynamo.reset()
    opts = {**(options or {}), **lens_options(target)}
    compiled = torch.compile(fn, backend="minicomp", options=opts)
    with recording(sample_only=sample_only) as session:
        compiled(*args, **kwargs)
    torch._dynamo.reset()
    return profile_session(session, target)


def profile_file(script: str, args: list[str], device: str = "h100") -> Profile:
    """Run a Python script with every minicomp compile counted (its torch.compile calls get
    target cuda-emu and the lens); the profile of what ran."""
    import runpy
    import sys

    target = get_device(device)
    saved = sys.argv
    sys.argv = [script, *args]
    try:
        with config.patch(**lens_options(target)), recording() as session:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    return profile_session(session, target)


__all__ = ["Profile", "profile", "profile_file", "profile_session"]
