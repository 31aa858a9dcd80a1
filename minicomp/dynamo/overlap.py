"""In-place writes to a tensor whose elements share memory (a broadcast view).

`x.expand(3, 3).add_(1)` raises `RuntimeError: unsupported operation: more than one element
of the written-to tensor refers to a single memory location` in eager. AOTAutograd
functionalizes the write (an add, then a scatter back into x) and the error is lost: the
compiled graph would add the broadcast sum into x. The writes eager accepts on such a view
(`x.expand(3, 3).fill_(1)`, `zero_()`) functionalize wrongly too: scattering the view back
into its base is not defined when view elements share memory (aot_eager and Inductor give
other numbers than eager).

Before AOTAutograd, the Dynamo graph is run once more on fake tensors under a dispatch mode
that looks at every ATen op writing an argument, and at the written tensor's layout. An op
eager checks the way its kernels do (TensorIterator ops, copies, random fills, scatters:
CHECKED_OPS) means the graph raises eager's error; any other means the graph runs as Dynamo
captured it. Dynamo guards on the inputs' strides, so what the fake run finds holds for
every call of the compiled graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MESSAGE = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)

# Operators eager checks for internal overlap besides the pointwise, random and out= ones
# (ATen's assert_no_internal_overlap), by name or by name.overload. fill_ with a scalar,
# zero_, masked_fill_, index_fill_, index_put_, tril_/triu_ and the in-place views do not
# check, and are not listed; fill_ with a tensor value does.
CHECKED_OPS = frozenset(
    (
        "copy_",
        "fill_.Tensor",
        "index_copy_",
        "index_add_",
        "scatter_",
        "scatter_add_",
        "scatter_reduce_",
        "masked_scatter_",
        "put_",
        "cumsum_",
        "cumprod_",
        "addmm_",
        "addbmm_",
        "baddbmm_",
    )
)

_INPLACE_OPERATORS = frozenset(
    f"i{op}"
    for op in (
        "add",
        "sub",
        "mul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
        "matmul",
    )
) | {"setitem"}


class _Overlap(Exception):
    """An op would write to an internally overlapping tensor."""

    def __init__(self, op: torch._ops.OpOverload, checked: bool):
        super().__init__(str(op))
        self.op = op
        self.checked = checked


def eager_checks_overlap(op: torch._ops.OpOverload) -> bool:
    """Whether eager raises when `op` writes to a tensor with internal overlap."""
    tags = op.tags
    if torch.Tag.inplace_view in tags:
        return False
    if torch.Tag.out in tags or torch.Tag.pointwise in tags:
        return True
    if torch.Tag.nondeterministic_seeded in tags and torch.Tag.inplace in tags:
        return True
    name = op._schema.name.split("::")[-1]
    return name in CHECKED_OPS or f"{name}.{op._overloadname}" in CHECKED_OPS


def _written(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list:
    """The tensors `op` writes, among its arguments."""
    out = []
    for k, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = kwargs.get(a.name) if a.kwarg_only or k >= len(args) else args[k]
        if isinstance(value, torch.Tensor):
            out.append(value)
    return out


class _OverlapCheck(TorchDispatchMode):
    """Raises _Overlap before an op eager would refuse for an overlapping written tensor."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.OpOverload) and torch.Tag.inplace_view not in func.tags:
            if any(_broadcast(t) for t in _written(func, args, kwargs)):
                raise _Overlap(func, eager_checks_overlap(func))
        return func(*args, **kwargs)


def _broadcast(t: torch.Tensor) -> bool:
    """Whether `t` has elements and a dim of more than one element with stride 0: where
    ATen's has_internal_overlap answers YES (other overlaps it finds too hard, and eager lets
    through). Symbolic sizes and strides count when known without adding a guard."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not all(statically_known_true(n != 0) for n in t.shape):
        return False  # an empty tensor has no element to share
    return any(
        statically_known_true(n != 1) and statically_known_true(s == 0)
        for n, s in zip(t.shape, t.stride())
    )


def _may_write_in_place(n: torch.fx.Node) -> bool:
    if n.op == "call_method":
        name = n.target
    elif n.op == "call_function":
        name = getattr(n.target, "__name__", "")
    else:
        return False
    return name.endswith("_") or name in _INPLACE_OPERATORS or "out" in n.kwargs


def _fresh_fake(v: Any) -> Any:
    """A fake tensor laid out like `v` in memory of its own (the fake run must not change the
    metadata of the tensors Dynamo and AOTAutograd trace with)."""
    if not isinstance(v, torch.Tensor):
        return v
    span = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride()))
    base = torch.empty(v.storage_offset() + span, dtype=v.dtype, device=v.device)
    return base.as_strided(v.shape, v.stride(), v.storage_offset())


@dataclass(frozen=True)
class OverlappingWrite:
    """The first op of a graph that writes to a tensor whose elements share memory."""

    op: str
    raises_in_eager: bool  # eager refuses it with MESSAGE; else eager performs it


def find_overlapping_write(gm: torch.fx.GraphModule) -> OverlappingWrite | None:
    """The first op of the Dynamo graph `gm` that writes to a tensor whose elements share
    memory, run on fake tensors; None when there is none or the fake run cannot tell."""
    if not any(_may_write_in_place(n) for n in gm.graph.nodes):
        return None
    if not _GLOBAL_STATE.isdisjoint(n.target for n in gm.graph.nodes):
        return None  # an aborted run would leave autocast entered
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = torch._guards.detect_fake_mode(values)
    if fake_mode is None or any(v is None for v in values):
        return None
    grad = torch.is_grad_enabled()
    try:
        with fake_mode:
            inputs = [_fresh_fake(v) for v in values]
            with _OverlapCheck():
                torch.fx.Interpreter(gm).run(*inputs)
    except _Overlap as found:
        return OverlappingWrite(str(found.op), found.checked)
    except Exception:  # the fake run is a check only: what it cannot run, it does not judge
        return None
    finally:
        torch._C._set_grad_enabled(grad)  # the graph may switch it, and stop halfway
    return None


_GLOBAL_STATE = frozenset((torch.amp._enter_autocast, torch.amp._exit_autocast))
