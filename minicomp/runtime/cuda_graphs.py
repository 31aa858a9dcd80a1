"""Running a CUDA plan through CUDA graphs (ARCHITECTURE.md decision 8).

The first call runs the plan as it is (a warm-up: cuBLAS handles, lazy ATen state). The second
captures it and replays it, and every later call replays:
- activation inputs are copied into static buffers the graph was captured with; parameters and
  buffers (AOTAutograd's static inputs) are captured in place, and a call passing one at a new
  address captures again (at most MAX_CAPTURES times, then the plan runs uncaptured);
- the workspace and the kernels' output tensors are allocated once, outside the capture;
- steps that cannot be captured (an ATen op that synchronises with the host, touches CPU
  tensors or has host effects; a collective or its wait; the check of the integer division
  error flag, which reads it on the host) split the plan into segments: each run of
  capturable steps is one graph, the others run eagerly between replays and their results are
  copied into the tensors the next graph was captured with;
- outputs are the graph's own tensors, not copies, while callers let go of each call's results
  before the next call (a training step: the activations saved for backward are freed by it).
  Before a replay, the use counts of the output storages say whether a result, or a view of
  one, is still held; if so the replay would overwrite it, so the call runs uncaptured (as do
  later ones until that result is dropped) and from then on outputs are copied out of the
  graph's memory (a caller that keeps results, such as an inference loop assigning each result
  over the last, pays a copy, never a wrong value).
Inputs the plan writes into (an inference graph's mutated inputs: a KV cache) are captured in
place when they are static inputs at the layout the kernels expect, so each replay writes the
caller's tensor; any other is copied into its static buffer before a replay and back after it.
Plans with symbolic sizes are not captured (one graph per size binding is future work).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minicomp.ir.collectives import is_collective, is_wait
from minicomp.runtime.plan import (
    CheckErrorFlag,
    ExternStep,
    KernelStep,
    Plan,
    ResetErrorFlag,
    Step,
)

MAX_CAPTURES = 8

log = logging.getLogger(__name__)

# ATen ops whose CUDA implementations wait for the device or read results on the host.
SYNCING_OPS = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "equal",
        "is_nonzero",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "bincount",
        "histc",
        "repeat_interleave",
        "allclose",
        "_assert_scalar",
        "sym_constrain_range",
    }
)


def capturable(step: Step, devices: Sequence[str]) -> bool:
    """Whether `step` can be recorded in a CUDA graph; `devices` gives each slot's device."""
    if isinstance(step, (KernelStep, ResetErrorFlag)):
        return True
    if isinstance(step, CheckErrorFlag):
        return step.flag.on_device  # an asynchronous assert on cuda, a host read elsewhere
    if not isinstance(step, ExternStep):
        return False
    target = step.target
    if not isinstance(target, torch._ops.OpOverload):
        return False  # higher-order ops (with_effects...) and Python callables
    if target._schema.name.split("::")[-1] in SYNCING_OPS:
        return False
    if is_collective(target):
        # c10d keeps per-call state on the host (the work a wait looks up by tensor), which
        # a replay would not redo: collectives and waits run eagerly between segments.
        return False
    touched = set(step.reads) | set(step.outputs)
    return all(devices[k] != "cpu" for k in touched)


def segments(steps: Sequence[Step], devices: Sequence[str]) -> list[tuple[bool, list[Step]]]:
    """`steps` cut into maximal runs of capturable and uncapturable steps, in order."""
    out: list[tuple[bool, list[Step]]] = []
    for step in steps:
        ok = capturable(step, devices)
        if out and out[-1][0] == ok:
            out[-1][1].append(step)
        else:
            out.append((ok, [step]))
    return out


class TorchGraph:
    """A torch.cuda.CUDAGraph capturing one segment; segments of a plan share a memory pool."""

    def __init__(self, pool: Any):
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], None]) -> None:
        """Record what `fn` launches (it does not run)."""
        with torch.cuda.graph(self.graph, pool=self.pool):
            fn()

    def replay(self) -> None:
        self.graph.replay()


def torch_graphs() -> Callable[[], TorchGraph]:
    """A factory of TorchGraphs sharing one new memory pool."""
    pool = torch.cuda.graph_pool_handle()
    return lambda: TorchGraph(pool)


@dataclass
class _Segment:
    graph: Any  # a captured graph, or None for steps run eagerly
    steps: list[Step]
    fixed: dict[int, torch.Tensor]  # eager segments: the tensors later graphs read


