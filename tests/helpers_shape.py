"""Run one registered lowering on concrete tensors and compare with eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorNode, tensor_input
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import size_var
from minicomp.ops.registry import LoweringContext, NotLowerable, lowering_for


def rand(*shape, dtype=torch.float32, low=-5, high=5) -> torch.Tensor:
    """A fresh random tensor of any dtype."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(shape, dtype=torch.float64) * (high - low) + low).to(dtype)
    return torch.randint(low, high, shape, dtype=dtype)


def _symbolic(shape, sym: dict[str, int] | None) -> tuple:
    """`shape` with every size equal to a symbol's value replaced by that symbol."""
    if not sym:
        return tuple(shape)
    by_value = {v: size_var(k) for k, v in sym.items()}
    return tuple(by_value.get(int(d), int(d)) for d in shape)


class _Inputs:
    """Turns eager arguments into lowering arguments, collecting the arrays by name."""

    def __init__(self, sym):
        self.sym = sym
        self.arrays: dict[str, np.ndarray] = {}

    def convert(self, a, name: str):
        if isinstance(a, torch.Tensor):
            node = tensor_input(name, _symbolic(a.shape, self.sym), T.from_torch(a.dtype))
            self.arrays[name] = a.numpy()
            return node
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return [None if x is None else self.convert(x, f"{name}_{k}") for k, x in enumerate(a)]
        return a


def _outputs(expected) -> list[torch.Tensor]:
    return list(expected) if isinstance(expected, (list, tuple)) else [expected]


def lower(op, *args, sym: dict[str, int] | None = None, out_shapes=None, **kwargs):
    """The lowering of `op` on tensor arguments, with the eager result and the input arrays.

    Tensors (alone or in lists) become TensorInputs named a0, a1, a1_0...; with `sym`, every
    size equal to a symbol's value becomes that symbol, in inputs and outputs alike (or the
    outputs take `out_shapes` when given).
    """
    expected = op(*args, **kwargs)
    inputs = _Inputs(sym)
    largs = [inputs.convert(a, f"a{k}") for k, a in enumerate(args)]
    outs = _outputs(expected)
    shapes = out_shapes or tuple(_symbolic(o.shape, sym) for o in outs)
    ctx = LoweringContext(
        name="out",
        out_shapes=tuple(tuple(s) for s in shapes),
        out_dtypes=tuple(T.from_torch(o.dtype) for o in outs),
        arg_meta=[a if isinstance(a, torch.Tensor) else None for a in args],
    )
    fn = lowering_for(op)
    assert fn is not None, f"no lowering registered for {op}"
    result = fn(ctx, *largs, **kwargs)
    return result, expected, inputs.arrays


def check(op, *args, sym: dict[str, int] | None = None, out_shapes=None, exact=True, **kwargs):
    """Lower `op`, evaluate every output with numpy and compare with eager; return computes."""
    result, expected, arrays = lower(op, *args, sym=sym, out_shapes=out_shapes, **kwargs)
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    outs = _outputs(expected)
    assert len(results) == len(outs), f"{len(results)} outputs, eager gave {len(outs)}"
    for k, (c, e) in enumerate(zip(results, outs)):
        assert isinstance(c, TensorNode)
        assert c.dtype == T.from_torch(e.dtype), f"output {k}: {c.dtype} != {e.dtype}"
        got = np.array(evaluate(c, arrays, sym))
        if len(c.shape) == 0 and got.shape == (1,):
            # np.ascontiguousarray, used by some evaluator versions, turns 0-d into 1-d.
            got = got.reshape(())
        got = torch.from_numpy(got)
        tol = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(
            got, e.contiguous(), equal_nan=True, msg=lambda m, k=k: f"output {k}: {m}", **tol
        )
    return results


def refuses(op, *args, **kwargs) -> None:
    """Assert that the lowering of `op` raises NotLowerable for these arguments."""
    with pytest.raises(NotLowerable):
        lower(op, *args, **kwargs)
