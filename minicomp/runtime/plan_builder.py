"""From a scheduled graph and its built kernels to an execution plan: a slot for every value,
a step for every operator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicomp.backends.c_like import narrow_bits
from minicomp.backends.cuda.tensor_map import TensorMapArgument
from minicomp.ir import types as T
from minicomp.ir.collectives import is_collective, is_wait
from minicomp.ir.expr import Const, Expr, Var
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp, Graph, KernelOp, Value
from minicomp.ir.scratch import Scratch
from minicomp.ir.symbols import free_symbols, launch_dims
from minicomp.ir.types import fits
from minicomp.passes.graph.layout import eager_stride_reads
from minicomp.runtime.plan import (
    ExternStep,
    KernelStep,
    LaunchStep,
    Plan,
    SlotInfo,
    Step,
    dims_fn,
)


class PlanBuilder:
    """Assigns a slot to every value and turns operators into plan steps."""

    def __init__(
        self,
        graph: Graph,
        layouts: dict,
        kernels: dict[str, Callable],
        symbols: dict[str, list[str]],
        scratch: dict[str, tuple[Scratch, ...]] | None = None,
        maps: dict[str, tuple[TensorMapArgument, ...]] | None = None,
    ):
        self.graph = graph
        self.layouts = layouts
        self.kernels = kernels
        self.symbols = symbols
        self.scratch = scratch or {}
        self.maps = maps or {}
        self.scratch_constants: dict[int, torch.Tensor] = {}
        self.slot: dict[str, int] = {}
        self.slots: list[SlotInfo] = []
        # Symbols ATen calls bind while the plan runs: values sized by them cannot live in
        # the workspace, which is laid out when a call starts.
        self.late = {s for n in graph.nodes if isinstance(n, ExternOp) for s, _ in n.binds}

    def add_slot(self, v: Value, workspace: bool = False, strides: tuple | None = None) -> int:
        k = len(self.slots)
        self.slot[v.name] = k
        self.slots.append(
            SlotInfo(
                v.name,
                dims_fn(v.shape),
                dims_fn(self.layouts[v.name] if strides is None else strides),
                T.to_torch(v.dtype),
                v.type.device,
                workspace,
            )
        )
        return k

    def add_constant_slot(self, name: str, t: torch.Tensor) -> int:
        k = len(self.slots)
        self.slot[name] = k
        info = SlotInfo(name, dims_fn(t.shape), dims_fn(self.layouts[name]), t.dtype, t.device.type)
        self.slots.append(info)
        return k

    def build(self) -> Plan:
        g = self.graph
        outputs = g.output_values()
        inputs, binders, checked = [], [], []
        written = set(g.input_writes.values())
        kernel_reads = {v for n in g.nodes if isinstance(n, _LAUNCHED) for v in n.inputs}
        kernel_reads |= eager_stride_reads(g)
        for pos, v in enumerate(g.inputs):
            if isinstance(v, Var):
                inputs.append(("symbol", v.name))
                continue
            k = self.add_slot(v)
            inputs.append(("tensor", k))
            if v in kernel_reads or v.name in written:
                checked.append(k)
            for d, size in enumerate(v.shape):
                if isinstance(size, Var):
                    binders.append((pos, d, size.name))
        constants = {}
        returned = {v.name: v for v in outputs}
        for name, t in g.constants.items():
            # A returned constant is copied out with the strides PyTorch gave the value.
            v = returned.get(name)
            if v is not None and v.type.strides is not None:
                constants[self.add_slot(v, strides=v.type.strides)] = t
            else:
                constants[self.add_constant_slot(name, t)] = t
        steps: list[Step] = []
        fresh = []
        escaping = escaping_values(g)
        for n in g.nodes:
            for v in n.outputs:
                if v.name in self.slot:
                    continue
                if v.name in g.input_writes:  # a kernel writes it into an input (or view)
                    self.slot[v.name] = self.slot[g.input_writes[v.name]]
                    continue
                internal = isinstance(n, _LAUNCHED) and v not in escaping and not self.is_late(v)
                k = self.add_slot(v, workspace=internal)
                if isinstance(n, _LAUNCHED) and not internal:
                    fresh.append(k)
            if isinstance(n, FusedOp):
                steps.append(self.kernel_step(n))
            elif isinstance(n, KernelOp):
                steps.append(self.launch_step(n))
            else:
                steps.append(self.extern_step(n))
        extern_reads = {k for s in steps if isinstance(s, ExternStep) for k in s.reads}
        # A tensor map is encoded from its buffer's tensor (its address and device).
        extern_reads |= {
            s.buffers[m.buffer] for s in steps if isinstance(s, KernelStep) for m in s.maps
        }
        tensors = any(getattr(f, "takes_tensors", False) for f in self.kernels.values())
        for k, info in enumerate(self.slots):
            # Workspace intermediates only kernels read are passed as bare addresses.
            info.as_tensor = not info.workspace or k in extern_reads or tensors
        outs = []
        for o in g.outputs:
            if o is None:
                outs.append(("none", None))
            elif isinstance(o, Value):
                outs.append(("slot", self.slot[o.name]))
            elif isinstance(o, Expr):
                fn = dims_fn([o])
                outs.append(("size", lambda env, fn=fn: fn(env)[0]))
            else:
                outs.append(("size", lambda env, o=o: o))
        constants.update(self.scratch_constants)
        written = frozenset(self.slot[v.name] for v in written_values(g))
        return Plan(self.slots, inputs, steps, outs, constants, fresh, binders, checked, written)

    def is_late(self, v: Value) -> bool:
        """Whether the size or layout of `v` uses a symbol bound while the plan runs."""
        return bool(self.late) and not self.late.isdisjoint(
            free_symbols((*v.shape, *self.layouts[v.name]))
        )

    def kernel_step(self, n: FusedOp) -> KernelStep:
        buffers = [self.slot[v.name] for v in n.inputs + n.outputs]
        device = n.outputs[0].type.device if n.outputs else "cpu"
        buffers += [self.scratch_slot(n.name, s, device) for s in self.scratch.get(n.name, ())]
        outputs = [self.slot[v.name] for v in n.outputs]
        maps = self.maps.get(n.name, ())
        return KernelStep(
            n.name, self.kernels[n.name], buffers, outputs, self.symbols[n.name], maps
        )

    def scratch_slot(self, kernel: str, s: Scratch, device: str) -> int:
        """A slot for scratch parameter `s` of `kernel` (LaunchAttrs.scratch): zeroed memory
        is the plan's own, allocated here once (a constant the kernel writes, and leaves zero);
        the rest is workspace, live during the launch only (it shares bytes with the
        intermediates of other steps)."""
        k = len(self.slots)
        shape, strides = dims_fn((s.elements,)), dims_fn((1,))
        name = f"{kernel}.{s.param}"
        self.slots.append(SlotInfo(name, shape, strides, s.dtype, device, not s.zeroed))
        if s.zeroed:
            self.scratch_constants[k] = s.allocate(device)
        return k

    def launch_step(self, n: KernelOp) -> LaunchStep:
        values = n.inputs + n.outputs
        maps = self.maps.get(n.function.name, ())
        # The tensor-map parameters come first; the launch's arguments are for the rest.
        pairs = list(zip(n.function.params[len(maps) :], n.args))
        buffers = [self.slot[values[a.index].name] for _, a in pairs if isinstance(a, ArgRef)]
        scalars = [(p, a) for p, a in pairs if not isinstance(a, ArgRef)]
        if any(isinstance(a, ArgRef) for _, a in pairs[len(buffers) :]):
            raise ValueError(f"kernel {n.function.name} takes a pointer after a scalar")
        outputs = [self.slot[v.name] for v in n.outputs]
        fn = self.kernels[n.function.name]
        scalars_of, dims = _scalars_builder(scalars), launch_dims(n.function)
        return LaunchStep(n.name, fn, buffers, outputs, (), maps, scalars=scalars_of, dims=dims)

    def extern_step(self, n: ExternOp) -> ExternStep:
        reads = [self.slot[v.name] for v in n.inputs]
        args_fn = _args_builder(n, reads)
        # A collective's result is not ready before its wait: it is taken as c10d makes it.
        restrided = not (is_collective(n.target) and not is_wait(n.target))
        expected = [
            dims_fn(v.type.strides) if v.type.strides is not None and restrided else None
            for v in n.outputs
        ]
        return ExternStep(
            n.name,
            n.target,
            args_fn,
            [self.slot[v.name] for v in n.outputs],
            n.result_paths,
            expected,
            reads,
            reads if n.returns_views else [],
            n.binds,
            [(path, dims_fn([want]), want) for path, want in n.checks],
        )


def written_values(graph: Graph) -> set[Value]:
    """The values an operator writes into: those ATen calls mutate (the arguments their
    schema marks written; the first of a callable that is no ATen op and says it writes it),
    and the inputs or views kernels compute values in (Graph.input_writes); with each, the
    memory a view written into shows (its first argument's, transitively)."""
    named = {v.name: v for n in graph.nodes for v in n.outputs}
    named.update((v.name, v) for v in graph.inputs if isinstance(v, Value))
    out = {named[name] for name in graph.input_writes.values()}
    for n in graph.nodes:
        if not isinstance(n, ExternOp) or not n.mutates:
            continue
        schema = getattr(n.target, "_schema", None)
        written = (
            [k for k, a in enumerate(schema.arguments) if a.alias_info and a.alias_info.is_write]
            if schema is not None
            else [0]
        )
        for k in written:
            a = n.args[k] if k < len(n.args) else None
            refs = a if isinstance(a, tuple) else (a,)
            out.update(n.inputs[r.index] for r in refs if isinstance(r, ArgRef))
    # A view written into writes the memory it views.
    for n in reversed(graph.nodes):
        first = n.args[0] if isinstance(n, ExternOp) and n.args else None
        if isinstance(first, ArgRef) and n.returns_views and out.intersection(n.outputs):
            out.add(n.inputs[first.index])
    return out


def escaping_values(graph: Graph) -> set[Value]:
    """The values whose memory the graph returns, or that c10d may read after the step that
    passed it: its outputs and the inputs of collectives (minicomp.ir.collectives), and the
    memory under the ones that an ATen call returning a view of its first argument (or writing
    into it) made."""
    escaping = set(graph.output_values())
    for n in graph.nodes:
        if isinstance(n, ExternOp) and is_collective(n.target) and not is_wait(n.target):
            escaping.update(n.inputs)
    for n in reversed(graph.nodes):
        if isinstance(n, ExternOp) and n.returns_views and escaping.intersection(n.outputs):
            first = n.args[0] if n.args else None
            escaping.update([n.inputs[first.index]] if isinstance(first, ArgRef) else n.inputs)
    return escaping


# Operators the plan launches as kernels of its own module.
_LAUNCHED = (FusedOp, KernelOp)


def _scalars_builder(scalars: list[tuple[Var, Expr]]) -> Callable[[dict], list]:
    """A function of the size binding giving a kernel's scalar arguments, in the form its
    launcher takes (f16, bf16 and float8 as their bits; integers checked to fit)."""
    getters = []
    for p, a in scalars:
        dt = p.type
        if isinstance(a, Const):
            value = narrow_bits(float(a.value), dt) if T.is_narrow_float(dt) else a.value
            getters.append(lambda env, value=value: value)
            continue
        size = dims_fn([a])

        def get(env: dict, size=size, dt=dt, name=p.name) -> int:
            value = size(env)[0]
            if not fits(value, dt):
                raise ValueError(f"kernel argument {name} = {value} does not fit in {dt.name}")
            return value

        getters.append(get)
    return lambda env: [g(env) for g in getters]


def _args_builder(n: ExternOp, reads: list[int]) -> Callable:
    """A function of the slots and the size binding giving the call's (args, kwargs)."""
    if all(isinstance(a, ArgRef) or not _varies(a) for a in (*n.args, *dict(n.kwargs).values())):
        return _static_args_builder(n, reads)

    def conv(a: Any, slots: list, env: dict) -> Any:
        if isinstance(a, ArgRef):
            return slots[reads[a.index]]
        if isinstance(a, Expr):
            return dims_fn([a])(env)[0]
        if isinstance(a, tuple):
            return [conv(x, slots, env) for x in a]
        return a

    def build(slots: list, env: dict) -> tuple:
        args = tuple(conv(a, slots, env) for a in n.args)
        kwargs = {k: conv(v, slots, env) for k, v in n.kwargs}
        return args, kwargs

    return build


def _varies(a: Any) -> bool:
    """Whether an ExternOp argument depends on the slots or the size binding."""
    if isinstance(a, ArgRef | Expr):
        return True
    return isinstance(a, tuple) and any(_varies(x) for x in a)


def _constant(a: Any) -> Any:
    """A constant argument as the call takes it (sequences as lists, as `conv` makes them)."""
    return [_constant(x) for x in a] if isinstance(a, tuple) else a


def _static_args_builder(n: ExternOp, reads: list[int]) -> Callable:
    """The builder of a call whose arguments are values or constants, none of them a size
    expression (static shapes: views, library calls): a template filled with the values.
    It runs on every call of every ATen step, so it does no more than that."""
    args = [None if isinstance(a, ArgRef) else _constant(a) for a in n.args]
    filled = [(k, reads[a.index]) for k, a in enumerate(n.args) if isinstance(a, ArgRef)]
    kwargs = {k: None if isinstance(v, ArgRef) else _constant(v) for k, v in n.kwargs}
    filled_kw = [(k, reads[v.index]) for k, v in n.kwargs if isinstance(v, ArgRef)]

    def build(slots: list, env: dict) -> tuple:
        call = args.copy()
        for k, slot in filled:
            call[k] = slots[slot]
        if not filled_kw:
            return call, kwargs  # `target(*args, **kwargs)` copies it: sharing is safe
        named = dict(kwargs)
        for k, slot in filled_kw:
            named[k] = slots[slot]
        return call, named

    return build
