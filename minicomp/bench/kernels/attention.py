"""scaled_dot_product_attention against PyTorch's own (flash, memory-efficient or cuDNN:
the row records which one SDPA dispatches to).

Prefill: B x H x S x D with Sq = Sk = S, causal and not. Decode: one query against a KV cache
of S keys (not causal: the query sees them all). FLOPs count the two products, 4 B H Sq Sk D,
halved when causal (the masked half need not be computed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from minicomp.bench.kernels.cases import DTYPE_NAMES, Case

PREFILL = ((1, 32, 1024, 128), (8, 16, 2048, 64), (4, 32, 4096, 128))
DECODE = ((8, 32, 4096, 128), (16, 16, 2048, 64))  # B, H, KV length, D; one query each
TOLERANCE = 3e-2
SDPA_NAMES = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "memory-efficient",
    "CUDNN_ATTENTION": "cuDNN",
    "MATH": "math",
}


def sdpa_backend(q, k, v, causal: bool) -> str:
    """Which implementation PyTorch's SDPA dispatches these inputs to (its own choice
    function, the one F.scaled_dot_product_attention consults)."""
    choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal)
    try:
        name = SDPBackend(choice).name
    except ValueError:
        name = f"backend {choice}"
    where = " (CPU)" if q.device.type == "cpu" else ""
    return SDPA_NAMES.get(name, name.lower()) + where


def reference(q, k, v, causal: bool) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D) + mask) V in float32, a few heads at a time (the scores of a
    long sequence would not fit at once)."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    out = torch.empty(b, h, sq, d, device=q.device, dtype=torch.float32)
    mask = None
    if causal:  # top-left aligned, as SDPA's is_causal
        mask = torch.ones(sq, sk, device=q.device, dtype=torch.bool).tril()
    step = max(1, (1 << 28) // (sq * sk * 4))  # heads a slice: at most 256 MiB of scores
    for i in range(b):
        for j in range(0, h, step):
            qs, ks, vs = (t[i, j : j + step].float() for t in (q, k, v))
            scores = qs @ ks.transpose(-1, -2) / d**0.5
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out[i, j : j + step] = torch.softmax(scores, dim=-1) @ vs
    return out


def case(b, h, sq, sk, d, dtype, causal, device, **kw) -> Case:
    """Attention of (b, h, sq, d) queries over (b, h, sk, d) keys and values."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def make() -> tuple:
        q = torch.randn(b, h, sq, d, device=device, dtype=dtype)
        return (q, *(torch.randn(b, h, sk, d, device=device, dtype=dtype) for _ in range(2)))

    size = torch.empty((), dtype=dtype).element_size()
    kind = "decode" if sq == 1 else "prefill"
    name = DTYPE_NAMES[dtype]
    return Case(
        family="attention",
        label=f"{kind} {b}x{h}x{sq}x{sk}x{d}{' causal' if causal else ''} {name}",
        fields={
            "kind": kind,
            "b": b,
            "h": h,
            "sq": sq,
            "sk": sk,
            "d": d,
            "causal": causal,
            "dtype": name,
        },  # fmt: skip
        fn=fn,
        make=make,
        reference=lambda q, k, v: reference(q, k, v, causal),
        flops=4.0 * b * h * sq * sk * d / (2 if causal and sq == sk else 1),
        min_bytes=float((2 * b * h * sq * d + 2 * b * h * sk * d) * size),
        tolerance=TOLERANCE,
        describe_library=lambda inputs: {"sdpa_backend": sdpa_backend(*inputs, causal)},
        **kw,
    )


def gpu_cases(dtypes=(torch.float16, torch.bfloat16), device: str = "cuda") -> list[Case]:
    """The staged run's attention: f16 at head dim 128 (prefill, both masks, and decode) first,
    then head dim 64 and the long sequence, then bf16."""
    out = []
    for dtype in dtypes:
        late = dtype != torch.float16
        for i, (b, h, s, d) in enumerate(PREFILL):
            for causal in (False, True):
                tier = 3 if late else (1 if i == 0 else 2)
                lead = i == 0 and not late and not causal
                out.append(case(b, h, s, s, d, dtype, causal, device, tier=tier, inductor=lead))
        for i, (b, h, s, d) in enumerate(DECODE):
            tier = 3 if late else (1 if i == 0 else 2)
            lead = i == 0 and not late
            out.append(case(b, h, 1, s, d, dtype, False, device, tier=tier, inductor=lead))
    return sorted(out, key=lambda c: c.tier)


def rehearsal_cases(device: str = "cpu") -> list[Case]:
    """Tiny prefill (both masks, a sequence that is not a tile multiple) and decode cases."""
    f16 = torch.float16
    return [
        case(1, 2, 40, 40, 32, f16, False, device, inductor=True),
        case(1, 2, 40, 40, 32, f16, True, device, tier=2),
        case(2, 2, 1, 72, 64, f16, False, device, tier=2),
    ]
