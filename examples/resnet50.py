"""ResNet-50 compiled by minicomp, the example of the post that introduced Hidet.

On a GPU: float16, tensor cores and the full search space (`search_space: 2`), checked against
eager with the post's tolerance, then timed against eager. Without a GPU the same model runs
in float32 on the CPU (matmuls and convolutions stay ATen calls there; minicomp fuses what is
around them), and the script says so.

The weights are random (nothing is downloaded): torchvision's ResNet-50 when torchvision is
importable, else the same architecture from `transformers` (ResNetConfig's defaults are
ResNet-50's).

    python examples/resnet50.py                 # batch 1, 224 x 224
    python examples/resnet50.py --image-size 64 --search-space 0
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


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


def median_ms(fn, x: torch.Tensor, repeat: int) -> float:
    """The median time of `fn(x)` in milliseconds (CUDA events on the GPU)."""
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(repeat):
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--search-space", type=int, default=None, help="default: 2 on a GPU, 0 on the CPU"
    )
    parser.add_argument("--repeat", type=int, default=20)
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
        print("no GPU: ResNet-50 in float32 on the CPU (the cpu target, not CUDA)")

    model = resnet50().to(device=device, dtype=dtype).eval()
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device, dtype=dtype)
    options = {"search_space": level, "tensor_cores": True}
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

        eager_ms = median_ms(model, x, args.repeat)
        minicomp_ms = median_ms(model_opt, x, args.repeat)
        print(f"eager    {eager_ms:8.3f} ms")
        print(f"minicomp {minicomp_ms:8.3f} ms  ({eager_ms / minicomp_ms:.2f}x eager)")


if __name__ == "__main__":
    main()
