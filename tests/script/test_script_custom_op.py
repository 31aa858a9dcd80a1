"""Script kernels as PyTorch custom ops: eager calls, the fake implementation under dynamo,
backward, misuse, and native lowering (a KernelOp launched by minicomp's plan, no ATen call)
on cuda-emu and cuda, an ATen call on cpu, and the default backend (inductor)."""

import pytest
import torch
import torch._dynamo

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.dynamo.importer import SCRIPT_OP_REASON
from minicomp.ir.expr import Const
from minicomp.ir.graph import ExternOp, KernelOp
from minicomp.runtime.cuda_graphs import capturable
from minicomp.runtime.plan import LaunchStep
from minicomp.script import (
    ScriptError,
    attrs,
    blockIdx,
    dim,
    dynamic_shared_tensor,
    f32,
    i32,
    ptr,
    syncthreads,
    threadIdx,
)
from minicomp.script.custom_op import registered_op

NS = "mctest_customop"


@minicomp.script
def scale_rows(
    x: f32[dim.m, dim.n], s: f32[dim.m], y: f32[dim.m, dim.n], alpha: f32, m: i32, n: i32
):
    attrs.grid_dim = m
    attrs.block_dim = 32
    r = blockIdx.x
    c = threadIdx.x
    while c < n:
        y[r, c] = x[r, c] * s[r] * alpha
        c += 32


def scale_rows_reference(x, s, alpha):
    return x * s[:, None] * alpha


def scale_rows_backward(inputs, outputs, grads):
    x, s, alpha = inputs
    (g,) = grads
    # The gradient of x is the op itself: the backward graph launches the kernel too.
    return scale_rows_op(g, s, alpha), (g * x).sum(1) * alpha


scale_rows_op = minicomp.script.custom_op(
    f"{NS}::scale_rows", scale_rows, outputs=("y",), backward=scale_rows_backward
)


@minicomp.script
def twice(v: f32) -> f32:
    return v * 2.0


