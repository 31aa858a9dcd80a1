"""The execution plan of a compiled graph: steps over value slots, run once per call.

Memory, per call: one workspace tensor holds every intermediate the plan's kernels write
(offsets planned by runtime/memory.py so that buffers with disjoint lifetimes share bytes);
each output a kernel writes is allocated just before the step that writes it; the results of
ATen calls are dropped after the last step reading them, as eager PyTorch drops a tensor
nothing refers to any more. `Plan.memory_stats` gives the resulting peak.

Errors: kernels that may divide integers by zero or read an index out of range take the
address of the plan's ErrorFlag (ir/error_flag.py), bound like a size symbol; the plan zeroes
it before the first such kernel and, after its last step, raises eager PyTorch's error
(`RuntimeError: ZeroDivisionError`, `IndexError: index out of range in self`) when a kernel
stored a code in it. Plans without such kernels have neither step.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from minicomp.backends.cuda.tensor_map import TensorMapArgument, encoded_maps
from minicomp.ir.error_flag import ERROR_FLAG, ERRORS
from minicomp.ir.symbols import compile_dims
from minicomp.runtime.memory import Interval, plan_offsets

Env = dict


@dataclass
class SlotInfo:
    """How a slot's tensor is laid out: shape and strides (functions of the binding), dtype."""

    name: str
    shape: Callable[[Env], tuple]
    strides: Callable[[Env], tuple]
    dtype: torch.dtype
    device: str
    workspace: bool = False  # an intermediate living in the workspace
    as_tensor: bool = True  # some step needs it as a tensor (not just an address)


class Step:
    """One thing the plan does per call."""

    name: str

    def run(self, slots: list, env: Env) -> None:
        raise NotImplementedError


@dataclass
class KernelStep(Step):
    """A call of a compiled kernel: pointer arguments from slots, then size symbols (and
    the error flag's address, bound under its name like a symbol). A kernel whose callable
    has a true `takes_tensors` attribute (a counted emulator build, which needs each buffer's
    bytes) gets the slots' tensors instead of their addresses. A kernel reading buffers by
    TMA first gets its tensor maps (`maps`, backends/cuda/tensor_map.py), encoded from the slots'
    tensors and the sizes at each call."""

    name: str
    fn: Callable
    buffers: Sequence[int]
    outputs: Sequence[int]
    symbols: Sequence[str]
    maps: Sequence[TensorMapArgument] = ()

    def __post_init__(self) -> None:
        self._pointer = _tensor if getattr(self.fn, "takes_tensors", False) else _address
        # The foreign function itself where its arity is checked here, once, not per call.
        cfunc = getattr(self.fn, "cfunc", None)
        arity = len(getattr(cfunc, "argtypes", None) or ())
        expected = len(self.maps) + len(self.buffers) + len(self.symbols)
        self._call = cfunc if arity and arity == expected and not self.maps else self.fn

    def run(self, slots: list, env: Env) -> None:
        args = [self._pointer(slots[k]) for k in self.buffers]
        sizes = [env[s] for s in self.symbols]
        if self.maps:
            args = encoded_maps(self.maps, [slots[k] for k in self.buffers], sizes) + args
        self._call(*args, *sizes)


@dataclass
class LaunchStep(KernelStep):
    """A launch of a hand-written kernel (a script kernel op, or a template a KernelOp
    launches): its tensor maps first where it has any, then pointer arguments from slots,
    then its scalar arguments, computed from the binding by `scalars`. `dims` gives the
    kernel's (grid, block) for its arguments: a grid without blocks (an empty tensor) launches
    nothing, as in the script's own launches (CUDA refuses such a launch)."""

    scalars: Callable[[Env], list] = lambda env: []
    dims: Callable[[Sequence[Any]], tuple] | None = None

    def run(self, slots: list, env: Env) -> None:
        pointers, scalars = [self._pointer(slots[k]) for k in self.buffers], self.scalars(env)
        args = pointers + scalars
        if self.dims is not None and 0 in self.dims([None] * len(self.maps) + args)[0]:
            return
        if self.maps:  # a template launched by a kernel op reading by TMA (attention_hopper)
            args = encoded_maps(self.maps, [slots[k] for k in self.buffers], scalars) + args
        self.fn(*args)


