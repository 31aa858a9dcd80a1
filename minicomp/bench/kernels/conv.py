"""ResNet-50's convolutions (torchvision's v1.5: stride on the 3x3) on channels-last inputs,
how one serves it, against torch's conv2d (cuDNN). FLOPs are 2 N K P Q C R S."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minicomp.bench.kernels.cases import DTYPE_NAMES, Case

# (in channels, out channels, input size, kernel, stride, padding)
RESNET50 = (
    (3, 64, 224, 7, 2, 3),
    (64, 64, 56, 1, 1, 0),
    (64, 64, 56, 3, 1, 1),
    (64, 256, 56, 1, 1, 0),
    (256, 64, 56, 1, 1, 0),
    (256, 128, 56, 1, 1, 0),
    (128, 128, 56, 3, 2, 1),
    (128, 512, 28, 1, 1, 0),
    (256, 512, 56, 1, 2, 0),
    (512, 128, 28, 1, 1, 0),
    (128, 128, 28, 3, 1, 1),
    (512, 256, 28, 1, 1, 0),
    (256, 256, 28, 3, 2, 1),
    (256, 1024, 14, 1, 1, 0),
    (512, 1024, 28, 1, 2, 0),
    (1024, 256, 14, 1, 1, 0),
    (256, 256, 14, 3, 1, 1),
    (1024, 512, 14, 1, 1, 0),
    (512, 512, 14, 3, 2, 1),
    (512, 2048, 7, 1, 1, 0),
    (1024, 2048, 14, 1, 2, 0),
    (2048, 512, 7, 1, 1, 0),
    (512, 512, 7, 3, 1, 1),
)
# The layers a tier-1 run measures: the stem, a 3x3 and a 1x1 of the first stage, a late 3x3.
LEAD = (
    (3, 64, 224, 7, 2, 3),
    (64, 64, 56, 3, 1, 1),
    (256, 64, 56, 1, 1, 0),
    (256, 256, 14, 3, 1, 1),
)
TOLERANCE = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 3e-2}


def case(layer: tuple, batch: int, dtype: torch.dtype, device: str, **kw) -> Case:
    """One convolution layer `(c, k, size, r, stride, pad)` over a batch of images."""
    c, k, size, r, stride, pad = layer
    out_size = (size + 2 * pad - r) // stride + 1

    def fn(x, w):
        return F.conv2d(x, w, stride=stride, padding=pad)

    def make() -> tuple:
        cl = torch.channels_last
        x = torch.randn(batch, c, size, size, device=device, dtype=dtype).to(memory_format=cl)
        w = torch.randn(k, c, r, r, device=device, dtype=dtype) / (c * r * r) ** 0.5
        return x, w.to(memory_format=cl)

    def reference(x, w):
        # float32 without TF32 on the GPU (float64 convolutions are slow there).
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            ref_dtype = torch.float64 if x.device.type == "cpu" else torch.float32
            return fn(x.to(ref_dtype), w.to(ref_dtype)).float()

    name = DTYPE_NAMES[dtype]
    size_of = torch.empty((), dtype=dtype).element_size()
    elements = batch * c * size * size + k * c * r * r + batch * k * out_size * out_size
    return Case(
        family="conv",
        label=f"{c}->{k} {size}x{size} k{r} s{stride} b{batch} {name}",
        fields={
            "c": c,
            "k": k,
            "size": size,
            "r": r,
            "stride": stride,
            "pad": pad,
            "batch": batch,
            "dtype": name,
        },  # fmt: skip
        fn=fn,
        make=make,
        reference=reference,
        flops=2.0 * batch * k * out_size * out_size * c * r * r,
        min_bytes=float(elements * size_of),
        tolerance=TOLERANCE[dtype],
        **kw,
    )


def gpu_cases(
    batch: int = 32, dtypes=(torch.float16, torch.bfloat16, torch.float32), device: str = "cuda"
) -> list:
    """The staged run's convolutions: four telling f16 layers first, every other f16 layer
    next, then the lead layers in bf16 and f32."""
    out = []
    for dtype in dtypes:
        for layer in RESNET50:
            lead = layer in LEAD
            if dtype == torch.float16:
                tier = 1 if lead else 2
            elif lead:
                tier = 3
            else:
                continue
            inductor = dtype == torch.float16 and layer == LEAD[1]
            out.append(case(layer, batch, dtype, device, tier=tier, inductor=inductor))
    return sorted(out, key=lambda c: c.tier)


def rehearsal_cases(device: str = "cpu") -> list[Case]:
    """A tiny strided 3x3 in f16 and a 1x1 in f32 for the CPU rehearsal."""
    return [
        case((8, 16, 9, 3, 2, 1), 2, torch.float16, device, inductor=True),
        case((16, 8, 6, 1, 1, 0), 2, torch.float32, device, tier=2),
    ]
