"""A fused kernel that fails to schedule or to compile costs its own ops eager speed, not the
whole graph's: they run as ATen calls inside the plan (with a KernelFallbackWarning), the rest
stays compiled. With fallback="error" the failure raises instead."""

import pytest
import torch
import torch._dynamo

from minicomp import compiler
from minicomp.dynamo.backend import KernelFallbackWarning, recording
from minicomp.ir.graph import ExternOp, FusedOp
from minicomp.targets import TARGETS


def sine_then_cube(x, y):
    return torch.sin(x) * 2, (y + 1) ** 3


def _compile(fn, target, **options):
    torch._dynamo.reset()
    return torch.compile(fn, backend="minicomp", options={"target": target, **options})


def _fail_kernels_with(monkeypatch, name: str, what: str):
    """Make scheduling ("schedule") or building ("build") fail for kernels of ops named so."""
    if what == "schedule":
        schedule = compiler.schedule_group

        def failing_schedule(op, *args, **kwargs):
            if any(name in member for member in op.members):
                raise RuntimeError(f"simulated scheduler failure on {name}")
            return schedule(op, *args, **kwargs)

        monkeypatch.setattr(compiler, "schedule_group", failing_schedule)
        return

    for target in TARGETS.values():

        def failing_build(kernels, *args, build=target.build, **kwargs):
            if any(name in k.name for k in kernels):
                raise RuntimeError(f"simulated compiler crash on {name}")
            return build(kernels, *args, **kwargs)

        monkeypatch.setattr(target, "build", failing_build)


@pytest.mark.parametrize("what", ["schedule", "build"])
def test_a_failing_kernel_runs_its_ops_as_aten_calls(monkeypatch, what, target):
    _fail_kernels_with(monkeypatch, "sin", what)
    x, y = torch.randn(8), torch.randn(8)
    records = []
    with recording(records), pytest.warns(KernelFallbackWarning, match="sin"):
        out = _compile(sine_then_cube, target)(x, y)
    torch.testing.assert_close(out, sine_then_cube(x, y))
    (record,) = records
    assert record.error == ""
    externs = {n.name: n.reason for n in record.graph.nodes if isinstance(n, ExternOp)}
    assert "failed to compile" in externs["sin.default"]
    (kernel,) = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    assert "pow" in "".join(kernel.members), "the healthy kernel is still compiled"


def test_fallback_error_raises_the_kernel_failure(monkeypatch, target):
    _fail_kernels_with(monkeypatch, "sin", "build")
    compiled = _compile(sine_then_cube, target, fallback="error")
    with pytest.raises(Exception, match="simulated compiler crash on sin"):
        compiled(torch.randn(8), torch.randn(8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_signbit_of_halves_runs(dtype, target):
    # GCC 12 crashed vectorising signbit of a converted half; the kernel reads the sign from
    # the raw bits, natively (the suite turns a KernelFallbackWarning into an error).
    def f(x, y):
        return torch.signbit(x), torch.signbit(y * 2) & (x > 0), (x + y).exp()

    compiled = _compile(f, target)
    for n in (64, 64):
        x, y = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
        x[:4] = torch.tensor([0.0, -0.0, float("nan"), -float("nan")], dtype=dtype)
        torch.testing.assert_close(compiled(x, y), f(x, y), equal_nan=True)
