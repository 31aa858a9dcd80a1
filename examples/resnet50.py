"""ResNet-50 compiled by minicomp, the example of the post that introduced Hidet.

On a GPU: float16, tensor cores and the full search space (`search_space: 2`), checked against
eager with the post's tolerance, then timed against eager. Without a GPU the same model runs
in float32 on the CPU, with frozen weights (convolutions become oneDNN calls over prepacked
weights with batch norm folded in; minicomp fuses what is around them), on pinned threads,
and the script says so. Eager and minicomp are timed interleaved, round by round, after
warm-up; the speed-up is the median of the per-round ratios.

The weights are random (nothing is downloaded): torchvision's ResNet-50 when torchvision is
importable, else the same architecture from `transformers` (ResNetConfig's defaults are
ResNet-50's).

    python examples/resnet50.py                 # batch 1, 224 x 224
    python examples/resnet50.py --image-size 64 --search-space 0
    python examples/resnet50.py --explain       # and what minicomp did to the graph
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from timing import interleaved, pin_threads

import minicomp


def resnet50() -> torch.nn.Module:
    """ResNet-50 with random weights, from torchvision or else from transformers."""
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None)
    except ImportError:
        pass
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    model = transformers.ResNetForImageClassification(transformers.ResNetConfig())

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(pixel_values=x).logits

    return Logits()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--search-space", type=int, default=None, help="default: 2 on a GPU, 0 on the CPU"
    )
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    parser.add_argument("--explain", action="store_true", help="print what minicomp did")
    args = parser.parse_args()

    torch.manual_seed(0)
    gpu = torch.cuda.is_available()
    if gpu:
        device, dtype = "cuda", torch.float16
        level = 2 if args.search_space is None else args.search_space
        print(f"ResNet-50 in float16 on {torch.cuda.get_device_name()}")
    else:
        device, dtype = "cpu", torch.float32
        level = 0 if args.search_space is None else args.search_space
        threads = pin_threads(args.threads)
        print(
            f"no GPU: ResNet-50 in float32 on the CPU (the cpu target, not CUDA), "
            f"{threads} thread(s), frozen weights"
        )

    model = resnet50().to(device=device, dtype=dtype).eval()
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device, dtype=dtype)
    options = {"search_space": level, "tensor_cores": True, "freeze": not gpu}
    model_opt = torch.compile(model, backend="minicomp", options=options)

    with torch.no_grad():
        start = time.perf_counter()
        actual = model_opt(x)  # the first call compiles (and tunes, at search space 1 and 2)
        compile_s = time.perf_counter() - start
        expected = model(x)
        torch.testing.assert_close(actual=actual, expected=expected, rtol=1e-2, atol=1e-2)
        error = (actual.double() - expected.double()).abs().max().item()
        print(f"matches eager (rtol=1e-2, atol=1e-2); max abs error {error:.3g}")
        print(f"compile: {compile_s:.1f} s at search space {level}")

        times = interleaved({"eager": model, "minicomp": model_opt}, x, args.rounds)
        speedup, low, high = times.speedup("eager", "minicomp")
        print(f"eager    {times.median('eager'):8.3f} ms")
        print(
            f"minicomp {times.median('minicomp'):8.3f} ms  ({speedup:.2f}x eager; "
            f"{args.rounds} interleaved rounds from {low:.2f}x to {high:.2f}x)"
        )
        if args.explain:
            print(minicomp.explain(model, x, options=options))


if __name__ == "__main__":
    main()