def _address(v: Any) -> int:
    return v if isinstance(v, int) else v.data_ptr()


def _tensor(v: Any) -> Any:
    return v


class ErrorFlag:
    """The int32 a plan's kernels store an error code in (ir/error_flag.py): host memory
    for the cpu and cuda-emu targets, a device tensor (allocated on first use, on the current
    device) for cuda."""

    def __init__(self, device: str):
        self.device = device
        self._host = ctypes.c_int32(0) if device == "cpu" else None
        self._tensor: torch.Tensor | None = None

    @property
    def address(self) -> int:
        """Where the int32 is: the argument the kernels get."""
        if self._host is not None:
            return ctypes.addressof(self._host)
        return self.tensor.data_ptr()

    def reset(self) -> None:
        """Set the flag to 0 (on cuda, in stream order)."""
        if self._host is not None:
            self._host.value = 0
        else:
            self._tensor.zero_()

    @property
    def on_device(self) -> bool:
        """Whether the flag is in device memory (cuda), where the host does not read it."""
        return self._host is None

    @property
    def tensor(self) -> torch.Tensor:
        """The flag as a one-element int32 device tensor (cuda only; allocated on first use)."""
        if self._tensor is None:
            self._tensor = torch.zeros(1, dtype=torch.int32, device=self.device)
        return self._tensor

    def code(self) -> int:
        """The code a kernel stored (0: none; on cuda, this waits for the kernels)."""
        if self._host is not None:
            return self._host.value
        return int(self.tensor.item())


@dataclass
class ResetErrorFlag(Step):
    """Zeroes the error flag before the first kernel that may set it (a CUDA graph captures
    it: the memset replays with the kernels)."""

    flag: ErrorFlag
    name: str = "reset_error_flag"
    outputs: Sequence[int] = ()

    def run(self, slots: list, env: Env) -> None:
        self.flag.reset()


@dataclass
class CheckErrorFlag(Step):
    """Raises eager PyTorch's error for what a kernel stored in the error flag (an integer
    division by zero, an index out of range: ERRORS).

    On cuda it does not wait for the kernels: it launches PyTorch's asynchronous assert on the
    flag, a device-side assert as eager's CUDA indexing kernels raise, reported at the next
    synchronization. A host read would cost every call a synchronization (every model with an
    embedding), and the check replays inside a CUDA graph."""

    flag: ErrorFlag
    name: str = "check_error_flag"
    outputs: Sequence[int] = ()

    def run(self, slots: list, env: Env) -> None:
        if self.flag.on_device:
            torch._assert_async(self.flag.tensor == 0, DEVICE_ERROR)
            return
        code = self.flag.code()
        if code:
            self.flag.reset()
            error, message = ERRORS.get(code, (RuntimeError, f"a kernel reported error {code}"))
            raise error(message)


DEVICE_ERROR = "minicomp: a kernel reported " + " or ".join(
    f"{error.__name__}: {message}" for error, message in ERRORS.values()
)


def _with_error_flag(
    steps: list[Step], slots: list[SlotInfo]
) -> tuple[list[Step], ErrorFlag | None]:
    """`steps` with the error flag zeroed before the first kernel taking it and checked after
    the last step, and the flag (None, and `steps` as they are, when no kernel takes one)."""
    flagged = [s for s, step in enumerate(steps) if ERROR_FLAG.name in getattr(step, "symbols", ())]
    if not flagged:
        return steps, None
    first = steps[flagged[0]]
    device = slots[first.buffers[0]].device if first.buffers else "cpu"
    flag = ErrorFlag(device)
    steps = list(steps)
    steps.insert(flagged[0], ResetErrorFlag(flag))
    steps.append(CheckErrorFlag(flag))
    return steps, flag


