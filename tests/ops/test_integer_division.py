"""Integer division compiled: a zero divisor raises eager's error, MIN / -1 gives eager's value.

Eager PyTorch raises `RuntimeError: ZeroDivisionError` for an integer division by zero; a
compiled kernel reports it through its error flag and the plan raises the same error. A
kernel that still divided by zero in C would die of SIGFPE, and pytest with it: the tests
that run such divisions run in a child pytest (`test_division_cases_in_a_child_process`), so
that a fault fails that test instead.
"""

import os
import subprocess
import sys

import pytest
import torch
from helpers import compile_minicomp
from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.compiler import compile_graph
from minicomp.dynamo.backend import recording
from minicomp.dynamo.decompositions import decomposition_table
from minicomp.dynamo.importer import import_graph
from minicomp.record import CompileRecord
from minicomp.runtime.cuda_graphs import GraphedPlan, segments

IN_CHILD = os.environ.get("MINICOMP_DIVISION_CHILD") == "1"
in_child = pytest.mark.skipif(
    not IN_CHILD, reason="runs in test_division_cases_in_a_child_process (a fault kills pytest)"
)
in_parent = pytest.mark.skipif(IN_CHILD, reason="runs in the parent pytest")

SIGNED = [torch.int8, torch.int16, torch.int32, torch.int64]
INTS = [*SIGNED, torch.uint8]
OPS = {
    "floor_divide": lambda a, b: a // b,
    "remainder": torch.remainder,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "fmod": torch.fmod,
}
QUOTIENTS = ("floor_divide", "div_floor", "div_trunc")
# More elements than one OpenMP chunk: several threads may set the flag at once.
SHAPE = (64, 129)


def all_ops(a, b):
    return tuple(op(a, b) for op in OPS.values())


def each_op(a, *divisors):
    """Every op of OPS, the i-th dividing `a` by the i-th divisor."""
    return tuple(op(a, b) for op, b in zip(OPS.values(), divisors, strict=True))


def dividends(dtype: torch.dtype) -> torch.Tensor:
    """Fresh random values over the whole range of `dtype`, MIN among them."""
    info = torch.iinfo(dtype)
    wide = torch.randint(info.min, info.max, SHAPE, dtype=dtype)
    small = torch.randint(max(info.min, -50), 50, SHAPE, dtype=dtype)
    a = torch.where(torch.rand(SHAPE) < 0.5, wide, small)
    a.view(-1)[torch.randperm(a.numel())[:50]] = info.min
    a[0, :2] = info.min
    return a


def divisors(dtype: torch.dtype, a: torch.Tensor) -> torch.Tensor:
    """Fresh random nonzero values, mostly small, -1 under some of the MINs of `a`."""
    info = torch.iinfo(dtype)
    b = torch.randint(max(info.min, -9), 10, SHAPE, dtype=dtype)
    wide = torch.randint(info.min, info.max, SHAPE, dtype=dtype)
    b = torch.where(torch.rand(SHAPE) < 0.1, wide, b)
    b[b == 0] = 1
    if dtype.is_signed:
        b[(a == info.min) & (torch.rand(SHAPE) < 0.5)] = -1
        b[0, 0], b[0, 1] = -1, 1
    return b


def eager(op, a: torch.Tensor, b) -> torch.Tensor:
    """Eager's result, computed with MIN / -1 as MIN / 1 (the same value in eager for every op
    here): eager's own trunc division of int32 and int64 faults on MIN / -1."""
    b = torch.as_tensor(b, dtype=a.dtype).expand_as(a)
    return op(a, safe(a, b))


