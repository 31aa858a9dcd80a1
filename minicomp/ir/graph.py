"""The graph IR: values with shapes, operators over them, fused groups, and graphs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from minicomp.ir.collectives import is_collective
from minicomp.ir.compute import Compute
from minicomp.ir.expr import Dim, Expr, Var, prod
from minicomp.ir.func import Function
from minicomp.ir.node import Node, node
from minicomp.ir.types import DataType


@node
class TensorType(Node):
    """Shape (ints or symbolic expressions), dtype, device and strides of a tensor value."""

    shape: tuple
    dtype: DataType
    device: str = "cpu"
    strides: tuple | None = None

    @property
    def numel(self) -> Dim:
        return prod(self.shape)


@node
class Value(Node):
    """A tensor flowing along the graph's edges."""

    name: str
    type: TensorType

    @property
    def shape(self) -> tuple:
        return self.type.shape

    @property
    def dtype(self) -> DataType:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}"


class Op(Node):
    """An operator node of the graph."""

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


@node
class ComputeOp(Op):
    """An operator given by a compute definition over TensorInputs named like its inputs."""

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    definition: Compute

    @property
    def is_injective(self) -> bool:
        return self.definition.is_injective


@node
class ArgRef(Node):
    """Marks where input tensor `index` goes in an extern call's arguments."""

    index: int


@node
class ExternOp(Op):
    """A call of an ATen operator inside the plan, for ops minicomp does not lower.

    `args`/`kwargs` hold the call's arguments with tensors replaced by ArgRef and
    symbolic sizes by expressions; `result_paths` says where each output sits in the
    returned structure (() for a lone tensor, (k,) for element k of a tuple). `binds` names
    the size symbols the call's result defines (data-dependent sizes such as nonzero's count
    or `.item()`'s value), each with its PyTorch key path into the result. `checks` holds
    the bound symbols PyTorch replaced by an expression (after `torch._check(n == 4)` the
    graph's sizes say 4, not n): each key path with the expression its value must equal,
    checked when the call returns, before anything reads the result.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    target: Any
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]
    result_paths: tuple[tuple[int, ...], ...]
    reason: str = ""
    binds: tuple[tuple[str, tuple], ...] = ()
    checks: tuple[tuple[tuple, Any], ...] = ()

    @property
    def has_effects(self) -> bool:
        """Whether the call matters beyond its results (it mutates, returns nothing, binds
        size symbols other operators use, communicates with other processes, or PyTorch says
        it has side effects)."""
        return bool(
            not self.outputs
            or self.binds
            or self.mutates
            or is_collective(self.target)
            or declared_effectful(self.target)
        )

    @property
    def mutates(self) -> bool:
        """Whether the call writes into one of its inputs (its schema says so; a callable that
        is no ATen op, by a true `writes_first_input` attribute)."""
        schema = getattr(self.target, "_schema", None)
        if schema is None:
            return bool(getattr(self.target, "writes_first_input", False))
        return schema.is_mutable

    @property
    def returns_views(self) -> bool:
        """Whether the call's results may share memory with its inputs (a view op, or one
        returning the input it wrote into)."""
        schema = getattr(self.target, "_schema", None)
        if schema is None:
            return bool(
                getattr(self.target, "is_view", False)
                or getattr(self.target, "writes_first_input", False)
            )
        return any(r.alias_info is not None for r in schema.returns)


def declared_effectful(fn: Any) -> bool:
    """Whether PyTorch says calling `fn` has side effects, its result used or not: an op
    registered effectful (AOTAutograd orders its calls with effect tokens, with_effects) or a
    function marked with torch.fx.node.has_side_effect."""
    from torch._higher_order_ops.effects import has_effects
    from torch.fx.node import _side_effectful_functions

    try:
        return fn in _side_effectful_functions or has_effects(fn)
    except TypeError:  # an unhashable target
        return False


@node
class KernelOp(Op):
    """A launch of a hand-written kernel (a script kernel registered as a PyTorch op) that the
    plan makes itself: compiled into the graph's module, a fusion boundary like an ExternOp.

    `function` is the kernel and `callees` the device functions it calls, named uniquely in
    the module. `args` has one entry per parameter of `function`, in order: ArgRef(k) for a
    tensor (k < len(inputs): input k, else output k - len(inputs)), or an Expr for a scalar (a
    constant, or a size expression over the graph's symbols). The kernel reads its inputs and
    writes its outputs as row-major contiguous tensors, unless `strided`: then it takes every
    tensor's strides among its scalar arguments (computed from the graph's layouts by the pass
    that made the op), reads its inputs in place whatever their layout, and writes its
    outputs with the strides PyTorch gave them (their TensorTypes), as an ATen call would.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    function: Function
    callees: tuple[Function, ...]
    args: tuple
    strided: bool = False


