"""Before/expected tests of graph passes: a GraphBuilder that also sets what passes set (an op
named other than its value, strides, an ATen call's reason), and whole-graph comparisons.

    b = PassGraphBuilder()
    x = b.input("x", (6, 4))
    xt = b.compute("xt", (4, 6), lambda i, j: x[j, i])
    ...
    e = PassGraphBuilder()                      # the graph the pass should give
    ...
    assert_graph_equal(alias_views(b.build()), e.build())
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

import numpy as np
import torch
from graph_builder import GraphBuilder
from graph_builder import assert_graph_equal as _assert_same_structure

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, TensorInput, compute
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import Expr
from minicomp.ir.graph import ArgRef, ComputeOp, Graph


class PassGraphBuilder(GraphBuilder):
    """GraphBuilder whose values may have strides and whose ops may be named apart from the
    value they define (`op=`), as the ops passes make are: the two compute ops an `addmm`
    becomes are both named "addmm", a horizontal fusion's slices "slice"."""

    def input(
        self, name: str, shape: Sequence, dtype: T.DataType = T.f32, strides: tuple | None = None
    ) -> TensorInput:
        t = super().input(name, shape, dtype)
        if strides is not None:
            self.inputs[-1] = self._set_strides(name, strides)
        return t

    def constant(self, name: str, value: torch.Tensor, strides: tuple | None = None) -> TensorInput:
        """A value bound to `value`; `strides` gives its Value the tensor's strides, as the
        constants passes make have (the importer's constants have none)."""
        t = super().constant(name, value)
        if strides is not None:
            assert strides == tuple(value.stride()), f"{name} has strides {value.stride()}"
            self._set_strides(name, strides)
        return t

    def compute(
        self,
        name: str,
        shape: Sequence,
        fn: Callable[..., Expr],
        op: str | None = None,
        strides: tuple | None = None,
    ) -> TensorInput:
        return self.add(compute(name, shape, fn), op=op, strides=strides)

    def add(
        self, definition: Compute, op: str | None = None, strides: tuple | None = None
    ) -> TensorInput:
        t = super().add(definition)
        self._finish_op(definition.name, op, strides)
        return t

    def extern(
        self,
        name: str,
        target,
        inputs: Sequence[TensorInput],
        shape: Sequence,
        dtype: T.DataType = T.f32,
        args: tuple | None = None,
        kwargs: tuple = (),
        op: str | None = None,
        strides: tuple | None = None,
        reason: str = "",
    ) -> TensorInput:
        t = super().extern(name, target, inputs, shape, dtype, args, kwargs)
        self._finish_op(name, op, strides)
        if reason:
            self.nodes[-1] = self.nodes[-1].replace(reason=reason)
        return t

    def _set_strides(self, name: str, strides: tuple):
        v = self.values[name]
        v = self.values[name] = v.replace(type=v.type.replace(strides=tuple(strides)))
        return v

    def _finish_op(self, name: str, op: str | None, strides: tuple | None) -> None:
        node = self.nodes[-1]
        if strides is not None:
            node = node.replace(outputs=(self._set_strides(name, strides),))
        if op is not None:
            node = node.replace(name=op)
        self.nodes[-1] = node


def assert_graph_equal(actual: Graph, expected: Graph) -> None:
    """graph_builder.assert_graph_equal, constants compared with their dtypes and strides
    too (a pass that lays a constant out differently changes what kernels read)."""
    _assert_same_structure(actual, expected)
    for name, want in expected.constants.items():
        got = actual.constants[name]
        assert (got.dtype, got.stride()) == (want.dtype, want.stride()), (
            f"constant {name}: {got.dtype} strides {got.stride()}, "
            f"expected {want.dtype} strides {want.stride()}"
        )


def assert_graph_text(actual: Graph, expected: str) -> None:
    """The graph prints as `expected` (indentation common to its lines removed)."""
    want = textwrap.dedent(expected).strip("\n")
    got = str(actual)
    assert got == want, f"graphs differ\n--- actual\n{got}\n--- expected\n{want}"


def run_graph(graph: Graph, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The graph's outputs: compute ops by the reference evaluator, calls by calling their
    targets (ATen operators or callables)."""
    env = {**graph.constants, **inputs}
    for n in graph.nodes:
        ins = [env[v.name] for v in n.inputs]
        if isinstance(n, ComputeOp):
            # The evaluator holds bf16 as float32 arrays.
            arrays = {
                v.name: (t.float() if t.dtype == torch.bfloat16 else t).contiguous().numpy()
                for v, t in zip(n.inputs, ins)
            }
            out = torch.from_numpy(np.array(evaluate(n.definition, arrays)))
            env[n.outputs[0].name] = out.to(T.to_torch(n.outputs[0].dtype))
        else:
            args = [ins[a.index] if isinstance(a, ArgRef) else a for a in n.args]
            env[n.outputs[0].name] = n.target(*args, **dict(n.kwargs))
    return [env[o.name] for o in graph.outputs]