class _Captured:
    """One capture of a plan: static buffers, the fixed slots, the segments."""

    def __init__(self, plan: Plan, args: Sequence[Any], static: set[int], new_graph):
        self.plan = plan
        self.copied: list[tuple[int, torch.Tensor]] = []  # (argument position, static buffer)
        self.in_place: dict[int, int] = {}  # argument position -> captured address
        # Inputs the plan writes into (a KV cache) that were copied into a static buffer:
        # the buffer is copied back into the caller's tensor after each replay.
        self.written: list[tuple[int, torch.Tensor]] = []
        written = {pos for pos, _ in plan.written_inputs}
        call_args = list(args)
        env = plan.bind(args)
        checked = set(plan.checked_inputs)
        for pos, ((kind, slot), a) in enumerate(zip(plan.inputs, args)):
            if kind != "tensor":
                continue
            # A buffer in the layout the kernels expect: the plan's own restriding copy would
            # happen outside the graph, once.
            want = plan.slots[slot].strides(env) if slot in checked else tuple(a.stride())
            if pos in static and (tuple(a.stride()) == want or a.numel() <= 1):
                self.in_place[pos] = a.data_ptr()
            else:
                buf = torch.empty_strided(a.shape, want, dtype=a.dtype, device=a.device)
                self.copied.append((pos, buf.copy_(a)))
                call_args[pos] = buf
                if pos in written:
                    self.written.append((pos, buf))
        self.slots, self.env = plan.prepare(call_args)
        owned = {b.untyped_storage().data_ptr() for _, b in self.copied}
        owned |= {t.untyped_storage().data_ptr() for t in self.slots if isinstance(t, torch.Tensor)}
        self.segments: list[_Segment] = []
        devices = [info.device for info in plan.slots]
        for ok, steps in segments(plan.steps, devices):
            if ok:
                graph = new_graph()
                graph.capture(lambda steps=steps: plan.run(steps, self.slots, self.env))
                graph.replay()
                self.segments.append(_Segment(graph, steps, {}))
            else:
                plan.run(steps, self.slots, self.env)
                # A collective's result is not ready before its wait (an eager step too, the
                # only reader): copying it for later graphs would read it early, and the wait
                # would then wait on a copy c10d does not know.
                outs = {k for s in steps if not _unready(s) for k in s.outputs}
                fixed = {k: self.slots[k] for k in outs if isinstance(self.slots[k], torch.Tensor)}
                self.segments.append(_Segment(None, steps, fixed))
        self.write_back(args)
        storages = _output_storages(plan.collect(self.slots, self.env), owned)
        # Counted once the outputs list is gone: only the capture's references (and ours).
        self.held = [(st, _use_count(st)) for st in storages]

    def outputs(self, copy: bool = True) -> list:
        """The graph's outputs as the slots hold them now: copied out, or (`copy` False) new
        tensors on the graph's memory, which the next replay overwrites."""
        outs = self.plan.collect(self.slots, self.env)
        if copy:
            return [_detach(o) for o in outs]
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]

    def free(self) -> bool:
        """Whether no output handed out before (nor a view of one) is still alive: the use
        count of each output storage is back to what the capture itself holds."""
        return all(_use_count(s) <= n for s, n in self.held)

    def matches(self, args: Sequence[Any]) -> bool:
        """Whether every in-place input is still at its captured address."""
        return all(args[pos].data_ptr() == ptr for pos, ptr in self.in_place.items())

    def replay(self, args: Sequence[Any], copy: bool = True) -> list:
        """Run the captured plan on new arguments and return its outputs (see `outputs`)."""
        for pos, buf in self.copied:
            buf.copy_(args[pos])
        slots = self.slots
        for seg in self.segments:
            if seg.graph is not None:
                seg.graph.replay()
                continue
            self.plan.run(seg.steps, slots, self.env)
            for k, t in seg.fixed.items():
                if slots[k] is not t:
                    t.copy_(slots[k])
                    slots[k] = t
        self.write_back(args)
        return self.outputs(copy)

    def write_back(self, args: Sequence[Any]) -> None:
        """Copy what the plan wrote into the static buffers of written inputs back into the
        caller's tensors (in stream order, after the replay)."""
        for pos, buf in self.written:
            args[pos].copy_(buf)


