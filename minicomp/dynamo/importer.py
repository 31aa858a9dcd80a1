"""The ATen FX graph → graph IR importer: one lowering per node, or an ATen extern call."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from minicomp.dynamo.opaque_inputs import is_opaque, opaque_kind
from minicomp.dynamo.scatter_views import (
    WRITTEN_VIEW,
    WRITTEN_VIEW_REASON,
    write_scatters_into_views,
)
from minicomp.dynamo.symbolic import from_sympy, shape_of
from minicomp.ir import types as T
from minicomp.ir.collectives import is_collective
from minicomp.ir.collectives import reason_for as collective_reason
from minicomp.ir.compute import Compute, TensorElement, TensorInput, TensorNode, inputs_of
from minicomp.ir.expr import Expr, Var
from minicomp.ir.functor import Mutator, collect
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, TensorType, Value
from minicomp.ir.symbols import free_symbols
from minicomp.ops.registry import NO_LOWERING, LoweringContext, NotLowerable, lowering_for
from minicomp.script.custom_op import registered_op


def tensor_type(t: torch.Tensor) -> TensorType:
    """The IR type of a (fake) tensor."""
    shape = shape_of(t.shape)
    if t.layout != torch.strided:
        # Sparse and other layouts only flow between ATen calls: an opaque element type
        # keeps every lowering away from them.
        name = f"{t.dtype}_{t.layout}".replace("torch.", "")
        return TensorType(
            shape, T.DataType(name, name, t.dtype.itemsize, "opaque"), t.device.type, None
        )
    return TensorType(
        shape, T.from_torch(t.dtype), t.device.type, _size_one_strides(shape, shape_of(t.stride()))
    )


def _size_one_strides(shape: tuple, strides: tuple) -> tuple:
    # A size-1 dim is only ever indexed at 0, so its stride is free. Decompositions often
    # leave 0 there (an expand) where eager's kernels give the row-major value: use that.
    out, acc = list(strides), 1
    for k in reversed(range(len(shape))):
        if shape[k] == 1 and strides[k] == 0:
            out[k] = acc
        acc = acc * shape[k] if isinstance(acc, int) and isinstance(shape[k], int) else None
        if acc is None:
            break
    return tuple(out)


def _is_symint(v: Any) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _shape_env(gm: torch.fx.GraphModule) -> Any:
    """The ShapeEnv the graph's symbolic sizes live in (None for a graph without any)."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        for v in val if isinstance(val, (list, tuple)) else (val,):
            fake_mode = getattr(v, "fake_mode", None)
            if fake_mode is not None and fake_mode.shape_env is not None:
                return fake_mode.shape_env
            if _is_symint(v):
                return v.node.shape_env
    return None


