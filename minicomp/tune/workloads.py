"""Random arguments for the kernels of one fused group, which the tuner's runners launch: the
group's inputs filled with uniform values (random bytes for 8-bit integers), its outputs left
empty, at the graph's strides."""

from __future__ import annotations

import torch

from minicomp.ir import types as T
from minicomp.ir.graph import FusedOp, Value
from minicomp.tune.tuner import Workload

# Integer inputs that are data, never indices (PyTorch indexes with i32 and i64 only): the
# 8-bit operands of _int_mm, random bytes in a workload.
DATA_INTEGERS = (T.i8, T.u8)


def runnable(op: FusedOp, layouts: dict) -> bool:
    """Whether random inputs can run the group: static sizes and strides, float or 8-bit
    integer inputs (an index input holding random values could send a kernel out of
    bounds)."""
    for v in (*op.inputs, *op.outputs):
        if not all(isinstance(d, int) for d in (*v.shape, *layouts[v.name])):
            return False
    return all(v.dtype.is_float or v.dtype in DATA_INTEGERS for v in op.inputs)


def storage_elements(shape, strides) -> int:
    """Elements of the storage a tensor of `shape` and `strides` spans (0 when empty)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0


def random_workload(op: FusedOp, layouts: dict, seed: int, device: torch.device) -> Workload:
    """The group's inputs in [-1, 1) (8-bit integers: any value) and its empty outputs, on
    `device`."""
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
            if random and v.dtype.is_float:
                base.uniform_(-1.0, 1.0, generator=gen)
            elif random:
                low, high = (-128, 128) if v.dtype == T.i8 else (0, 256)
                base.random_(low, high, generator=gen)
        return base.as_strided(v.shape, strides)

    inputs = [tensor(v, True) for v in op.inputs]
    return Workload(inputs, [tensor(v, False) for v in op.outputs])