def _detach(out: Any) -> Any:
    """A copy of an output living in the graph's memory (anything else as it is)."""
    return out.clone() if isinstance(out, torch.Tensor) else out


def _use_count(storage: Any) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


def _output_storages(outputs: list, owned: set[int]) -> list[Any]:
    """Each storage of the capture's own memory that an output lives on, once."""
    storages = {}
    for o in outputs:
        if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in owned:
            storages.setdefault(o.untyped_storage().data_ptr(), o.untyped_storage())
    return list(storages.values())


class GraphedPlan:
    """A CUDA plan run by CUDA graphs: warm-up on the first call, capture on the second,
    replay after (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        static_inputs: Sequence[int] = (),
        *,
        new_graph: Callable[[], Any] | None = None,
    ):
        self.plan = plan
        self.static = set(static_inputs)
        self._new_graph = new_graph
        self.calls = 0
        self.captures = 0
        self.captured: _Captured | None = None
        self.enabled, self.reason = _supported(plan)
        if self.enabled:
            note = collectives_note(plan)
            if note:
                log.info("minicomp: %s", note)
        # Hand out the graph's own outputs (no copy) until a caller keeps one across calls.
        self.direct = hasattr(torch._C, "_storage_Use_Count")

    def __call__(self, *args: Any) -> list:
        if not self.enabled or _capturing():
            return self.plan(*args)
        self.calls += 1
        if self.calls == 1:
            return self.plan(*args)
        if self.captured is None or not self.captured.matches(args):
            if self.captures == MAX_CAPTURES:
                self.enabled, self.reason = False, f"inputs moved {MAX_CAPTURES} times"
                warnings.warn(
                    "minicomp: parameters of a compiled graph keep changing address; "
                    "it runs without CUDA graphs from now on",
                    stacklevel=2,
                )
                return self.plan(*args)
            self.captured = None  # free the old capture's memory before the new one
            new_graph = self._new_graph or torch_graphs()
            # Capturing runs the plan once: segment by segment, each graph is replayed right
            # after its capture so the eager steps between them see real values.
            self.captured = _Captured(self.plan, args, self.static, new_graph)
            self.captures += 1
            return self.captured.outputs(copy=not self.direct)
        if not self.captured.free():
            # A result handed out earlier is still held: replaying would overwrite it.
            if self.direct:
                self.direct = False
                log.info("minicomp: a caller keeps results across calls; outputs are copied")
            return self.plan(*args)
        return self.captured.replay(args, copy=not self.direct)


def _unready(step: Step) -> bool:
    """Whether `step` is a collective whose results its wait makes ready."""
    return isinstance(step, ExternStep) and is_collective(step.target) and not is_wait(step.target)


def collectives_note(plan: Plan) -> str:
    """What CUDA graphs do with a plan's collective steps ("" for a plan without any): they
    run eagerly, and the steps between them are captured as separate graphs."""
    count = sum(isinstance(s, ExternStep) and is_collective(s.target) for s in plan.steps)
    if not count:
        return ""
    devices = [info.device for info in plan.slots]
    cut = segments(plan.steps, devices)
    graphs = sum(ok for ok, _ in cut)
    return (
        f"{count} collective steps (collectives and waits) run outside CUDA graphs; the plan "
        f"is captured as {graphs} graphs between them and its other eager steps"
    )


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# The in-place ATen calls on an input a plan may replay: a copy into it, or an in-place
# scatter (passes/graph/input_mutations.py), whose memory stays where it was captured.
IN_PLACE_WRITES = frozenset(
    {"copy_", "index_put_", "index_copy_", "index_add_", "index_fill_", "scatter_"}
    | {"scatter_add_", "scatter_reduce_", "masked_scatter_", "put_"}
)


def _supported(plan: Plan) -> tuple[bool, str]:
    """Whether a plan can be captured, and why not."""
    if plan.shape_binders or any(kind == "symbol" for kind, _ in plan.inputs):
        return False, "symbolic sizes"
    inputs = {slot for kind, slot in plan.inputs if kind == "tensor"}
    for step in plan.steps:
        schema = getattr(getattr(step, "target", None), "_schema", None)
        if schema is None or not schema.is_mutable or not inputs & set(step.reads):
            continue
        name = schema.name.split("::")[-1]
        if name not in IN_PLACE_WRITES:  # resize_, set_...: the memory itself may change
            return False, f"{name} mutates an input"
    return True, ""