@dataclass
class ExternStep(Step):
    """A call of an ATen operator; tensors come from slots, sizes from the binding. A call
    whose result defines size symbols (nonzero's count, `.item()`'s value) binds each of
    `binds` (symbol, PyTorch key path into the result) before storing its outputs, whose
    expected strides may use them, and before any later step. `checks` are the sizes PyTorch
    replaced by an expression (ExternOp.checks): a result that disagrees raises, as the
    rest of the plan was built for the expression's value."""

    name: str
    target: Any
    build_args: Callable[[list, Env], tuple]
    outputs: Sequence[int]
    paths: Sequence[tuple]
    expected_strides: Sequence[Callable[[Env], tuple] | None]
    reads: Sequence[int] = ()
    # Inputs a view-like op's outputs may share memory with; they must outlive the outputs.
    aliases: Sequence[int] = ()
    binds: Sequence[tuple[str, tuple]] = ()
    checks: Sequence[tuple[tuple, Callable[[Env], tuple], Any]] = ()

    def run(self, slots: list, env: Env) -> None:
        args, kwargs = self.build_args(slots, env)
        result = self.target(*args, **kwargs)
        for name, path in self.binds:
            value = pytree.key_get(result, path)
            env[name] = value if isinstance(value, float) else int(value)
        for path, want, expr in self.checks:
            value, (expected,) = pytree.key_get(result, path), want(env)
            if value != expected:
                assumed = f"{expected}" if isinstance(expr, int) else f"{expr} = {expected}"
                raise RuntimeError(
                    f"{self.name}: result{pytree.keystr(path)} is {value}, but the graph was "
                    f"compiled for {assumed} (asserted by a torch._check or an earlier use of "
                    "the value)"
                )
        for k, path, want in zip(self.outputs, self.paths, self.expected_strides):
            t = result
            for p in path:
                t = t[p]
            if want is not None and t.numel() > 1:
                strides = want(env)
                if tuple(t.stride()) != strides:
                    t = strided_copy(t, t.shape, strides, t.device)
            slots[k] = t

    def fixed(self, env: Env) -> Callable[[list], None]:
        """`run` for a plan whose sizes are all known (FixedCall): the outputs' expected
        strides computed once, not per call."""
        if self.binds:  # data-dependent sizes: the general path
            return lambda slots: self.run(slots, env)
        build, target = self.build_args, self.target
        outputs = [
            (k, path, None if want is None else want(env))
            for k, path, want in zip(self.outputs, self.paths, self.expected_strides)
        ]

        def run(slots: list) -> None:
            args, kwargs = build(slots, env)
            result = target(*args, **kwargs)
            for k, path, strides in outputs:
                t = result
                for p in path:
                    t = t[p]
                slots[k] = t if strides is None else _restrided(t, strides)

        return run


