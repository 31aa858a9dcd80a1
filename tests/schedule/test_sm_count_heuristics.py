"""The templates' level-0 heuristics fill the SMs of the GPU a graph compiles for (the
`sm_count` option, resolved from the target when unset: an H100's 132 on cuda-emu): with
fewer SMs, fewer blocks fill the GPU, so larger tiles are kept."""

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.backends.cuda.sm_count import H100_SMS

H = torch.float16


def _mm(m, n, k, dtype):
    return lambda a, b: a @ b, torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)


def _sdpa(b, h, s, d):
    return F.scaled_dot_product_attention, *(torch.randn(b, h, s, d, dtype=H) for _ in range(3))


# (case, the configs chosen on an H100, on 16 SMs)
CASES = {
    "simt": (_mm(512, 512, 256, torch.float32), "32x32x16_t4x4", "128x128x8_t8x8"),
    "tensor cores": (_mm(384, 640, 64, H), "32x64x32_w16x32_s4", "128x128x32_w64x64_s3"),
    "attention": (_sdpa(1, 8, 512, 64), "64x64_s2_qr", "128x64_s2_w32"),
}


def _configs(fn, args, **options):
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": "cuda-emu", **options})
    return [str(c.config) for r in report.records for _, _, c in r.tuning]


@pytest.mark.parametrize("case", CASES)
def test_fewer_sms_keep_larger_tiles_and_an_h100_keeps_its_configs(case):
    (fn, *args), on_h100, on_16 = CASES[case]
    assert _configs(fn, args) == [on_h100]  # unset: cuda-emu's lens device, an H100
    assert _configs(fn, args, sm_count=H100_SMS) == [on_h100]
    assert _configs(fn, args, sm_count=16) == [on_16]
