"""Matrix products C[M, N] = A[M, K] @ B[K, N] against torch.matmul (cuBLAS).

Squares from 1024 to 8192, and the products of a 7B LLM's layers (4096 x 11008 up/gate,
11008 x 4096 down, 4096 x 4096 attention) at 1, 16, 128 and 4096 tokens: decode-sized ones
have few output tiles over a long K, which minicomp splits along K. int8 cases are
`torch._int_mm` (int8 x int8 -> int32, cuBLAS's int8 GEMM) with B the transposed view of an
[N, K] weight, as torchao's dynamic quantization passes it; float8 cases are
`torch._scaled_mm` of e4m3fn operands (B likewise the transposed view of an [N, K] weight),
per-tensor scales, a bf16 output (torchao's tensorwise float8 linear); each only when asked
for (--dtypes i8, f8).
"""

from __future__ import annotations

import torch

from minicomp.bench.kernels.cases import DTYPE_NAMES, Case

SQUARE = (1024, 2048, 4096, 8192)
LLM_NK = ((11008, 4096), (4096, 11008), (4096, 4096))
LLM_TOKENS = (1, 16, 128, 4096)
FP8 = torch.float8_e4m3fn
TOLERANCE = {
    torch.float32: 1e-3,
    torch.float16: 3e-2,
    torch.bfloat16: 3e-2,
    torch.int8: 0.0,
    FP8: 3e-2,  # the bf16 output's rounding
}


def scaled_mm_bf16(a, b, scale_a, scale_b):
    """torchao's tensorwise float8 product: a @ b * scale_a * scale_b, in bf16."""
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)


def case(m: int, n: int, k: int, dtype: torch.dtype, device: str, **kw) -> Case:
    """The product of an (m, k) and a (k, n) matrix of random `dtype` numbers (int8: random
    bytes, B K-major, the int32 product exact; float8: B K-major, scales 0.5 and 0.25)."""

    def make() -> tuple:
        if dtype == FP8:
            a = torch.randn(m, k, device=device).to(dtype)
            b = torch.randn(n, k, device=device).to(dtype).t()
            return a, b, torch.tensor(0.5, device=device), torch.tensor(0.25, device=device)
        if dtype == torch.int8:
            a = torch.randint(-128, 128, (m, k), device=device, dtype=dtype)
            return a, torch.randint(-128, 128, (n, k), device=device, dtype=dtype).t()
        a = torch.randn(m, k, device=device, dtype=dtype)
        return a, torch.randn(k, n, device=device, dtype=dtype)

    def reference(a, b, *scales):
        if dtype == FP8:
            return (a.double() @ b.double() * (scales[0] * scales[1]).double()).float()
        if dtype == torch.int8:
            return a.long() @ b.long()  # |sums| < 2^31 for k < 2^17: no wrap-around
        return (a.double() @ b.double()).float()

    name = DTYPE_NAMES[dtype]
    size = torch.empty((), dtype=dtype).element_size()
    out_size = {torch.int8: 4, FP8: 2}.get(dtype, size)
    fn = {torch.int8: torch._int_mm, FP8: scaled_mm_bf16}.get(dtype, torch.matmul)
    return Case(
        family="matmul",
        label=f"{m}x{n}x{k} {name}",
        fields={"m": m, "n": n, "k": k, "dtype": name},
        fn=fn,
        make=make,
        reference=reference,
        flops=2.0 * m * n * k,
        min_bytes=float((m * k + k * n) * size + m * n * out_size),
        tolerance=TOLERANCE[dtype],
        **kw,
    )


def gpu_cases(
    dtypes=(torch.float16, torch.bfloat16, torch.float32), device: str = "cuda"
) -> list[Case]:
    """The staged run's products, most telling first: tier 1 a square and the LLM's
    prefill and decode products in f16, tier 2 the other squares and LLM shapes, tier 3 the
    rest of bf16 and f32; int8 (torch._int_mm) and float8 (torch._scaled_mm) at a decode and
    a square LLM shape, tier 2."""
    f16, bf16, f32, i8 = torch.float16, torch.bfloat16, torch.float32, torch.int8
    plan = [
        (4096, 4096, 4096, f16, 1, True),
        (4096, 11008, 4096, f16, 1, True),
        (16, 4096, 11008, f16, 1, True),
        (4096, 4096, 4096, bf16, 1, False),
        (4096, 4096, 4096, f32, 2, True),
        *[(s, s, s, f16, 2, False) for s in SQUARE if s != 4096],
        *[(t, n, k, f16, 2, False) for t in LLM_TOKENS for n, k in LLM_NK],
        *[(s, s, s, d, 3, False) for d in (bf16, f32) for s in SQUARE if s != 4096],
        *[(t, n, k, bf16, 3, False) for t in LLM_TOKENS for n, k in LLM_NK],
        (16, 4096, 4096, i8, 2, False),
        (4096, 4096, 4096, i8, 2, False),
        (16, 4096, 4096, FP8, 2, False),
        (4096, 4096, 4096, FP8, 2, False),
    ]
    out, seen = [], set()
    for m, n, k, dtype, tier, inductor in plan:
        if dtype in dtypes and (m, n, k, dtype) not in seen:
            seen.add((m, n, k, dtype))
            out.append(case(m, n, k, dtype, device, tier=tier, inductor=inductor))
    return out


def rehearsal_cases(device: str = "cpu") -> list[Case]:
    """Tiny products with odd sizes (every guard path) for the CPU rehearsal."""
    return [
        case(48, 40, 56, torch.float16, device, inductor=True),
        case(33, 17, 40, torch.float32, device, tier=2),
    ]
