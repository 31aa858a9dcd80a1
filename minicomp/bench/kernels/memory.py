"""Memory-bound kernels, where fusion is the whole story: an elementwise chain, a bias + GELU,
softmax and layer norm over rows of several shapes, against PyTorch's eager kernels (one per
op for the chain) and Inductor. Their measure is bandwidth: `min_bytes` counts each input read
and the output written once, and the roofline fraction is the share of the measured copy
bandwidth reached. FLOPs count one operation per output element (a nominal figure).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minicomp.bench.kernels.cases import DTYPE_NAMES, Case

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
ROWS = ((4096, 4096), (32768, 512), (1024, 32768))


def chain(x):
    y = x * 1.7 + 0.3
    y = torch.relu(y) * y - x
    return torch.sqrt(torch.abs(y * 0.5) + 1.0)


def gelu_bias(x, b):
    return F.gelu(x + b, approximate="tanh")


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _case(name, fn, shapes, dtype, device, label, **kw) -> Case:
    def make() -> tuple:
        return tuple(torch.randn(*s, device=device, dtype=dtype) for s in shapes)

    def reference(*inputs):
        return fn(*(t.double() for t in inputs)).float()

    size = torch.empty((), dtype=dtype).element_size()
    out_elements = 1
    for d in shapes[0]:
        out_elements *= d
    elements = sum(torch.Size(s).numel() for s in shapes)
    dtype_name = DTYPE_NAMES[dtype]
    return Case(
        family="memory",
        label=f"{label} {dtype_name}",
        fields={"op": name, "shape": list(shapes[0]), "dtype": dtype_name},
        fn=fn,
        make=make,
        reference=reference,
        flops=float(out_elements),
        min_bytes=float((elements + out_elements) * size),
        tolerance=TOLERANCE[dtype],
        **kw,
    )


def case(op: str, shape: tuple, dtype: torch.dtype, device: str, **kw) -> Case:
    """One memory-bound op ("chain", "gelu_bias", "softmax", "layer_norm") on `shape`."""
    label = f"{op} {'x'.join(map(str, shape))}"
    if op == "chain":
        return _case(op, chain, (shape,), dtype, device, label, **kw)
    if op == "gelu_bias":
        return _case(op, gelu_bias, (shape, shape[-1:]), dtype, device, label, **kw)
    if op == "softmax":
        return _case(op, softmax, (shape,), dtype, device, label, **kw)
    if op == "layer_norm":
        shapes = (shape, shape[-1:], shape[-1:])
        return _case(op, layer_norm, shapes, dtype, device, label, **kw)
    raise ValueError(f"unknown memory-bound op {op!r}")


def gpu_cases(dtypes=(torch.float32, torch.float16), device: str = "cuda") -> list[Case]:
    """The staged run's memory-bound kernels: the chain and a softmax first, then the rest."""
    f32, f16 = torch.float32, torch.float16
    plan = [
        ("chain", (1 << 26,), f16, 1),
        ("softmax", ROWS[0], f32, 1),
        ("chain", (1 << 26,), f32, 2),
        ("gelu_bias", (8192, 4096), f16, 2),
        ("layer_norm", ROWS[0], f32, 2),
        *[(op, rows, f32, 3) for rows in ROWS[1:] for op in ("softmax", "layer_norm")],
    ]
    return [
        case(op, shape, dtype, device, tier=tier, inductor=True)
        for op, shape, dtype, tier in plan
        if dtype in dtypes
    ]


def rehearsal_cases(device: str = "cpu") -> list[Case]:
    """Small shapes (rows that are not a power of two) for the CPU rehearsal."""
    return [
        case("chain", (1000,), torch.float16, device, inductor=True),
        case("layer_norm", (33, 100), torch.float32, device, tier=2),
    ]
