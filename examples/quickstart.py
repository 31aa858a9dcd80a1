"""Quickstart: a block where fusion matters, compiled by minicomp, checked and timed against
eager.

RMSNorm, a gated activation, a residual and a LayerNorm: in eager PyTorch each of its 18
operators reads and writes the whole activation tensor; minicomp fuses them into two loops
(one per reduction) that read it about twice. On the CPU, timed on pinned threads with the
backends interleaved after warm-up:

    python examples/quickstart.py              # what `make demo` runs
    python examples/quickstart.py --explain    # and minicomp's summary of each graph
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import interleaved, pin_threads

import minicomp


class GatedNormBlock(torch.nn.Module):
    """RMSNorm, a SwiGLU-style gate with a residual, LayerNorm, then GELU times a sigmoid."""

    def __init__(self, channels: int = 512):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(channels) + 0.5)
        self.norm = torch.nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
        a, b = h.chunk(2, dim=-1)
        gated = torch.cat([F.silu(a) * b, torch.tanh(b) * a], dim=-1)
        y = self.norm(gated + x)
        return F.gelu(y) * torch.sigmoid(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--shape", type=int, nargs=3, default=[16, 256, 512], metavar="N")
    parser.add_argument("--inductor", action="store_true", help="time TorchInductor too")
    parser.add_argument("--explain", action="store_true", help="print what minicomp did")
    args = parser.parse_args()

    threads = pin_threads(args.threads)
    torch.manual_seed(0)
    model = GatedNormBlock(args.shape[-1]).eval()
    x = torch.randn(*args.shape)
    compiled = torch.compile(model, backend="minicomp")

    with torch.no_grad():
        expected = model(x)
        actual = compiled(x)  # the first call compiles
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
        error = (actual.double() - expected.double()).abs().max().item()
        print(f"minicomp matches eager on a {list(x.shape)} input (max abs error {error:.1e})")

        fns = {"eager": model, "minicomp": compiled}
        if args.inductor:
            fns["inductor"] = torch.compile(model)
        times = interleaved(fns, x, args.rounds)
        print(f"{threads} CPU thread(s), {args.rounds} interleaved rounds after warm-up:")
        for name in fns:
            line = f"  {name:9} {times.median(name):7.2f} ms"
            if name != "eager":
                speedup, low, high = times.speedup("eager", name)
                line += f"  {speedup:.2f}x eager (rounds {low:.2f}x to {high:.2f}x)"
            print(line)

        explanation = minicomp.explain(model, x)
    print(explanation if args.explain else explanation.headline())
    for name, operators in explanation.fused_groups:
        print(f"  {name}: {', '.join(operators)}")
    if not args.explain:
        print("(--explain: where each graph came from, ATen calls and why, compile times)")


if __name__ == "__main__":
    main()