@minicomp.script
def double_and_pad(x: f32[dim.n], a: f32[dim.n], b: f32[dim.k], n: i32, k: i32):
    """a = 2x; b = x zero-padded (or cut) to the explicit length k."""
    attrs.grid_dim = (max(n, k) + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        a[i] = twice(x[i])
    if i < k:
        b[i] = x[i] if i < n else 0.0


pad_op = minicomp.script.custom_op(f"{NS}::double_and_pad", double_and_pad, outputs=("a", "b"))


def pad_reference(x, k):
    b = torch.zeros(k, dtype=x.dtype)
    b[: min(k, x.numel())] = x[:k]
    return x * 2, b


def _compile(fn, target, dynamic=False):
    torch._dynamo.reset()
    options = {"target": target, "fallback": "error"}
    return torch.compile(fn, backend="minicomp", options=options, dynamic=dynamic)


def _run_recorded(fn, *args, target, dynamic=False):
    records = []
    with recording(records):
        out = _compile(fn, target, dynamic)(*args)
    return out, records


def _plan(record):
    """The record's Plan (on cuda, the one its CUDA-graph wrapper runs)."""
    return getattr(record.plan, "plan", record.plan)


def _kernel_ops(record):
    return [n for n in record.graph.nodes if isinstance(n, KernelOp)]


def _externs(record):
    return [n for n in record.graph.nodes if isinstance(n, ExternOp)]


def _assert_native(record, op, count=1):
    """The op runs as `count` launches of its kernel, compiled into the graph's module."""
    launches = _kernel_ops(record)
    assert len(launches) == count
    assert {n.function.name for n in launches} == {op.prefix}
    assert not any("scale_rows" in n.name or "double_and_pad" in n.name for n in _externs(record))
    assert f"void {op.prefix}(" in record.source
    assert any(k.name == op.prefix for k in record.kernels)
    plan = _plan(record)
    steps = [s for s in plan.steps if isinstance(s, LaunchStep)]
    assert len(steps) == count
    # A launch is captured in CUDA graphs like minicomp's own kernels.
    assert all(capturable(s, ["cuda"] * len(plan.slots)) for s in steps)


# --- eager ----------------------------------------------------------------------------------


def test_schema_and_registry():
    assert scale_rows_op.schema == "(Tensor x, Tensor s, float alpha) -> Tensor"
    assert pad_op.schema == "(Tensor x, SymInt k) -> (Tensor, Tensor)"
    assert registered_op(torch.ops.mctest_customop.scale_rows.default) is scale_rows_op
    assert registered_op(torch.ops.aten.add.Tensor) is None
    # Registering the same kernel under the same name again gives the same op.
    again = minicomp.script.custom_op(
        f"{NS}::scale_rows", scale_rows, outputs="y", backward=scale_rows_backward
    )
    assert again is scale_rows_op


def test_eager_matches_torch(script_target):
    x, s = torch.randn(6, 45), torch.randn(6)
    expected = scale_rows_reference(x, s, 1.5)
    torch.testing.assert_close(scale_rows_op(x, s, alpha=1.5), expected)
    torch.testing.assert_close(torch.ops.mctest_customop.scale_rows(x, s, 1.5), expected)
    v = torch.randn(10)
    for k in (4, 10, 13):
        a, b = pad_op(v, k)
        ea, eb = pad_reference(v, k)
        torch.testing.assert_close(a, ea)
        torch.testing.assert_close(b, eb)


def test_eager_non_contiguous_input(script_target):
    x, s = torch.randn(40, 5).t(), torch.randn(10)[::2]
    assert not x.is_contiguous() and not s.is_contiguous()
    torch.testing.assert_close(scale_rows_op(x, s, -2.0), scale_rows_reference(x, s, -2.0))


def test_eager_checks_arguments():
    with pytest.raises(ValueError, match="input s: dimension 0 is 4, not 3"):
        scale_rows_op(torch.randn(3, 5), torch.randn(4), 1.0)
    with pytest.raises(ValueError, match="input x must be a torch.float32 tensor"):
        scale_rows_op(torch.randn(3, 5, dtype=torch.float64), torch.randn(3), 1.0)
    with pytest.raises(ValueError, match="input x must have 2 dimensions"):
        scale_rows_op(torch.randn(3), torch.randn(3), 1.0)


def test_backward_eager(script_target):
    x = torch.randn(5, 33, requires_grad=True)
    s = torch.randn(5, requires_grad=True)
    w = torch.randn(5, 33)
    (scale_rows_op(x, s, 0.5) * w).sum().backward()
    xr, sr = x.detach().requires_grad_(), s.detach().requires_grad_()
    (scale_rows_reference(xr, sr, 0.5) * w).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(s.grad, sr.grad)


def test_no_backward_gives_pytorchs_error():
    x = torch.randn(6, requires_grad=True)
    a, _ = pad_op(x, 3)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        a.sum().backward()


@minicomp.script
def copy_rows(x: f32[dim.m, 4], y: f32[dim.m, 4], m: i32):
    attrs.grid_dim = m
    attrs.block_dim = 4
    y[blockIdx.x, threadIdx.x] = x[blockIdx.x, threadIdx.x]


def _no_gradients(inputs, outputs, grads):
    return ()


def test_backward_returning_the_wrong_count_is_an_error():
    op = minicomp.script.custom_op(
        f"{NS}::copy_rows_bad_backward", copy_rows, outputs=("y",), backward=_no_gradients
    )
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="must return 1 gradients"):
        op(x).sum().backward()


# --- misuse ---------------------------------------------------------------------------------


def test_unknown_output_name():
    with pytest.raises(ValueError, match=r"output 'z' is not a tensor parameter of scale_rows"):
        minicomp.script.custom_op(f"{NS}::bad_output", scale_rows, outputs=("z",))
    with pytest.raises(ValueError, match="output 'alpha' is not a tensor parameter"):
        minicomp.script.custom_op(f"{NS}::bad_output", scale_rows, outputs=("alpha",))


def test_every_tensor_an_output():
    with pytest.raises(ValueError, match="needs an input tensor"):
        minicomp.script.custom_op(f"{NS}::no_inputs", scale_rows, outputs=("x", "s", "y"))


def test_name_taken_by_another_kernel():
    with pytest.raises(ValueError, match="already registered"):
        minicomp.script.custom_op(f"{NS}::scale_rows", double_and_pad, outputs=("a", "b"))
    with pytest.raises(ValueError, match="already registered"):
        minicomp.script.custom_op(f"{NS}::scale_rows", scale_rows, outputs=("y",))


