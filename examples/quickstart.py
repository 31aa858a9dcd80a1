"""Quickstart: compile a small PyTorch model with minicomp, check it, time it, explain it."""

import time

import torch

import minicomp


class Classifier(torch.nn.Module):
    """A two-layer MLP with GELU and LayerNorm and a softmax head."""

    def __init__(self, features: int = 256, hidden: int = 1024, classes: int = 10):
        super().__init__()
        self.up = torch.nn.Linear(features, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.nn.functional.gelu(self.up(x)))
        return torch.softmax(self.head(h), dim=-1)


def median_ms(fn, x: torch.Tensor, repeat: int = 50) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[repeat // 2]


def main() -> None:
    torch.manual_seed(0)
    model = Classifier().eval()
    x = torch.randn(64, 256)
    compiled = torch.compile(model, backend="minicomp")

    with torch.no_grad():
        expected = model(x)
        actual = compiled(x)  # the first call compiles
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        print("minicomp matches eager")

        eager_ms, minicomp_ms = median_ms(model, x), median_ms(compiled, x)
        print(f"eager {eager_ms:.3f} ms, minicomp {minicomp_ms:.3f} ms")

        print(minicomp.explain(model, x))


if __name__ == "__main__":
    main()