def safe(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`b` with 1 for the -1s under a MIN of `a`."""
    if not a.dtype.is_signed:
        return b
    return torch.where((a == torch.iinfo(a.dtype).min) & (b == -1), torch.ones_like(b), b)


def with_zeros(b: torch.Tensor) -> torch.Tensor:
    """`b` with zeros planted at a few random places."""
    b = b.clone()
    b.view(-1)[torch.randperm(b.numel())[:5]] = 0
    return b


def assert_raises_like_eager(compiled, op, *args) -> None:
    """`compiled(*args)` raises the exception eager's `op(*args)` raises, with its message."""
    with pytest.raises(Exception) as eager_error:
        op(*args)
    with pytest.raises(type(eager_error.value)) as got:
        compiled(*args)
    assert str(got.value) == str(eager_error.value)


# ---- run in the child process: these execute divisions by zero and MIN / -1 ----


@in_child
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_tensor_by_tensor(target, dtype):
    # One graph for every op, each dividing by a divisor of its own: a zero planted in one
    # op's divisor tests that op's check alone.
    compiled = compile_minicomp(each_op, target)
    a = dividends(dtype)
    b = divisors(dtype, a)
    got = compiled(a, *(b.clone() for _ in OPS))
    low = torch.iinfo(dtype).min
    for name, value in zip(OPS, got):
        assert torch.equal(value, eager(OPS[name], a, b)), name
        if dtype.is_signed:
            # MIN / -1 overflows: quotients wrap to MIN, remainders are 0, as in eager.
            assert value[0, :2].tolist() == ([low, low] if name in QUOTIENTS else [0, 0]), name
    for i, name in enumerate(OPS):
        # Zeros among safe divisors: eager checks each element as it divides, and faults on
        # MIN / -1 before it reaches a zero.
        divs = [safe(a, b).clone() for _ in OPS]  # distinct tensors: one graph for all calls
        divs[i] = zeros = with_zeros(divs[i])
        assert_raises_like_eager(compiled, each_op, a, *divs)
        # The error was that call's: the next call, without zeros, succeeds.
        divs[i] = ones = torch.where(zeros == 0, torch.ones_like(zeros), zeros)
        assert torch.equal(compiled(a, *divs)[i], OPS[name](a, ones)), name


@in_child
@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name", OPS)
def test_tensor_by_zero_scalar(target, name, dtype):
    op = OPS[name]
    compiled = compile_minicomp(lambda a: op(a, 0), target)
    assert_raises_like_eager(compiled, lambda a: op(a, 0), dividends(dtype))


@in_child
@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_tensor_by_nonzero_scalars(target, dtype):
    a = dividends(dtype)
    k = int(torch.randint(2, 10, ()))
    scalars = [k, -k, -1] if dtype.is_signed else [k]
    # One graph for every op and scalar.
    got = compile_minicomp(lambda a: [all_ops(a, d) for d in scalars], target)(a)
    for divisor, values in zip(scalars, got, strict=True):
        for name, value in zip(OPS, values):
            assert torch.equal(value, eager(OPS[name], a, divisor)), f"{name}(a, {divisor})"


@in_child
def test_scalar_by_tensor(target):
    b = divisors(torch.int32, dividends(torch.int32))
    for op in (lambda b: 7 // b, lambda b: torch.remainder(-7, b)):
        compiled = compile_minicomp(op, target)
        assert torch.equal(compiled(b), op(b))
        assert_raises_like_eager(compiled, op, with_zeros(b))


@in_child
def test_mixed_widths_promote_then_raise(target):
    a = dividends(torch.int16)
    b = divisors(torch.int64, a.long())
    compiled = compile_minicomp(all_ops, target)
    for value, name in zip(compiled(a, b), OPS):
        assert torch.equal(value, eager(OPS[name], a.long(), b)), name
    assert_raises_like_eager(compiled, all_ops, a, with_zeros(safe(a.long(), b)))


@in_child
def test_empty_tensor_by_zero_raises_nothing(target):
    compiled = compile_minicomp(lambda a, b: a // b, target)
    a = torch.empty(0, 3, dtype=torch.int32)
    assert compiled(a, torch.zeros(3, dtype=torch.int32)).shape == (0, 3)


@in_child
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_float_division_by_zero_stays_ieee(target, dtype):
    a = torch.randn(SHAPE, dtype=dtype) * 10
    a[0, :3] = torch.tensor([0.0, float("inf"), -1.0])
    b = with_zeros(torch.randn(SHAPE, dtype=dtype))
    b[0, :3] = 0.0
    got = compile_minicomp(all_ops, target)(a, b)
    for name, value, want in zip(OPS, got, all_ops(a, b)):
        torch.testing.assert_close(value, want, equal_nan=True, msg=name)


class ReplayGraph:
    """A stand-in CUDA graph, for the CPU: a replay runs again what was captured."""

    def capture(self, fn):
        self.fn = fn

    def replay(self):
        self.fn()


@in_child
def test_cuda_graphs_check_the_flag_after_the_graph(target):
    from minicomp.runtime.plan import CheckErrorFlag, ResetErrorFlag

    def fn(a, b):
        return (a // b * 3,)

    a = torch.randint(-100, 100, SHAPE, dtype=torch.int32)
    b = torch.randint(1, 10, SHAPE, dtype=torch.int32)
    gm = make_fx(fn, decomposition_table=decomposition_table())(a, b)
    options = minicomp.config.resolve({"target": target, "cuda_graphs": False})
    plan = compile_graph(import_graph(gm), options, CompileRecord())
    # The flag's reset replays with the kernel; its check, a read on the host, runs after.
    [(captured, [reset, _]), (eager, [check])] = segments(plan.steps, ["cuda"] * len(plan.slots))
    assert captured and isinstance(reset, ResetErrorFlag)
    assert not eager and isinstance(check, CheckErrorFlag)
    graphed = GraphedPlan(plan, new_graph=ReplayGraph)
    for _ in range(3):  # a warm-up, a capture, a replay
        assert torch.equal(graphed(a, b)[0], fn(a, b)[0])
    assert_raises_like_eager(graphed, fn, a, with_zeros(b))
    assert torch.equal(graphed(a, b)[0], fn(a, b)[0])


# ---- run here: what the kernels and plans look like ----


def _records(fn, *args, target="cpu", dynamic=False):
    records = []
    with recording(records):
        compile_minicomp(fn, target, dynamic=dynamic)(*args)
    return records


@in_parent
def test_only_kernels_dividing_by_runtime_integers_take_the_flag(target):
    from minicomp.ir.error_flag import ERROR_FLAG
    from minicomp.runtime.plan import CheckErrorFlag

    a = torch.randint(-9, 10, SHAPE, dtype=torch.int32)
    b = torch.randint(1, 10, SHAPE, dtype=torch.int32)
    x = torch.randn(SHAPE)
    flagged = _records(lambda a, b: (a * 2) // b + 1, a, b, target=target)
    free = [
        _records(lambda a: (a // 7, a % -3, torch.fmod(a, 5), a // -1), a, target=target),
        _records(lambda x, y: (x // y, x / (y - 1), torch.fmod(x, y)), x, x, target=target),
    ]
    # A dynamic roll divides by its size, unchecked; it reads its shifted positions from an
    # index tensor, whose range check (test_index_bounds.py) takes the flag.
    roll = _records(lambda x: torch.roll(x, 3, 1)[:, ::2] / 3, x, target=target, dynamic=True)
    for record in roll:
        kernels = record.source.split("#endif /* MINICOMP_")[-1]
        assert "mc_checked_fmod" not in kernels and "mc_checked_index" in kernels
    [record] = flagged
    [kernel] = record.kernels
    assert kernel.params[-1] == ERROR_FLAG and "mc_checked_floordiv_i32" in record.source
    assert sum(isinstance(s, CheckErrorFlag) for s in record.plan.steps) == 1
    for records in free:
        for record in records:
            assert all(ERROR_FLAG not in k.params for k in record.kernels)
            assert "error_flag" not in record.source.split("#endif /* MINICOMP_")[-1]
            assert not any(isinstance(s, CheckErrorFlag) for s in record.plan.steps)


@in_parent
def test_generated_cuda_with_the_flag_compiles_with_nvrtc(tmp_path):
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    a = torch.randint(-9, 10, SHAPE, dtype=torch.int64)
    b = torch.randint(1, 10, SHAPE, dtype=torch.int64)
    report = minicomp.explain(all_ops, a, b, options={"target": "cuda-emu", "fallback": "error"})
    [record] = report.records
    for op in ("div", "floordiv", "mod", "fmod"):
        assert f"mc_checked_{op}_i64(" in record.source
    for arch in ("sm_80", "sm_90"):
        binary = nvrtc.compile_cuda(record.source, arch=arch, cache_dir=str(tmp_path))
        assert " warning" not in binary.log, binary.log
        for res in binary.resources.values():
            assert res.spill_stores == 0 and res.stack_bytes == 0


@in_parent
def test_division_cases_in_a_child_process(target):
    env = dict(os.environ, MINICOMP_DIVISION_CHILD="1", MINICOMP_TEST_TARGETS=target)
    env.pop("MINICOMP_TEST_SELECT", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    # A negative code is the signal that killed the child (SIGFPE: -8); faulthandler reports
    # where, innermost frame first, on stderr.
    output = child.stdout[-6000:] + child.stderr[:2000]
    assert child.returncode == 0, f"child pytest exited {child.returncode}:\n{output}"
