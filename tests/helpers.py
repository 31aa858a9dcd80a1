"""Compile a function with minicomp and compare what it returns with eager PyTorch."""

import pytest
import torch
import torch._dynamo
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils import _pytree as pytree

import minicomp  # noqa: F401  (importing minicomp registers the "minicomp" backend)
from minicomp import config
from minicomp.backends import cpu


def clone_inputs(args):
    """Fresh copies of every tensor in a nested structure, keeping strides and requires_grad."""
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.requires_grad), args
    )


def build_cpu(module, *, cache_dir: str) -> cpu.CpuModule:
    """`module` built as the cpu target builds it: with the cc and cflags options' compiler."""
    return cpu.build(module, cc=config.get("cc"), cflags=config.get("cflags"), cache_dir=cache_dir)


def compile_minicomp(fn, target: str, dynamic: bool | None = False):
    """`fn` compiled by minicomp for `target`, after forgetting every earlier compilation.

    fallback="error": a graph minicomp cannot compile fails the test instead of quietly
    running eagerly (single ops minicomp has no lowering for still run as ATen calls).
    """
    torch._dynamo.reset()
    options = {"target": target, "fallback": "error"}
    return torch.compile(fn, backend="minicomp", options=options, dynamic=dynamic)


def assert_same(actual, expected, *, check_stride: bool = True, **kwargs) -> None:
    """Compare two nested outputs leaf by leaf: tensors and numbers closely, anything else by ==.

    dtype and shape always have to match; strides too when the expected tensor is dense and
    non-overlapping and `check_stride` is true. kwargs go to torch.testing.assert_close.
    """
    actual_leaves, actual_spec = pytree.tree_flatten_with_path(actual)
    expected_leaves, expected_spec = pytree.tree_flatten_with_path(expected)
    assert actual_spec == expected_spec, f"output structure {actual_spec} != {expected_spec}"
    for (path, a), (_, e) in zip(actual_leaves, expected_leaves, strict=True):
        where = f"output{pytree.keystr(path)}"
        if isinstance(e, torch.Tensor):
            strided = e.layout == torch.strided
            stride = check_stride and strided and is_non_overlapping_and_dense_or_false(e)
            torch.testing.assert_close(
                a, e, check_stride=stride, msg=lambda m, w=where: f"{w}: {m}", **kwargs
            )
        elif isinstance(e, (int, float)) and not isinstance(e, bool):
            torch.testing.assert_close(a, e, msg=lambda m, w=where: f"{w}: {m}", **kwargs)
        else:
            assert a == e, f"{where}: {a!r} != {e!r}"


def _upcast(args, dtype: torch.dtype):
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, args
    )


def _cast_like(expected, actual):
    def cast(e, a):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.is_floating_point():
            return e.to(a.dtype)
        return e

    return pytree.tree_map(cast, expected, actual)


def check_compiled(
    fn,
    *args,
    target: str,
    rtol: float | None = None,
    atol: float | None = None,
    dynamic: bool = False,
    reference_dtype: torch.dtype | None = None,
    **kwargs,
):
    """Run `fn` eagerly and compiled by minicomp on copies of `args`, compare, return compiled.

    With `reference_dtype=torch.float64` the reference is eager run on floating inputs upcast to
    float64, rounded back to the compiled outputs' dtypes (for functions of their inputs only:
    a module's float32 parameters would not be upcast). kwargs go to `assert_same`
    (check_stride, equal_nan, ...).
    """
    if target == "cuda":
        args = pytree.tree_map_only(torch.Tensor, lambda t: t.to("cuda"), args)
        if isinstance(fn, torch.nn.Module):
            fn.to("cuda")
    reference_args = clone_inputs(args)
    if reference_dtype is not None:
        reference_args = _upcast(reference_args, reference_dtype)
    expected = fn(*reference_args)
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    actual = compiled(*clone_inputs(args))
    if reference_dtype is not None:
        expected = _cast_like(expected, actual)
    assert_same(actual, expected, rtol=rtol, atol=atol, **kwargs)
    return actual


def attention_problem_of(fn, *args):
    """The attention template's problem for the one fused attention call of `fn` on `args`
    (imported for the cpu target, where the call stays an ATen call)."""
    from minicomp.ir.graph import ExternOp
    from minicomp.passes.graph.attention import attention_problem, sdpa_ops
    from minicomp.passes.graph.layout import layouts_for

    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": "cpu"})
    (record,) = report.records
    graph = record.graph
    (call,) = [n for n in graph.nodes if isinstance(n, ExternOp) and n.target in sdpa_ops()]
    read = set(graph.users()) | graph.output_values()
    return attention_problem(call, layouts_for(graph), read)[0]


def attention_bwd_problem(name, q, k, v, causal, arch="sm_90a"):
    """The Hopper attention backward's problem for attention over q, k and v (O, dO and the
    gradients shaped like them, all with the tensors' strides; a contiguous logsumexp)."""
    from minicomp.ir.expr import Var
    from minicomp.ir.types import PointerType, from_torch
    from minicomp.schedule.templates.attention import Operand
    from minicomp.schedule.templates.attention_hopper_bwd import BackwardProblem
    from minicomp.script.values import TensorRef

    def operand(role: str, t: torch.Tensor) -> Operand:
        extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        var = Var(role, PointerType(from_torch(t.dtype)))
        strides = tuple(t.stride()) if t.dim() == 4 else (*t.stride(), 0)
        return Operand(TensorRef(role, var, (extent,)), strides)

    (b, h, sq, d), (hk, sk) = q.shape, k.shape[1:3]
    lse = torch.empty(b, h, sq)
    roles = dict(q=q, k=k, v=v, o=q, do=q, lse=lse, dq=q, dk=k, dv=v)
    return BackwardProblem(
        name,
        from_torch(q.dtype),
        b,
        h,
        hk,
        sq,
        sk,
        d,
        **{r: operand(r, t) for r, t in roles.items()},
        causal=causal,
        scale=d**-0.5,
        arch=arch,
    )


def binary_for_sass(source: str, arch: str, cache_dir: str):
    """`source` built by NVRTC for `arch`, to disassemble; skips the test where cuobjdump (the
    `sass` extra) or NVRTC is missing."""
    from minicomp.backends.cuda import nvrtc, sass

    if sass.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (the `sass` extra)")
    try:
        return nvrtc.compile_cuda(source, arch=arch, cache_dir=cache_dir)
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