class Importer:
    """Walks an ATen-level GraphModule once and builds the graph IR.

    `frozen` maps positions of placeholders to the tensors that stand for them: they become
    constants of the graph instead of inputs. `externs` maps names of nodes to run as ATen
    calls, lowerings or not, to the reason why (their kernels failed to compile).
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        frozen: Mapping[int, torch.Tensor] | None = None,
        externs: Mapping[str, str] | None = None,
    ):
        self.gm = gm
        self.frozen = dict(frozen or {})
        self.externs = dict(externs or {})
        self.origins: dict[str, str] = {}  # value name -> the FX node it comes from
        self.storages: dict[str, int] = {}  # value name -> id of its eager memory
        self._storage_ids: dict[StorageWeakRef, int] = {}
        self.current = ""
        self.placeholders = 0
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[Value | Var] = []
        self.nodes: list[Op] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.names: set[str] = set()
        self.values: dict[str, Value] = {}
        self.shape_env = _shape_env(gm)
        self._size_points: list[dict[str, int]] | None = None

    def size_points(self) -> list[dict[str, int]]:
        """Assignments of the size symbols at which sizes the graph allows are compared."""
        if self._size_points is None:
            self._size_points = _size_points(self.shape_env)
        return self._size_points

    def fresh(self, base: str) -> str:
        """A value name not used yet, derived from `base`."""
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "v"
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def _new_value(self, base: str, ttype: TensorType) -> Value:
        return self._add_value(Value(self.fresh(base), ttype))

    def _add_value(self, v: Value) -> Value:
        self.values[v.name] = v
        self.origins[v.name] = self.current
        return v

    def run(self) -> Graph:
        outputs: tuple = ()
        for n in self.gm.graph.nodes:
            self.current = n.name
            self.node(n)
            self.record_storages(n)
            if n.op == "output":
                outputs = tuple(self.output_item(a) for a in _flatten(n.args[0]))
        return Graph(
            tuple(self.inputs),
            tuple(self.nodes),
            outputs,
            dict(self.constants),
            self.origins,
            self.storages,
        )

    def record_storages(self, n: torch.fx.Node) -> None:
        """Note which eager memory each tensor value `n` results in lives in. A value that
        stands for several nodes (a lowering returning its input) keeps the first's."""
        result = self.env.get(n)
        for path, t in _flatten_vals(n.meta.get("val")) if n.op != "output" else ():
            v = result
            for p in path:
                v = v[p] if isinstance(v, (list, tuple)) and p < len(v) else None
            if not isinstance(v, Value) or t.layout != torch.strided:
                continue
            key = StorageWeakRef(t.untyped_storage())
            memory = self._storage_ids.setdefault(key, len(self._storage_ids))
            self.storages.setdefault(v.name, memory)

    def node(self, n: torch.fx.Node) -> None:
        if n.op == "placeholder":
            self.placeholder(n)
        elif n.op == "get_attr":
            self.get_attr(n)
        elif n.op == "call_function":
            self.call_function(n)
        elif n.op != "output":
            raise NotImplementedError(f"FX node kind {n.op} ({n.name}) is not supported")

    def placeholder(self, n: torch.fx.Node) -> None:
        val = n.meta.get("val")
        position, self.placeholders = self.placeholders, self.placeholders + 1
        if position in self.frozen:
            self.env[n] = self.values[self.constant(n.name, self.frozen[position])]
            return
        if isinstance(val, torch.Tensor):
            v = self._new_value(n.name, tensor_type(val))
            self.inputs.append(v)
            self.env[n] = v
        elif _is_symint(val):
            e = from_sympy(val)
            if isinstance(e, Var):
                self.names.add(e.name)
                self.inputs.append(e)
            else:
                # A placeholder whose value is an expression of other symbols: bind a
                # fresh symbol so the runtime can still pass it positionally.
                var = Var(self.fresh(n.name), T.i64)
                self.inputs.append(var)
            self.env[n] = e
        elif is_opaque(val):
            # split_opaque_inputs took out those only the output reads.
            readers = ", ".join(str(u.target) for u in n.users if u.op != "output")
            raise NotImplementedError(
                f"graph input {n.name} is an opaque object ({opaque_kind(val)}) that {readers} "
                "reads: minicomp passes such objects through a graph, it does not call ops "
                "on them"
            )
        else:
            raise NotImplementedError(f"graph input {n.name} of type {type(val).__name__}")

    def get_attr(self, n: torch.fx.Node) -> None:
        t = getattr(self.gm, n.target)
        if not isinstance(t, torch.Tensor):
            self.env[n] = t
            return
        self.env[n] = self.values[self.constant(n.name, t)]

    def constant(self, base: str, t: torch.Tensor) -> str:
        """The name of a new constant value holding `t`."""
        v = self._new_value(base, tensor_type(t))
        self.constants[v.name] = t.detach()
        return v.name

    def output_item(self, a: Any) -> Any:
        if a is None:
            return None
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (int, Expr)):
            return a
        raise NotImplementedError(f"graph output of type {type(a).__name__}")

    def call_function(self, n: torch.fx.Node) -> None:
        val = n.meta.get("val")
        if n.target is operator.getitem:
            self.env[n] = self.env[n.args[0]][n.args[1]]
            return
        binds = self.unbacked_bindings(n)
        if binds and _is_symint(val) and isinstance(n.target, torch._ops.OpOverload):
            # `.item()` and the like: the plan calls it, and its value binds the symbol.
            self.extern(n, [], UNBACKED_REASON, binds=binds, checks=self.bound_checks(n))
            self.env[n] = from_sympy(val)
            return
        if (
            _is_symint(val)
            or isinstance(val, (int, float, bool))
            and not isinstance(n.target, torch._ops.OpOverload)
        ):
            self.env[n] = from_sympy(val) if _is_symint(val) else val
            return
        if n.target is torch.ops.higher_order.with_effects:
            self.with_effects(n)
            return
        outs = _flatten_vals(val)
        if not isinstance(n.target, torch._ops.OpOverload):
            if not isinstance(n.target, torch._ops.HigherOrderOperator) or not outs:
                raise NotImplementedError(f"call of {n.target} ({n.name}) is not supported")
            # auto_functionalized_v2 (a mutable custom op, called on copies of what it
            # mutates) and the like: one call of the operator, tensors in and out.
            self.extern(n, outs, HIGHER_ORDER_REASON)
            return
        if val is None and not n.target._schema.returns:
            # A run-time check (_assert_async, _assert_scalar) or another effect: the plan
            # calls it in order, and DCE keeps it (an op without results has effects).
            self.extern(n, [], "returns nothing: a check or an effect, called in order")
            return
        if not outs or not all(isinstance(t, torch.Tensor) for _, t in outs):
            raise NotImplementedError(f"{n.target} returns non-tensors")
        if binds:
            # Its output's size is known only once it ran (nonzero, a boolean mask index).
            self.extern(n, outs, UNBACKED_REASON, binds=binds, checks=self.bound_checks(n))
            return
        if is_collective(n.target):
            self.extern(n, outs, collective_reason(n.target))
            return
        if registered_op(n.target) is not None:
            # Whether the plan launches the kernel itself depends on the target, known later.
            self.extern(n, outs, SCRIPT_OP_REASON)
            return
        if n.name in self.externs:
            self.extern(n, outs, self.externs[n.name])
            return
        if n.meta.get(WRITTEN_VIEW):
            self.extern(n, outs, WRITTEN_VIEW_REASON)  # its memory must be the input's
            return
        try:
            self.lower(n, outs)
        except NotLowerable as e:
            self.extern(n, outs, str(e))

    def unbacked_bindings(self, n: torch.fx.Node) -> tuple[tuple[str, tuple], ...]:
        """The data-dependent size symbols node `n` defines, with their key paths into its
        result, under the names the rest of the graph uses."""
        bindings = n.meta.get("unbacked_bindings")
        if not bindings:
            return ()
        if self.shape_env is not None:
            from torch.fx.experimental.symbolic_shapes import resolve_unbacked_bindings

            bindings = resolve_unbacked_bindings(self.shape_env, bindings)
        return tuple((str(symbol), tuple(path)) for symbol, path in bindings.items())

    def bound_checks(self, n: torch.fx.Node) -> tuple[tuple[tuple, Any], ...]:
        """(key path, expression) for each data-dependent size node `n` defines that PyTorch
        replaced by an expression (`torch._check(x.nonzero().size(0) == 4)` makes the graph's
        sizes 4): the plan checks the value against it, as the graph's other sizes assume it.
        """
        bindings = n.meta.get("unbacked_bindings")
        if not bindings or self.shape_env is None:
            return ()
        from torch.fx.experimental.symbolic_shapes import resolve_unbacked_bindings

        bound = resolve_unbacked_bindings(self.shape_env, bindings)
        # The symbols the plan knows once the call returns: the inputs', earlier calls' and
        # this call's own.
        known = {v.name for v in self.inputs if isinstance(v, Var)} | {str(s) for s in bound}
        dims = [d for v in self.inputs if isinstance(v, Value) for d in v.shape]
        known |= free_symbols(dims)
        known |= {name for op in self.nodes if isinstance(op, ExternOp) for name, _ in op.binds}
        checks = []
        for symbol, path in bound.items():
            replaced = self.shape_env.replacements.get(symbol)
            if replaced is None or replaced == symbol:
                continue
            expr = from_sympy(replaced)
            if isinstance(expr, int) or free_symbols([expr]) <= known:
                checks.append((tuple(path), expr))
        return tuple(checks)

    def arg(self, a: Any) -> Any:
        """An FX argument as a lowering argument."""
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if isinstance(v, Value):
                return TensorInput(v.name, v.shape, v.dtype)
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        if _is_symint(a):
            return from_sympy(a)
        return a

    def lower(self, n: torch.fx.Node, outs: list) -> None:
        fn = lowering_for(n.target)
        if fn is None:
            raise NotLowerable(NO_LOWERING)
        ctx = LoweringContext(
            name=n.name,
            out_shapes=tuple(shape_of(t.shape) for _, t in outs),
            out_dtypes=tuple(_dtype(t.dtype) for _, t in outs),
            arg_meta=[a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in n.args],
        )
        args = [self.arg(a) for a in n.args]
        kwargs = {k: self.arg(v) for k, v in n.kwargs.items()}
        for a in list(args) + list(kwargs.values()):
            for t in _tensor_nodes(a):
                if t.dtype not in _COMPUTABLE:
                    raise NotLowerable(f"input dtype {t.dtype.name}")
        try:
            result = fn(ctx, *args, **kwargs)
        except NotLowerable:
            raise
        except Exception as e:  # a lowering bug must never fail the model
            raise NotLowerable(f"lowering failed: {type(e).__name__}: {e}") from e
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        if len(results) != len(outs):
            raise NotLowerable(f"lowering gave {len(results)} outputs, ATen {len(outs)}")
        for r, (_, t) in zip(results, outs):
            _check_result(r, t, self.size_points())
        values = self.add_computes(n, results, outs)
        self.env[n] = _rebuild(n.meta.get("val"), iter(values))

    def add_computes(self, n: torch.fx.Node, results: list, outs: list) -> list[Value]:
        """Graph nodes for every compute reachable from `results`; the values of `results`."""
        order: list[Compute] = []
        seen: set[Compute] = set()

        def visit(t: TensorNode) -> None:
            if isinstance(t, Compute) and t not in seen:
                seen.add(t)
                for u in inputs_of(t):
                    visit(u)
                order.append(t)

        for r in results:
            visit(r)
        base, op_name = n.name, str(n.target).removeprefix("aten.")
        value_of: dict[Compute, Value] = {}
        strides = {r: tensor_type(t).strides for r, (_, t) in zip(results, outs)}
        devices = {r: t.device.type for r, (_, t) in zip(results, outs)}
        device = outs[0][1].device.type
        for c in order:
            name = self.fresh(base if c in strides else f"{base}_{c.name}")
            ttype = TensorType(c.shape, c.dtype, devices.get(c, device), strides.get(c))
            value = self._add_value(Value(name, ttype))
            definition = _bind_inputs(c, value_of).replace(name=name)
            inputs = tuple(dict.fromkeys(self.value_named(t.name) for t in inputs_of(definition)))
            self.nodes.append(ComputeOp(op_name, inputs, (value,), definition))
            value_of[c] = value
        return [
            value_of[r] if isinstance(r, Compute) else self.value_named(r.name) for r in results
        ]

    def value_named(self, name: str) -> Value:
        return self.values[name]

    def with_effects(self, n: torch.fx.Node) -> None:
        """An op AOTAutograd ordered with an effect token: an ATen call; the token passes on."""
        token, op, *args = n.args
        val = n.meta.get("val")
        outs = _flatten_vals(val[1] if len(val) == 2 else tuple(val[1:]))
        values = self.extern(n, outs, "runs with effects", op, tuple(args), n.kwargs)
        self.env[n] = (self.env[token], *values)

    def extern(
        self,
        n: torch.fx.Node,
        outs: list,
        reason: str,
        target: Any = None,
        fx_args: tuple | None = None,
        fx_kwargs: dict | None = None,
        binds: tuple = (),
        checks: tuple = (),
    ) -> tuple:
        target = n.target if target is None else target
        fx_args = n.args if fx_args is None else fx_args
        fx_kwargs = n.kwargs if fx_kwargs is None else fx_kwargs
        inputs: list[Value] = []

        def spec(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                v = self.env[a]
                if isinstance(v, Value):
                    if v not in inputs:
                        inputs.append(v)
                    return ArgRef(inputs.index(v))
                if isinstance(v, tuple):
                    return tuple(spec_value(x) for x in v)
                return v
            if isinstance(a, (list, tuple)):
                return (
                    tuple(spec(x) for x in a) if isinstance(a, tuple) else list(spec(x) for x in a)
                )
            if _is_symint(a):
                return from_sympy(a)
            return a

        def spec_value(v: Any) -> Any:
            if isinstance(v, Value):
                if v not in inputs:
                    inputs.append(v)
                return ArgRef(inputs.index(v))
            return v

        args = tuple(_freeze(spec(a)) for a in fx_args)
        kwargs = tuple((k, _freeze(spec(v))) for k, v in fx_kwargs.items())
        values = tuple(self._new_value(n.name, tensor_type(t)) for _, t in outs)
        paths = tuple(p for p, _ in outs)
        self.nodes.append(
            ExternOp(
                str(target).removeprefix("aten."),
                tuple(inputs),
                values,
                target,
                args,
                kwargs,
                paths,
                reason,
                binds,
                checks,
            )
        )
        if target is n.target and not _is_symint(n.meta.get("val")):
            self.env[n] = _rebuild(n.meta.get("val"), iter(values))
        return values


UNBACKED_REASON = "its result defines a data-dependent size"
HIGHER_ORDER_REASON = "higher-order operator"

SCRIPT_OP_REASON = (
    "script kernel op: launched natively on the cuda and cuda-emu targets; the cpu target calls "
    "the op"
)


_COMPUTABLE = {T.f16, T.bf16, T.f32, T.f64, T.i8, T.i16, T.i32, T.i64, T.u8, T.boolean} | set(
    T.FLOAT8_TYPES
)


def _dtype(d: torch.dtype):
    dt = T.from_torch(d)
    if dt not in _COMPUTABLE:
        raise NotLowerable(f"dtype {d} is not computed by minicomp")
    return dt


def _tensor_nodes(a: Any) -> list[TensorNode]:
    if isinstance(a, TensorNode):
        return [a]
    if isinstance(a, (list, tuple)):
        return [t for x in a for t in _tensor_nodes(x)]
    return []


def _freeze(a: Any) -> Any:
    if isinstance(a, list):
        return tuple(_freeze(x) for x in a)
    return a


class _BindInputs(Mutator):
    """Replaces references to computes by TensorInputs named like their graph values."""

    def __init__(self, value_of: dict):
        super().__init__()
        self.value_of = value_of

    def visit_TensorElement(self, e: TensorElement) -> Expr:
        idx = self.visit(e.indices)
        t = e.tensor
        if isinstance(t, Compute):
            v = self.value_of[t]
            t = TensorInput(v.name, v.shape, v.dtype)
        return TensorElement(t, idx)


def _bind_inputs(c: Compute, value_of: dict) -> Compute:
    return c.replace(body=_BindInputs(value_of).visit(c.body))


def _check_result(r: Any, t: torch.Tensor, points: Sequence[dict[str, int]] = ()) -> None:
    if not isinstance(r, TensorNode):
        raise NotLowerable(f"lowering returned {type(r).__name__}")
    if r.dtype != _dtype(t.dtype):
        raise NotLowerable(f"lowering gave dtype {r.dtype.name}, ATen {t.dtype}")
    want = shape_of(t.shape)
    if len(want) != len(r.shape) or any(not _same_dim(a, b, points) for a, b in zip(r.shape, want)):
        raise NotLowerable(f"lowering gave shape {r.shape}, ATen {tuple(want)}")


# Values the size symbols take, besides the traced ones, when sizes are compared.
_SEEDS = (7, 13, 101)


def _size_points(shape_env: Any) -> list[dict[str, int]]:
    """Assignments of the graph's size symbols to compare sizes at: the values traced, then
    the _SEEDS assignments that pass every guard of `shape_env`.

    A size is only meaningful where the guards hold: reshape((22, -1, 6)) of an (1, s97, s69)
    tensor has ATen size s69*s97 // (22*(s69*s97 // 132)), equal to 6 under the guard that
    132 divides s69*s97 and a division by zero at s97 = 7, s69 = 10."""
    if shape_env is None:
        return []
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:
        hints = shape_env.var_to_val
    symbols = sorted(hints, key=str)
    points = [{str(k): int(v) for k, v in hints.items() if isinstance(v, sympy.Integer)}]
    for seed in _SEEDS:
        values = {k: sympy.Integer(seed + 3 * j) for j, k in enumerate(symbols)}
        if all(_guard_holds(g.expr, values) for g in shape_env.guards):
            points.append({str(k): int(v) for k, v in values.items()})
    return points


def _guard_holds(guard: Any, values: dict) -> bool:
    """False only where `guard` evaluates to false at `values` (one it cannot evaluate, of
    symbols without a value, holds)."""
    try:
        return guard.xreplace(values) is not sympy.false
    except (ZeroDivisionError, TypeError, ValueError):
        return False


def _same_dim(a: Any, b: Any, points: Sequence[dict[str, int]] = ()) -> bool:
    """Whether sizes `a` and `b` are equal: structurally, or by value at `points` (where the
    graph's guards hold; _SEEDS when there are none), each symbol without a value there
    taking a seed's. A point where either divides by zero is no evidence either way."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    from minicomp.ir.symbols import evaluate_dim

    names = sorted({v.name for d in (a, b) if isinstance(d, Expr) for v in collect(d, Var)})
    for k, point in enumerate(points or [{}] * len(_SEEDS)):
        seed = _SEEDS[k % len(_SEEDS)]
        env = {n: point.get(n, seed + 3 * j) for j, n in enumerate(names)}
        try:
            if evaluate_dim(a, env) != evaluate_dim(b, env):
                return False
        except ZeroDivisionError:
            continue
    return True


def _flatten(a: Any) -> list:
    return list(a) if isinstance(a, (list, tuple)) else [a]


def _flatten_vals(val: Any) -> list[tuple[tuple[int, ...], Any]]:
    if val is None:
        return []
    if isinstance(val, torch.Tensor):
        return [((), val)]
    if isinstance(val, (list, tuple)):
        out = []
        for k, v in enumerate(val):
            if isinstance(v, torch.Tensor):
                out.append(((k,), v))
            elif v is not None and not _is_size(v):
                return []
        return out
    return []


def _is_size(v: Any) -> bool:
    # Sizes beside tensors in a result (the fused attention ops return their max sequence
    # lengths) are known when tracing: they are rebuilt as numbers, not produced at run time.
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _rebuild(val: Any, values) -> Any:
    if val is None:
        return None
    if isinstance(val, torch.Tensor):
        return next(values)
    return tuple(
        next(values)
        if isinstance(v, torch.Tensor)
        else (from_sympy(v) if _is_symint(v) else v if _is_size(v) else None)
        for v in val
    )


def import_graph(
    gm: torch.fx.GraphModule,
    frozen: Mapping[int, torch.Tensor] | None = None,
    externs: Mapping[str, str] | None = None,
) -> Graph:
    """The graph IR of an ATen-level FX graph (from AOTAutograd); the placeholders at the
    positions `frozen` names become constants holding its tensors (options.freeze), and the
    nodes `externs` names (with the reason why) stay ATen calls. The fake tensors' strides
    are first made eager's where PyTorch's fake implementations differ (restride_like_eager):
    graph outputs keep them; slice and select assignments into an input become writes into
    a view of it (write_scatters_into_views)."""
    from minicomp.dynamo.eager_strides import restride_like_eager

    restride_like_eager(gm)
    write_scatters_into_views(gm)
    return Importer(gm, frozen, externs).run()
