"""Run a program's printed source eagerly: whole, as `fn` and `make_inputs`, or statement by
statement, keeping every named value."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from minicomp.fuzz.printer import input_expression, program_source, statement
from minicomp.fuzz.program import Program


class _Dtypes(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor):
                self.seen.add(value.dtype)
        return out


def dtypes_computed(fn: Callable, make_inputs: Callable) -> set[torch.dtype]:
    """The dtypes of the inputs and of every tensor an eager call of fn computes."""
    inputs = tuple(make_inputs())
    with _Dtypes() as mode:
        fn(*inputs)
    return mode.seen | {t.dtype for t in inputs}


def _namespace() -> dict:
    return {"torch": torch, "F": F}


def load(program: Program) -> tuple[Callable, Callable]:
    """`fn` and `make_inputs` of a program, built by executing its printed source."""
    namespace = _namespace()
    exec(compile(program_source(program), "<fuzz program>", "exec"), namespace)
    return namespace["fn"], namespace["make_inputs"]


def trace(program: Program) -> dict[str, torch.Tensor]:
    """Every input and step result of a program, by name, after running it eagerly.

    Raises what eager raises. Values mutated by later steps hold their final contents.
    """
    namespace = _namespace()
    namespace["gen"] = torch.Generator()
    for spec in program.inputs:
        exec(f"{spec.name} = {input_expression(spec)}", namespace)
    for step in program.steps:
        exec(statement(step), namespace)
    names = [spec.name for spec in program.inputs] + [s.out for s in program.steps if s.out]
    return {name: namespace[name] for name in names}


@dataclass
class Result:
    """What one run of a program gave: outputs, inputs after the call, gradients."""

    outputs: tuple[torch.Tensor, ...]
    inputs: tuple[torch.Tensor, ...]
    grads: tuple[torch.Tensor | None, ...] | None  # None without backward
    wrt: tuple[int, ...] = ()  # the positions of the inputs the gradients are of


def cotangent(output: torch.Tensor, k: int) -> torch.Tensor:
    """The gradient fed back into output k: fixed random values, in the output's dtype."""
    values = torch.randn(output.shape, generator=torch.Generator().manual_seed(1000 + k))
    return values.to(output.dtype)


def _double(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return t
    return t.detach().to(torch.float64).requires_grad_(t.requires_grad)


@dataclass
class Call:
    """One call of a program: its inputs (contents after the call), which of them required
    grad before it, and its outputs."""

    inputs: tuple[torch.Tensor, ...]
    requires_grad: tuple[bool, ...]
    outputs: tuple[torch.Tensor, ...]


@contextmanager
def _default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def forward(fn: Callable, make_inputs: Callable, *, upcast: bool = False) -> Call:
    """Call fn on fresh inputs (float64 ones with `upcast`, and float64 the default dtype
    during the call: an integer promoted to float, as by reciprocal or true division, is
    float64 too instead of a float32 that a float64 input then fails to meet in a matmul)."""
    inputs = tuple(make_inputs())
    if upcast:
        inputs = tuple(_double(t) for t in inputs)
    # Asked before the call: an input written in place by a grad-requiring value requires
    # grad after it, but it is no input to differentiate for.
    requires_grad = tuple(t.requires_grad for t in inputs)
    with _default_dtype(torch.float64) if upcast else nullcontext():
        outputs = tuple(fn(*inputs))
    return Call(inputs, requires_grad, outputs)


def gradients(call: Call) -> tuple[torch.Tensor | None, ...] | None:
    """The gradients of the inputs that required grad, each differentiable output fed its
    cotangent; None when nothing is differentiable."""
    wrt = [t for t, grad in zip(call.inputs, call.requires_grad) if grad]
    differentiable = [(k, o) for k, o in enumerate(call.outputs) if o.requires_grad]
    if not wrt or not differentiable:
        return None
    return torch.autograd.grad(
        [o for _, o in differentiable],
        wrt,
        [cotangent(o, k) for k, o in differentiable],
        allow_unused=True,
    )


def result(call: Call, grads: tuple | None) -> Result:
    """The Result of a call, detached from autograd."""
    wrt = tuple(i for i, grad in enumerate(call.requires_grad) if grad)
    return Result(
        tuple(o.detach() for o in call.outputs), tuple(t.detach() for t in call.inputs), grads, wrt
    )


def evaluate(
    fn: Callable, make_inputs: Callable, *, backward: bool, upcast: bool = False
) -> Result:
    """Call fn on fresh inputs and, with `backward`, take the gradients too."""
    call = forward(fn, make_inputs, upcast=upcast)
    return result(call, gradients(call) if backward else None)
