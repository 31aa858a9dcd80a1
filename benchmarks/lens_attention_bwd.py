"""The performance lens on the Hopper attention backward (attention_hopper_bwd) at H100 shapes,
estimated without a GPU: a training step of scaled_dot_product_attention compiled as the cuda
target would compile it on an H100 (sm_90a: the Hopper forward and backward templates), run
on cuda-emu with only the sampled blocks of each launch, each launch estimated by the lens.

    python benchmarks/lens_attention_bwd.py [--shape 4,32,4096,128] [--device h100]

Prints each backward launch (template, estimate, roofline, bound, registers, spills), their
total and its TFLOP/s, counting the backward as 2.5 times the forward's flops (FlashAttention's
convention: 5 of the forward's 2 products, 4 B H Sq Sk D flops, halved when causal), and the
forward's total beside it.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from minicomp.dynamo.backend import recording as recording_records
from minicomp.lens.devices import get_device
from minicomp.lens.profile import lens_options, profile_session
from minicomp.lens.session import recording


def estimate(shape, causal: bool, device: str) -> tuple[list, list]:
    """(forward rows, backward rows): (kernel, template, us, roofline us, bound, regs, spill)
    of each launch of one training step."""
    target = get_device(device)
    b, h, s, d = shape
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.float16).requires_grad_() for _ in range(3))

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    torch._dynamo.reset()
    fn = torch.compile(f, backend="minicomp", options={"search_space": 0, **lens_options(target)})
    records: list = []
    with recording_records(records), recording(sample_only=True) as session:
        out = fn(q, k, v)
        forward_launches = len(session.launches)
        out.backward(torch.randn_like(out))
    estimates = profile_session(session, target).graph.kernels
    rows = []
    for launch, e in zip(session.launches, estimates):
        regs = None if e.resources is None else e.resources.registers
        rows.append(
            (
                launch.function.name,
                launch.function.attrs.template or "auto-scheduled",
                e.time * 1e6,
                e.roofline_time * 1e6,
                e.bound,
                regs,
                e.spill_bytes,
            )
        )
    torch._dynamo.reset()
    return rows[:forward_launches], rows[forward_launches:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4,32,4096,128", help="B,H,S,D")
    parser.add_argument("--device", default="h100")
    args = parser.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    b, h, s, d = shape
    for causal in (False, True):
        start = time.monotonic()
        forward, backward = estimate(shape, causal, args.device)
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        label = f"{b}x{h}x{s}x{s}x{d}{' causal' if causal else ''} float16"
        print(f"{label} ({time.monotonic() - start:.0f} s)")
        print(f"  {'kernel template':44} {'est us':>9} {'roofline':>9} {'bound':>7} regs spill")
        for _, template, us, roof, bound, regs, spill in backward:
            print(f"  {template:44} {us:9.1f} {roof:9.1f} {bound:>7} {regs!s:>4} {spill:5}")
        bwd_us = sum(r[2] for r in backward)
        fwd_us = sum(r[2] for r in forward)
        print(
            f"  backward {bwd_us:.1f} us: {2.5 * flops / bwd_us / 1e6:.0f} TFLOP/s at 2.5x the "
            f"forward's {flops / 1e12:.2f} TFLOP; forward {fwd_us:.1f} us "
            f"({flops / fwd_us / 1e6:.0f} TFLOP/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