def test_pointer_parameters_and_device_functions_are_refused():
    @minicomp.script
    def raw(x: ptr(f32), y: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        y[threadIdx.x] = x[threadIdx.x]

    with pytest.raises(ScriptError, match="parameter x is a raw pointer"):
        minicomp.script.custom_op(f"{NS}::raw", raw, outputs=("y",))
    with pytest.raises(ScriptError, match="twice is a device function"):
        minicomp.script.custom_op(f"{NS}::device", twice, outputs=("v",))
    with pytest.raises(ValueError, match="registers a script kernel"):
        minicomp.script.custom_op(f"{NS}::plain", lambda x: x, outputs=("y",))


# --- torch.compile --------------------------------------------------------------------------


def _surrounded(x, s):
    return torch.relu(scale_rows_op(x * 2, s, 1.5)) + 1


def _surrounded_reference(x, s):
    return torch.relu(scale_rows_reference(x * 2, s, 1.5)) + 1


def test_no_graph_break():
    x, s = torch.randn(4, 9), torch.randn(4)
    torch._dynamo.reset()
    report = torch._dynamo.explain(_surrounded)(x, s)
    assert report.graph_break_count == 0 and report.graph_count == 1
    report = torch._dynamo.explain(lambda v: [t + 1 for t in pad_op(v, 7)])(torch.randn(5))
    assert report.graph_break_count == 0


def test_compiled_natively_between_fused_ops(script_target):
    x, s = torch.randn(6, 50), torch.randn(6)
    compiled, records = _compile(_surrounded, script_target), []
    with recording(records):
        for _ in range(3):  # on cuda: a warm-up run, a capture, a replay
            x, s = torch.randn(6, 50), torch.randn(6)
            torch.testing.assert_close(compiled(x, s), _surrounded_reference(x, s))
    (record,) = records
    if script_target == "cuda":
        assert record.plan.enabled and record.plan.captures == 1
    _assert_native(record, scale_rows_op)
    (launch,) = _kernel_ops(record)
    # x * 2 before and relu + 1 after are minicomp's own kernels, around the launch.
    assert len(record.kernels) == 3
    values = {v.name for n in record.graph.nodes if not isinstance(n, KernelOp) for v in n.outputs}
    assert launch.inputs[0].name in values and launch.outputs[0].name
    text = str(record.graph)
    assert f"# kernel {scale_rows_op.prefix}(x=%" in text and "alpha=1.5" in text


def test_explain_shows_the_launch():
    x, s = torch.randn(3, 8), torch.randn(3)
    report = minicomp.explain(_surrounded, x, s, options={"target": "cuda-emu"})
    text = report.report()
    assert f"kernel IR: {scale_rows_op.prefix}" in text
    assert "mctest_customop.scale_rows.default(%" in text
    assert not any("scale_rows" in name for name in report.fallbacks)


def test_cpu_target_calls_the_op():
    x, s = torch.randn(5, 7), torch.randn(5)
    out, records = _run_recorded(_surrounded, x, s, target="cpu")
    torch.testing.assert_close(out, _surrounded_reference(x, s))
    (record,) = records
    assert not _kernel_ops(record)
    (call,) = [n for n in _externs(record) if "scale_rows" in n.name]
    assert call.reason == SCRIPT_OP_REASON
    assert "op_" not in record.source


def test_two_calls_share_one_kernel(script_target):
    def fn(x, s):
        return scale_rows_op(x, s, 2.0) - scale_rows_op(x.exp(), s, 3.0)

    x, s = torch.randn(4, 20), torch.randn(4)
    out, (record,) = _run_recorded(fn, x, s, target=script_target)
    expected = scale_rows_reference(x, s, 2.0) - scale_rows_reference(x.exp(), s, 3.0)
    torch.testing.assert_close(out, expected)
    _assert_native(record, scale_rows_op, count=2)
    assert record.source.count(f"void {scale_rows_op.prefix}(") == 1


def test_identical_calls_are_computed_once(script_target):
    def fn(x, s):
        return scale_rows_op(x, s, 2.0) * scale_rows_op(x, s, 2.0)

    x, s = torch.randn(4, 20), torch.randn(4)
    out, (record,) = _run_recorded(fn, x, s, target=script_target)
    torch.testing.assert_close(out, scale_rows_reference(x, s, 2.0) ** 2)
    _assert_native(record, scale_rows_op, count=1)


def test_multiple_outputs_explicit_size_and_device_function(script_target):
    def fn(v):
        a, b = pad_op(v.sin(), 13)
        return a + 1, b * 3

    v = torch.randn(9)
    (a, b), (record,) = _run_recorded(fn, v, target=script_target)
    ea, eb = pad_reference(v.sin(), 13)
    torch.testing.assert_close(a, ea + 1)
    torch.testing.assert_close(b, eb * 3)
    _assert_native(record, pad_op)
    # The device function is compiled into the module under the op's name.
    assert f"{pad_op.prefix}__twice(" in record.source


def test_non_contiguous_inputs_are_copied_first(script_target):
    def fn(x, s):
        return scale_rows_op(x, s, 1.0) + 1

    xt, s = torch.randn(30, 6).t(), torch.randn(6)
    out, (record,) = _run_recorded(fn, xt, s, target=script_target)
    torch.testing.assert_close(out, scale_rows_reference(xt, s, 1.0) + 1)
    _assert_native(record, scale_rows_op)
    (launch,) = _kernel_ops(record)
    assert launch.inputs[0].name.endswith("_contiguous")


def test_view_read_by_an_aten_call_and_the_kernel(script_target):
    # cumsum has no lowering: the transpose becomes a strided alias for it, which the kernel
    # must not read as it is.
    def fn(x, s):
        xt = x.t()
        return torch.cumsum(xt, 1) + scale_rows_op(xt, s, 2.0)

    x, s = torch.randn(12, 5), torch.randn(5)
    out, (record,) = _run_recorded(fn, x, s, target=script_target)
    torch.testing.assert_close(out, torch.cumsum(x.t(), 1) + scale_rows_reference(x.t(), s, 2.0))
    _assert_native(record, scale_rows_op)
    (launch,) = _kernel_ops(record)
    assert launch.inputs[0].name.endswith("_contiguous")


def test_symbolic_shapes(script_target):
    records = []
    compiled = _compile(_surrounded, script_target, dynamic=True)
    with recording(records):
        for m, n in ((3, 17), (5, 40), (7, 9)):
            x, s = torch.randn(m, n), torch.randn(m)
            torch.testing.assert_close(compiled(x, s), _surrounded_reference(x, s))
    (record,) = records  # one graph serves every shape
    (launch,) = _kernel_ops(record)
    m, n = launch.args[4:]  # x, s, y, alpha, m, n
    assert not isinstance(m, Const) and not isinstance(n, Const)
    assert "m=" in str(record.graph) and "m=i32(" not in str(record.graph)


def test_symbolic_explicit_size(script_target):
    def fn(v, k: int):
        a, b = pad_op(v, k)
        return a, b + 1

    compiled = _compile(fn, script_target, dynamic=True)
    for n, k in ((6, 9), (11, 4)):
        v = torch.randn(n)
        a, b = compiled(v, k)
        ea, eb = pad_reference(v, k)
        torch.testing.assert_close(a, ea)
        torch.testing.assert_close(b, eb + 1)


def test_backward_compiled_natively(script_target):
    def fn(x, s, w):
        return (torch.tanh(scale_rows_op(x, s, 0.5)) * w).sum()

    x, s, w = torch.randn(4, 21), torch.randn(4), torch.randn(4, 21)
    xr, sr = x.clone().requires_grad_(), s.clone().requires_grad_()
    (torch.tanh(scale_rows_reference(xr, sr, 0.5)) * w).sum().backward()
    xc, sc = x.clone().requires_grad_(), s.clone().requires_grad_()
    out, records = _run_recorded(fn, xc, sc, w, target=script_target)
    with recording(records):
        out.backward()
    torch.testing.assert_close(xc.grad, xr.grad)
    torch.testing.assert_close(sc.grad, sr.grad)
    forward, backward = records
    assert (forward.kind, backward.kind) == ("forward", "backward")
    _assert_native(forward, scale_rows_op)
    _assert_native(backward, scale_rows_op)  # the backward formula calls the op again


@minicomp.script
def smem_reverse(x: f32[dim.n], y: f32[dim.n], n: i32):
    attrs.grid_dim = (n + 31) // 32
    attrs.block_dim = 32
    attrs.dynamic_smem = 128
    tile = dynamic_shared_tensor(f32, (32,))
    i = blockIdx.x * 32 + threadIdx.x
    tile[threadIdx.x] = x[i] if i < n else 0.0
    syncthreads()
    j = blockIdx.x * 32 + 31 - threadIdx.x
    if j < n:
        y[j] = tile[threadIdx.x]


def test_dynamic_shared_memory_launches_natively(script_target):
    op = minicomp.script.custom_op(f"{NS}::smem_reverse", smem_reverse, outputs=("y",))
    x = torch.randn(64)
    out, (record,) = _run_recorded(lambda x: op(x) + 1, x, target=script_target)
    torch.testing.assert_close(out, x.view(2, 32).flip(1).reshape(64) + 1)
    _assert_native(record, op)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_default_backend():
    x, s = torch.randn(3, 6), torch.randn(3)
    torch._dynamo.reset()
    compiled = torch.compile(_surrounded)
    torch.testing.assert_close(compiled(x, s), _surrounded_reference(x, s))
    torch._dynamo.reset()


def test_empty_input_launches_nothing(script_target):
    x, s = torch.randn(0, 5), torch.randn(0)
    out, (record,) = _run_recorded(_surrounded, x, s, target=script_target)
    assert out.shape == (0, 5)
    _assert_native(record, scale_rows_op)
    # The grid has no block, so the plan does not call the launcher (CUDA would refuse).
    (step,) = [s for s in _plan(record).steps if isinstance(s, LaunchStep)]
    step.fn = None
    (again,) = _plan(record)(x, s)
    assert again.shape == (0, 5)
