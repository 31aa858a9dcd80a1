"""A small builder of graph IR for pass tests, a graph comparer, and a reference graph runner."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, TensorInput, compute, inputs_of
from minicomp.ir.evaluate import evaluate, np_dtype
from minicomp.ir.expr import Expr, Var, size_var
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, TensorType, Value


class GraphBuilder:
    """Builds a Graph one value at a time; values are returned as TensorInputs to index.

    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.compute("y", (4, 8), lambda i, j: x[i, j] * 2)
    b.output(y)
    g = b.build()
    """

    def __init__(self):
        self.inputs: list = []
        self.nodes: list = []
        self.outputs: list = []
        self.constants: dict[str, torch.Tensor] = {}
        self.values: dict[str, Value] = {}

    def _value(self, name: str, shape: Sequence, dtype: T.DataType) -> TensorInput:
        if name in self.values:
            raise ValueError(f"value {name} defined twice")
        self.values[name] = Value(name, TensorType(tuple(shape), dtype))
        return TensorInput(name, tuple(shape), dtype)

    def input(self, name: str, shape: Sequence, dtype: T.DataType = T.f32) -> TensorInput:
        """A tensor input of the graph."""
        t = self._value(name, shape, dtype)
        self.inputs.append(self.values[name])
        return t

    def symbol(self, name: str) -> Var:
        """A size symbol the graph takes."""
        s = size_var(name)
        self.inputs.append(s)
        return s

    def constant(self, name: str, value: torch.Tensor) -> TensorInput:
        """A value bound to a fixed tensor."""
        t = self._value(name, tuple(value.shape), T.from_torch(value.dtype))
        self.constants[name] = value
        return t

    def compute(self, name: str, shape: Sequence, fn: Callable[..., Expr]) -> TensorInput:
        """A compute op defining `name` elementwise (the lambda may use reduce())."""
        return self.add(compute(name, shape, fn))

    def add(self, definition: Compute) -> TensorInput:
        """A compute op with a ready definition."""
        inputs = tuple(self.values[t.name] for t in inputs_of(definition))
        t = self._value(definition.name, definition.shape, definition.dtype)
        op = ComputeOp(definition.name, inputs, (self.values[definition.name],), definition)
        self.nodes.append(op)
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
    ) -> TensorInput:
        """An ATen call with one tensor result; `args` default to the inputs in order."""
        ins = tuple(self.values[t.name] for t in inputs)
        if args is None:
            args = tuple(ArgRef(k) for k in range(len(ins)))
        t = self._value(name, shape, dtype)
        self.nodes.append(ExternOp(name, ins, (self.values[name],), target, args, kwargs, ((),)))
        return t

    def output(self, *outs) -> None:
        """Graph outputs: built tensors, i64 expressions, or None."""
        for o in outs:
            self.outputs.append(self.values[o.name] if isinstance(o, TensorInput) else o)

    def build(self) -> Graph:
        return Graph(
            tuple(self.inputs), tuple(self.nodes), tuple(self.outputs), dict(self.constants)
        )


def assert_graph_equal(actual: Graph, expected: Graph) -> None:
    """Structural equality of inputs, operators, outputs and constants; prints both if not."""
    same = (
        actual.inputs == expected.inputs
        and actual.nodes == expected.nodes
        and actual.outputs == expected.outputs
        and actual.constants.keys() == expected.constants.keys()
        and all(torch.equal(actual.constants[k], expected.constants[k]) for k in expected.constants)
    )
    assert same, (
        f"graphs differ\n--- actual\n{actual}\n  constants: {sorted(actual.constants)}"
        f"\n--- expected\n{expected}\n  constants: {sorted(expected.constants)}"
    )


def random_inputs(graph: Graph, seed: int = 0, sizes: dict | None = None) -> dict:
    """Random arrays for the graph's tensor inputs (sizes give the symbols' values)."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        if isinstance(v, Value):
            shape = tuple(d if isinstance(d, int) else sizes[d.name] for d in v.shape)
            if v.dtype.is_float:
                arr = rng.standard_normal(shape)
            elif v.dtype.is_bool:
                arr = rng.integers(0, 2, shape)
            else:
                arr = rng.integers(-10, 10, shape)
            out[v.name] = np.asarray(arr).astype(np_dtype(v.dtype))
    return out


def evaluate_graph(
    graph: Graph, inputs: dict[str, np.ndarray], sizes: dict[str, int] | None = None
) -> list:
    """The graph's outputs, running each compute op with the reference evaluator."""
    env = dict(inputs)
    for name, t in graph.constants.items():
        t = t.detach().cpu()
        env[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    for n in graph.nodes:
        if not isinstance(n, ComputeOp):
            raise TypeError(f"evaluate_graph runs compute ops only, not {n.name}")
        env[n.outputs[0].name] = evaluate(
            n.definition, {v.name: env[v.name] for v in n.inputs}, sizes
        )
    return [
        None if o is None else np.array(env[o.name]) if isinstance(o, Value) else o
        for o in graph.outputs
    ]


def assert_same_results(before: Graph, after: Graph, seed: int = 0, **sizes) -> None:
    """Both graphs give bitwise-equal outputs on the same random inputs."""
    inputs = random_inputs(before, seed, sizes)
    for k, (a, b) in enumerate(
        zip(evaluate_graph(before, inputs, sizes), evaluate_graph(after, inputs, sizes))
    ):
        np.testing.assert_array_equal(b, a, err_msg=f"output {k}")
