"""Random arguments for the kernels of one fused group, which the tuner's runners launch: the
group's inputs filled with uniform values, its outputs left empty, at the graph's strides."""

from __future__ import annotations

import torch

from minicomp.ir import types as T
from minicomp.ir.graph import FusedOp, Value
from minicomp.tune.tuner import Workload


def runnable(op: FusedOp, layouts: dict) -> bool:
    """Whether random inputs can run the group: static sizes and strides, float inputs (an
    index input holding random values could send a kernel out of bounds)."""
    for v in (*op.inputs, *op.outputs):
        if not all(isinstance(d, int) for d in (*v.shape, *layouts[v.name])):
            return False
    return all(v.dtype.is_float for v in op.inputs)


def storage_elements(shape, strides) -> int:
    """Elements of the storage a tensor of `shape` and `strides` spans (0 when empty)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0


def random_workload(op: FusedOp, layouts: dict, seed: int, device: torch.device) -> Workload:
    """The group's inputs in [-1, 1) and its empty outputs, on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def tensor(v: Value, random: bool) -> torch.Tensor:
        # Filled through its storage: a broadcast input's strides overlap elements.
        strides = layouts[v.name]
        size = storage_elements(v.shape, strides)
        dtype = T.to_torch(v.dtype)
        if random and T.is_float8(v.dtype):  # PyTorch draws no float8 numbers: convert
            base = torch.empty(size, device=device).uniform_(-1.0, 1.0, generator=gen).to(dtype)
        else:
            base = torch.empty(size, dtype=dtype, device=device)
            if random:
                base.uniform_(-1.0, 1.0, generator=gen)
        return base.as_strided(v.shape, strides)

    inputs = [tensor(v, True) for v in op.inputs]
    return Workload(inputs, [tensor(v, False) for v in op.outputs])
