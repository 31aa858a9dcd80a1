"""Check an op's lowering: evaluate its compute definitions with numpy and compare with eager."""

import numpy as np
import torch
from torch.utils import _pytree as pytree

from minicomp.ir import types as T
from minicomp.ir.compute import TensorNode, tensor_input
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import size_var
from minicomp.ops.registry import LoweringContext, lowering_for

FLOATS = (torch.float32, torch.float64, torch.float16)
INTS = (torch.int32, torch.int64)
SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -2.5)


def make_tensor(shape, dtype, *, special=True, low=None, high=None, nonzero=False, seed=None):
    """Fresh random data: floats mixed with NaN/inf/zero/negatives, ints of both signs.

    `special` may be a tuple of the special values to mix in instead of SPECIALS.
    """
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        lo, hi = (-4.0 if low is None else low), (4.0 if high is None else high)
        t = torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo
        if special and t.numel():
            flat = t.view(-1)
            pick = torch.randperm(flat.numel(), generator=g)[: max(1, flat.numel() // 4)]
            values = SPECIALS if special is True else special
            specials = torch.tensor(values, dtype=torch.float64)
            flat[pick] = specials[torch.randint(0, len(values), (len(pick),), generator=g)]
        t = t.to(dtype)
    else:
        signed = dtype not in (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
        lo = (-9 if signed else 0) if low is None else (low if signed else max(low, 0))
        hi = 10 if high is None else high
        t = torch.randint(lo, hi, shape, generator=g, dtype=dtype)
    if nonzero:
        t = torch.where(t == 0, torch.ones((), dtype=dtype), t)
    return t


def tolerance(dtype: torch.dtype) -> dict:
    """assert_close tolerances for results of `dtype` computed by different formulas."""
    return {
        torch.float16: {"rtol": 2e-3, "atol": 1e-3},
        torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2},
        torch.float32: {"rtol": 1e-5, "atol": 1e-6},
        torch.float64: {"rtol": 1e-10, "atol": 1e-12},
    }.get(dtype, {"rtol": 0, "atol": 0})


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as the evaluator takes them (bf16 and float8 as float32)."""
    t = t.detach()
    wide = t.dtype == torch.bfloat16 or T.is_float8(T.from_torch(t.dtype))
    return (t.float() if wide else t).numpy().copy()


def from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """An evaluator result as a tensor of `dtype`."""
    return torch.from_numpy(np.array(a, order="C")).to(dtype)


def _symbolic(shape, sym: dict):
    return tuple(size_var(sym[d]) if d in sym else d for d in shape)


def lower(aten_op, args, kwargs, expected, sym=None):
    """The computes the registered lowering of `aten_op` gives, and the evaluator's inputs."""
    sym = sym or {}
    inputs = {}

    def as_node(a):
        if not isinstance(a, torch.Tensor):
            return a
        name = f"a{len(inputs)}"
        inputs[name] = to_numpy(a)
        return tensor_input(name, _symbolic(tuple(a.shape), sym), T.from_torch(a.dtype))

    largs = pytree.tree_map(as_node, list(args))
    lkwargs = pytree.tree_map(as_node, dict(kwargs))
    outs = expected if isinstance(expected, (tuple, list)) else (expected,)
    ctx = LoweringContext(
        "out",
        tuple(_symbolic(tuple(o.shape), sym) for o in outs),
        tuple(T.from_torch(o.dtype) for o in outs),
    )
    fn = lowering_for(aten_op)
    assert fn is not None, f"no lowering registered for {aten_op}"
    result = fn(ctx, *largs, **lkwargs)
    results = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    assert all(isinstance(r, TensorNode) for r in results)
    return results, inputs


def check_lowering(aten_op, *args, rtol=None, atol=None, sym=None, expected=None, **kwargs):
    """Lower `aten_op(*args, **kwargs)`, evaluate it, compare with eager; returns the outputs.

    `sym` maps concrete sizes to size-symbol names: every such dimension of the inputs and
    outputs becomes a symbol, and evaluation binds it to the concrete size. `expected`
    replaces eager's result where eager cannot run the call (on CPU).
    """
    if expected is None:
        expected = aten_op(*args, **kwargs)
    results, inputs = lower(aten_op, args, kwargs, expected, sym)
    sizes = {name: size for size, name in (sym or {}).items()}
    outs = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(results) == len(outs), f"{len(results)} outputs, eager gives {len(outs)}"
    actual = []
    for k, (r, e) in enumerate(zip(results, outs)):
        assert T.from_torch(e.dtype) == r.dtype, f"output {k}: dtype {r.dtype} != {e.dtype}"
        got = from_numpy(evaluate(r, inputs, sizes), e.dtype)
        tol = tolerance(e.dtype)
        torch.testing.assert_close(
            got,
            e,
            equal_nan=True,
            check_stride=False,
            rtol=tol["rtol"] if rtol is None else rtol,
            atol=tol["atol"] if atol is None else atol,
            msg=lambda m, k=k: f"{aten_op} output {k}: {m}",
        )
        actual.append(got)
    return tuple(actual)