@node
class ReduceStage(Node):
    """Within a fused row kernel: `var` = reduction `kind` of `body` over the inner loops."""

    var: Var
    kind: str
    body: Expr


@node
class StoreStage(Node):
    """Within a fused kernel: output `output` at `indices` = `body`.

    With `inner` the store runs inside the inner (reduced) loops, else once per outer index.
    """

    output: int
    indices: tuple[Expr, ...]
    body: Expr
    inner: bool = False


@node
class FusedOp(Op):
    """A group of operators compiled into one kernel, in loop-nest form.

    The kernel iterates `outer_vars` over `outer_extents`; for reduction groups,
    each outer point runs the stages in order, reduce stages looping over the
    `inner_vars`. Bodies read group inputs as elements of TensorInputs named like
    the input values, and earlier reduce stages through their variables.
    """

    name: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    members: tuple[str, ...]
    outer_vars: tuple[Var, ...]
    outer_extents: tuple
    inner_vars: tuple[Var, ...]
    inner_extents: tuple
    stages: tuple[Node, ...]

    @property
    def is_reduction(self) -> bool:
        return any(isinstance(s, ReduceStage) for s in self.stages)


GraphInput = Value | Var
GraphOutput = Value | Expr | None


@dataclass(frozen=True)
class Graph:
    """A dataflow graph: inputs (tensor values and size symbols), operators, outputs.

    `constants` binds values that hold fixed tensors (folded or lifted constants). `origins`
    names, for the values the importer made, the ATen graph node each computes part of (passes
    name the values they add after those they derive from: see `origin_of`). `storages` gives,
    for the values that are an ATen graph node's result, an id of the memory eager PyTorch
    holds that result in: two values with one id share memory in eager (a view and its base).
    `input_writes` maps values that a kernel computes in the memory of a graph input (the new
    value of an input the graph mutates: passes/graph/input_mutations.py) to that input's
    name.
    """

    inputs: tuple[GraphInput, ...]
    nodes: tuple[Op, ...]
    outputs: tuple[GraphOutput, ...]
    constants: Mapping[str, Any] = field(default_factory=dict)
    origins: Mapping[str, str] = field(default_factory=dict)
    storages: Mapping[str, int] = field(default_factory=dict)
    input_writes: Mapping[str, str] = field(default_factory=dict)

    def producers(self) -> dict[Value, Op]:
        """The operator producing each value."""
        return {v: n for n in self.nodes for v in n.outputs}

    def users(self) -> dict[Value, list[Op]]:
        """The operators reading each value, in graph order."""
        out: dict[Value, list[Op]] = {}
        for n in self.nodes:
            for v in dict.fromkeys(n.inputs):
                out.setdefault(v, []).append(n)
        return out

    def output_values(self) -> set[Value]:
        """The tensor values the graph returns."""
        return {o for o in self.outputs if isinstance(o, Value)}

    def symbols(self) -> tuple[Var, ...]:
        """The size symbols the graph takes."""
        return tuple(i for i in self.inputs if isinstance(i, Var))

    def origin_of(self, value: str) -> str | None:
        """The ATen graph node value `value` (or the value whose name it extends) comes from."""
        hit = self.origins.get(value)
        if hit is not None:
            return hit
        derived = [
            name
            for name in self.origins
            if value.startswith(name) and value[len(name)] in "_0123456789"
        ]
        return self.origins[max(derived, key=len)] if derived else None

    def shares_eager_memory(self, a: Value, b: Value) -> bool:
        """Whether eager PyTorch holds values `a` and `b` in one memory (one is a view)."""
        ids = self.storages.get(a.name), self.storages.get(b.name)
        return ids[0] is not None and ids[0] == ids[1]

    def replace(self, **changes) -> Graph:
        """A copy with some fields changed."""
        from dataclasses import replace

        return replace(self, **changes)

    def __str__(self) -> str:
        from minicomp.ir.printer import graph_str

        return graph_str(self)