@dataclass
class Plan:
    """A compiled graph, callable with the graph's inputs; returns the graph's outputs."""

    slots: list[SlotInfo]
    inputs: list[tuple[str, Any]]  # ("tensor", slot), ("symbol", name)
    steps: list[Step]
    outputs: list[tuple[str, Any]]  # ("slot", k), ("size", fn), ("none", None)
    constants: dict[int, torch.Tensor]
    fresh: list[int]  # slots allocated fresh per call (graph outputs written by kernels)
    shape_binders: list[tuple[int, int, str]] = field(default_factory=list)
    checked_inputs: list[int] = field(default_factory=list)
    # Input slots some step writes into: a kernel computing a value in an input's memory
    # (Graph.input_writes), an in-place ATen call on an input.
    written: frozenset[int] = frozenset()
    _layouts: dict = field(default_factory=dict)
    _workspaces: dict = field(default_factory=dict, repr=False)
    _schedule: tuple | None = field(default=None, repr=False)
    error_flag: ErrorFlag | None = field(default=None, repr=False)
    _fixed: Any = field(default=None, repr=False)
    _written: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        if self.error_flag is None:
            self.steps, self.error_flag = _with_error_flag(self.steps, self.slots)
        checked = set(self.checked_inputs)
        self._written = [(pos, k) for pos, k in self.written_inputs if k in checked]

    @property
    def written_inputs(self) -> list[tuple[int, int]]:
        """(argument position, slot) of each input the plan writes into (`written`)."""
        return [
            (pos, ref)
            for pos, (kind, ref) in enumerate(self.inputs)
            if kind == "tensor" and ref in self.written
        ]

    def write_back(self, args: Sequence[Any], slots: list) -> None:
        """Copy into the caller's tensors the inputs the plan wrote into a restrided copy of
        (prepare's: an input kernels read in other strides than it came with)."""
        for pos, k in self._written:
            if slots[k] is not args[pos]:
                args[pos].copy_(slots[k])

    def bind(self, args: Sequence[Any]) -> Env:
        env: Env = {}
        if self.error_flag is not None:
            # The kernels taking the flag get its address as they get the size symbols.
            env[ERROR_FLAG.name] = self.error_flag.address
        for (kind, ref), a in zip(self.inputs, args):
            if kind == "symbol":
                env[ref] = int(a)
        for k, dim, name in self.shape_binders:
            if name not in env:
                env[name] = int(args[k].shape[dim])
        return env

    def layout(self, env: Env) -> tuple[list[int], int]:
        """Workspace offsets for this binding (planned once per distinct binding)."""
        key = tuple(sorted(env.items()))
        hit = self._layouts.get(key)
        if hit is None:
            intervals, owners = [], []
            for k, info in enumerate(self.slots):
                if info.workspace:
                    nbytes = max(_nbytes(info.shape(env), info.dtype), _span_bytes(info, env))
                    first, last = self._lifetime(k)
                    intervals.append(Interval(nbytes, first, last))
                    owners.append(k)
            offsets, total = plan_offsets(intervals)
            hit = (dict(zip(owners, offsets)), total)
            self._layouts[key] = hit
        return hit

    def workspace(self, env: Env) -> Workspace:
        """Where the workspace's slots lie for this binding (see Workspace; made once per
        distinct binding, as the layout)."""
        key = tuple(sorted(env.items()))
        hit = self._workspaces.get(key)
        if hit is None:
            hit = self._workspaces[key] = self._workspace(env)
        return hit

    def _workspace(self, env: Env) -> Workspace:
        offsets, total = self.layout(env)
        device = self.slots[next(iter(offsets))].device if offsets else "cpu"
        views, addresses = [], []
        for k, off in offsets.items():
            info = self.slots[k]
            if info.as_tensor:
                # With the slot's strides: an ATen call may need eager's (as_strided).
                shape, strides = info.shape(env), info.strides(env)
                end = off + max(_nbytes(shape, info.dtype), _span_bytes(info, env))
                views.append((k, off, end, info.dtype, shape, strides))
            else:
                addresses.append((k, off))
        return Workspace(total, torch.device(device), views, addresses)

    def schedule(self) -> tuple[list[list[int]], list[list[int]]]:
        """Per step: the fresh output slots to allocate before it, and the slots to drop
        after it (ATen results no later step reads and the graph does not return)."""
        if self._schedule is None:
            kept = set(self.constants) | set(self.fresh)
            kept |= {ref for kind, ref in self.inputs if kind == "tensor"}
            kept |= {ref for kind, ref in self.outputs if kind == "slot"}
            kept |= {k for k, info in enumerate(self.slots) if info.workspace}
            last: dict[int, int] = {}
            first: dict[int, int] = {}
            for s, step in enumerate(self.steps):
                for k in _touched(step):
                    last[k] = s
                for k in step.outputs:
                    first.setdefault(k, s)
            allocate: list[list[int]] = [[] for _ in self.steps]
            drop: list[list[int]] = [[] for _ in self.steps]
            for k in self.fresh:
                allocate[first.get(k, 0)].append(k)
            for k, s in last.items():
                if k not in kept:
                    drop[s].append(k)
            self._schedule = (allocate, drop)
        return self._schedule

    def _lifetime(self, k: int) -> tuple[int, int]:
        family = {k}
        for step in self.steps:
            if family & set(getattr(step, "aliases", ())):
                family |= set(step.outputs)
        first, last = len(self.steps), -1
        for s, step in enumerate(self.steps):
            if _touched(step) & family:
                first, last = min(first, s), max(last, s)
        return first, last

    def __call__(self, *args: Any) -> list:
        return self.call(args)

    def entry(self) -> Callable[[Sequence[Any]], list]:
        """The cheapest way to call this plan with a sequence of arguments: its FixedCall
        where it has one, else `call`."""
        return self._fixed_call() or self.call

    def call(self, args: Sequence[Any]) -> list:
        """The graph's outputs for `args` (a sequence, as AOTAutograd's boxed calls pass)."""
        fixed = self._fixed_call()
        if fixed is not None:
            return fixed(args)
        slots, env = self.prepare(args, outputs=False)
        allocate, drop = self.schedule()
        for step, fresh, dead in zip(self.steps, allocate, drop):
            for k in fresh:
                slots[k] = self._empty(k, env)
            step.run(slots, env)
            for k in dead:
                slots[k] = None
        if self._written:
            self.write_back(args, slots)
        return self.collect(slots, env)

    def _fixed_call(self) -> FixedCall | None:
        """The call of a plan whose sizes are all known (no size symbol, none bound while it
        runs) with everything that does not change from call to call computed once; None for
        other plans."""
        if self._fixed is None:
            symbolic = self.shape_binders or any(kind == "symbol" for kind, _ in self.inputs)
            binds = any(getattr(step, "binds", ()) for step in self.steps)
            self._fixed = False if symbolic or binds else FixedCall(self)
        return self._fixed or None  # False: not a fixed plan

    def _empty(self, k: int, env: Env) -> torch.Tensor:
        info = self.slots[k]
        return torch.empty_strided(
            info.shape(env), info.strides(env), dtype=info.dtype, device=info.device
        )

    def prepare(self, args: Sequence[Any], outputs: bool = True) -> tuple[list, Env]:
        """The slots of one call (inputs, constants, workspace views and, with `outputs`, the
        outputs kernels write) and the size binding.

        A plan run step by step (CUDA graphs) allocates its outputs here, once; a plain call
        allocates each just before the step writing it (`Plan.schedule`)."""
        env = self.bind(args)
        slots: list[Any] = [None] * len(self.slots)
        for k, t in self.constants.items():
            slots[k] = t
        for (kind, ref), a in zip(self.inputs, args):
            if kind == "tensor":
                slots[ref] = a
        for k in self.checked_inputs:
            slots[k] = _restrided(slots[k], self.slots[k].strides(env))
        self.workspace(env).place(slots)
        for k in self.fresh if outputs else ():
            slots[k] = self._empty(k, env)
        return slots, env

    def memory_stats(self, *args: Any) -> MemoryStats:
        """The bytes one call with these arguments allocates (see MemoryStats)."""
        env = self.bind(args)
        _, workspace = self.layout(env)
        allocate, drop = self.schedule()
        owned: dict[int, int] = {}  # slot -> bytes it allocates
        owner: dict[int, int] = {}  # slot -> the slot whose memory it holds
        for step in self.steps:
            views = isinstance(step, ExternStep) and step.aliases
            for k in step.outputs:
                if views:
                    owner[k] = owner.get(step.aliases[0], step.aliases[0])
                elif isinstance(step, ExternStep) or k in self.fresh:
                    owned[k] = _span_bytes(self.slots[k], env)
        # Memory is freed when the last slot holding it (its own or a view's) is dropped.
        holders: dict[int, int] = {}
        live = peak = 0
        for step, fresh, dead in zip(self.steps, allocate, drop):
            for k in {*fresh, *step.outputs}:
                root = owner.get(k, k)
                holders[root] = holders.get(root, 0) + 1
                if root == k:
                    live += owned.get(k, 0)
            peak = max(peak, live)
            for k in dead:
                root = owner.get(k, k)
                holders[root] -= 1
                if holders[root] == 0:
                    live -= owned.get(root, 0)
        outputs = {ref for kind, ref in self.outputs if kind == "slot"}
        out_bytes = sum(owned.get(owner.get(k, k), 0) for k in outputs)
        return MemoryStats(workspace, out_bytes, workspace + peak)

    @staticmethod
    def run(steps: Sequence[Step], slots: list, env: Env) -> None:
        """Run `steps` in order over the slots of one call."""
        for step in steps:
            step.run(slots, env)

    def collect(self, slots: list, env: Env) -> list:
        """The graph's outputs, from the slots of a finished call."""
        return [self._output(o, slots, env) for o in self.outputs]

    def _output(self, o: tuple[str, Any], slots: list, env: Env) -> Any:
        kind, ref = o
        if kind == "slot":
            v = slots[ref]
            if ref in self.constants:
                info = self.slots[ref]
                return strided_copy(v, info.shape(env), info.strides(env), info.device)
            return v
        if kind == "size":
            return ref(env)
        return None


