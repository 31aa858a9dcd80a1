"""The number of SMs of the GPU a graph compiles for: a CUDA device's own, or a described one's.

The schedulers size grids by it (enough blocks to fill every SM; split-K splits until they
do). The cuda target asks its device (`device_sm_count`); cuda-emu and a compile without a GPU
take a described device's count (the lens's device table, `lens/devices.py`, which sits above
this layer, so its caller passes `Device.sms`), and `H100_SMS` where none is named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

H100_SMS = 132
"""An H100 SXM's SMs: the count assumed when no device says otherwise (the lens's default
device, `lens.devices.H100`; a test keeps the two equal)."""


def device_sm_count(
    device_index: int | None = None, *, get_properties: Callable[[int], Any] | None = None
) -> int:
    """The SMs of CUDA device `device_index` (the current device when None): its properties'
    `multi_processor_count`. `get_properties` stands in for torch.cuda.get_device_properties."""
    if get_properties is None:
        get_properties = torch.cuda.get_device_properties
    index = torch.cuda.current_device() if device_index is None else device_index
    return int(get_properties(index).multi_processor_count)