@dataclass(frozen=True)
class Workspace:
    """The workspace of one size binding: its bytes, its device, and where its slots lie:
    (slot, start, end, dtype, shape, strides) for those some step needs as tensors, (slot,
    offset) for those kernels take as bare addresses."""

    nbytes: int
    device: torch.device
    views: list[tuple]
    addresses: list[tuple[int, int]]

    def place(self, slots: list) -> None:
        """Allocate the workspace and put its slots in `slots` (and the workspace itself at
        the end: bare addresses keep no reference, so it lives as long as the slots)."""
        if not self.nbytes:
            return
        ws = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        for k, start, end, dtype, shape, strides in self.views:
            slots[k] = ws[start:end].view(dtype).as_strided(shape, strides)
        base = ws.data_ptr()
        for k, off in self.addresses:
            slots[k] = base + off
        slots.append(ws)


def _restrided(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """`t`, or a copy of it with `strides` where its own differ (and it has elements to
    place)."""
    if tuple(t.stride()) == strides or t.numel() <= 1:
        return t
    return strided_copy(t, t.shape, strides, t.device)


def strided_copy(
    t: torch.Tensor, shape: tuple, strides: tuple, device: torch.device
) -> torch.Tensor:
    """A new tensor on `device` laid out as (`shape`, `strides`) holding `t`'s values.

    A layout whose elements share memory (a zero stride over more than one element, as
    eager's empty_strided and expand give) is written through its storage offsets, since
    copy_ refuses to write into one; elements sharing a location hold one value there, as in
    eager."""
    out = torch.empty_strided(shape, strides, dtype=t.dtype, device=device)
    if not any(st == 0 and n > 1 for n, st in zip(shape, strides)):
        return out.copy_(t)
    flat = out.as_strided((out.untyped_storage().nbytes() // out.element_size(),), (1,))
    offsets = torch.arange(flat.numel(), device=device).as_strided(shape, strides)
    flat[offsets] = t.to(device).expand(shape)
    return out


# What Inductor's generated wrappers allocate CPU tensors with: torch.empty_strided without
# its argument parsing and dispatch, 0.33 us against 0.86 (one-op graphs: a twentieth of a call).
_EMPTY_STRIDED_CPU = getattr(torch._C._dynamo.guards, "_empty_strided_cpu", None)


def _allocator(device: torch.device) -> Callable[[tuple, tuple, torch.dtype], torch.Tensor]:
    """torch.empty_strided(shape, strides, dtype) on `device`, by the fastest path torch has."""
    if device.type == "cpu" and _EMPTY_STRIDED_CPU is not None:
        return _EMPTY_STRIDED_CPU

    def empty(shape: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    return empty


class FixedCall:
    """Plan.__call__ for a plan whose sizes are all known: the binding, the workspace layout,
    the slots' shapes and strides and what to allocate and drop around each step are the
    same on every call, so they are computed here once and a call only moves tensors."""

    def __init__(self, plan: Plan):
        env = self.env = plan.bind(())
        self.template: list[Any] = [None] * len(plan.slots)
        for k, t in plan.constants.items():
            self.template[k] = t
        self.inputs = [
            (pos, ref) for pos, (kind, ref) in enumerate(plan.inputs) if kind == "tensor"
        ]
        self.checked = [(k, plan.slots[k].strides(env)) for k in plan.checked_inputs]
        self.workspace = plan.workspace(env)
        allocate, drop = plan.schedule()
        addresses = {k for k, _ in self.workspace.addresses}
        self.steps = [
            (
                self._kernel_call(step, addresses, env),
                self._runner(step, env),
                [(k, *self._layout(plan.slots[k], env)) for k in fresh],
                dead,
            )
            for step, fresh, dead in zip(plan.steps, allocate, drop)
        ]
        # Outputs that are plain slots (no returned constant to copy, no size) are read as is.
        plain = all(kind == "slot" and ref not in plan.constants for kind, ref in plan.outputs)
        self.out_slots = [ref for _, ref in plan.outputs] if plain else None
        self.collect = plan.collect
        self.write_back = plan.write_back if plan._written else None

    @staticmethod
    def _kernel_call(step: Step, addresses: set[int], env: Env) -> tuple | None:
        """For a kernel taking addresses: its foreign function, each buffer's slot and whether
        that holds an address already, and its size arguments (fixed); else None."""
        if type(step) is not KernelStep or step._pointer is not _address or step.maps:
            return None
        buffers = [(k, k in addresses) for k in step.buffers]
        return step._call, buffers, [env[s] for s in step.symbols]

    @staticmethod
    def _runner(step: Step, env: Env) -> Callable[[list], None]:
        """What runs `step` on the slots when it is not a call of a kernel's address form."""
        if type(step) is ExternStep:
            return step.fixed(env)
        return lambda slots: step.run(slots, env)

    @staticmethod
    def _layout(info: SlotInfo, env: Env) -> tuple:
        """(allocator, shape, strides, dtype) of a slot allocated fresh on every call."""
        return _allocator(torch.device(info.device)), info.shape(env), info.strides(env), info.dtype

    def __call__(self, args: Sequence[Any]) -> list:
        slots = self.template.copy()
        for pos, k in self.inputs:
            slots[k] = args[pos]
        for k, strides in self.checked:
            slots[k] = _restrided(slots[k], strides)
        if self.workspace.nbytes:
            self.workspace.place(slots)
        for kernel, run, fresh, dead in self.steps:
            for k, empty, shape, strides, dtype in fresh:
                slots[k] = empty(shape, strides, dtype)
            if kernel is None:
                run(slots)
            else:
                call, buffers, sizes = kernel
                call(*[slots[k] if bare else slots[k].data_ptr() for k, bare in buffers], *sizes)
            for k in dead:
                slots[k] = None
        if self.write_back is not None:
            self.write_back(args, slots)
        if self.out_slots is not None:
            return [slots[k] for k in self.out_slots]
        return self.collect(slots, self.env)


@dataclass(frozen=True)
class MemoryStats:
    """What one call of a plan allocates, in bytes: the workspace (live for the whole call),
    the outputs it returns, and the peak of everything it holds at once (the workspace, the
    outputs written so far, the ATen results still to be read). ATen calls' own scratch
    memory is not counted (an eager run has it too); the inputs and constants are not (they
    exist before the call)."""

    workspace: int
    outputs: int
    peak: int


def _touched(step: Step) -> set[int]:
    """The slots a step reads or writes."""
    touched = set(getattr(step, "buffers", ())) | set(getattr(step, "outputs", ()))
    return touched | set(getattr(step, "reads", ()))


def _span_bytes(info: SlotInfo, env: Env) -> int:
    """The bytes of the memory a tensor laid out as `info` spans."""
    shape, strides = info.shape(env), info.strides(env)
    if any(d == 0 for d in shape):
        return 0
    span = 1 + sum((d - 1) * abs(s) for d, s in zip(shape, strides))
    return span * info.dtype.itemsize


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def dims_fn(dims: Sequence[Any]) -> Callable[[Env], tuple]:
    """A function of the binding giving concrete sizes."""
    return compile_dims(list(dims))
