"""Print a program as Python source: `fn`, its steps one statement each, and `make_inputs`."""

from __future__ import annotations

from typing import Any

import torch

from minicomp.fuzz.ops import TABLE
from minicomp.fuzz.program import (
    Index,
    InputSpec,
    ListOf,
    Program,
    Ref,
    Slice,
    Step,
    TensorLiteral,
    step_refs,
)

IMPORTS = "import torch\nimport torch.nn.functional as F\n"


def render(value: Any) -> str:
    """An argument as Python source."""
    if isinstance(value, Ref):
        return value.name
    if isinstance(value, ListOf):
        return "[" + ", ".join(render(item) for item in value.items) + "]"
    if isinstance(value, Index):
        return ", ".join(_subscript_item(item) for item in value.items)
    if isinstance(value, TensorLiteral):
        if not value.values:
            return "torch.tensor([], dtype=torch.long)"
        return f"torch.tensor({list(value.values)})"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, tuple):
        inner = ", ".join(render(item) for item in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _subscript_item(item: Any) -> str:
    if isinstance(item, Slice):
        text = ":".join("" if part is None else str(part) for part in (item.start, item.stop))
        return text if item.step is None else f"{text}:{item.step}"
    if item is Ellipsis:
        return "..."
    return render(item)


def statement(step: Step, *, assign: bool = True) -> str:
    """One step as a Python statement; without `assign`, its result is not named."""
    text = TABLE[step.op].template.format(*(render(arg) for arg in step.args))
    return text if step.out is None or not assign else f"{step.out} = {text}"


def _names(names: list[str] | tuple[str, ...]) -> str:
    if len(names) == 1:
        return f"({names[0]},)"
    return ", ".join(names) if names else "()"


def function_source(program: Program, name: str = "fn") -> str:
    """The program as `def fn(inputs): ...; return outputs` (always a tuple)."""
    params = ", ".join(spec.name for spec in program.inputs)
    # A result nothing reads (an in-place op kept for its effect) is not named.
    read = {ref for step in program.steps for ref in step_refs(step)} | set(program.outputs)
    lines = [f"def {name}({params}):"]
    lines += [f"    {statement(step, assign=step.out in read)}" for step in program.steps]
    lines.append(f"    return {_names(program.outputs)}")
    return "\n".join(lines) + "\n"


def base_shape(spec: InputSpec) -> tuple[int, ...]:
    """The shape of the contiguous tensor an input is a view of."""
    shape, kind, arg = spec.shape, spec.layout.kind, spec.layout.arg
    if kind == "permuted":
        base = [0] * len(shape)
        for i, d in enumerate(arg):
            base[d] = shape[i]
        return tuple(base)
    if kind == "strided":
        return tuple(
            start + (n - 1) * step + 1 if n else start for n, (start, step) in zip(shape, arg)
        )
    if kind == "expanded":
        return tuple(1 if i in arg else n for i, n in enumerate(shape))
    return shape


def _data(spec: InputSpec, shape: tuple[int, ...]) -> str:
    seed = f"generator=gen.manual_seed({spec.seed})"
    dtype = "" if spec.dtype in (torch.float32, torch.int64) else f", dtype={spec.dtype}"
    if spec.dtype.is_floating_point:
        sizes = ", ".join(map(str, shape)) if shape else "()"
        return f"torch.randn({sizes}{dtype}, {seed})"
    if spec.dtype == torch.bool:
        return f"torch.randint(0, 2, {render(shape)}, {seed}).bool()"
    if spec.high is not None:
        low, high = 0, max(spec.high, 1)
    else:
        low, high = (0, 9) if spec.dtype == torch.uint8 else (-4, 5)
    return f"torch.randint({low}, {high}, {render(shape)}{dtype}, {seed})"


def _layout(spec: InputSpec) -> str:
    kind, arg = spec.layout.kind, spec.layout.arg
    if kind == "permuted":
        return ".t()" if len(arg) == 2 else f".permute{render(tuple(arg))}"
    if kind == "strided":
        items = [Slice(start or None, None, step if step != 1 else None) for start, step in arg]
        while items and items[-1] == Slice():
            items.pop()
        return f"[{render(Index(tuple(items)))}]" if items else ""
    if kind == "channels_last":
        return ".to(memory_format=torch.channels_last)"
    if kind == "expanded":
        return f".expand{render(spec.shape)}"
    return ""


def input_expression(spec: InputSpec) -> str:
    """The expression that makes one input, with its layout and requires_grad."""
    grad = ".requires_grad_()" if spec.requires_grad else ""
    return _data(spec, base_shape(spec)) + _layout(spec) + grad


def inputs_source(program: Program, name: str = "make_inputs") -> str:
    """`def make_inputs(): ...` returning fresh inputs, the same ones at every call."""
    lines = [f"def {name}():", "    gen = torch.Generator()"]
    lines += [f"    {spec.name} = {input_expression(spec)}" for spec in program.inputs]
    lines.append(f"    return {_names([spec.name for spec in program.inputs])}")
    return "\n".join(lines) + "\n"


def program_source(program: Program) -> str:
    """`fn` and `make_inputs` of a program, as one block of source (no imports)."""
    return function_source(program) + "\n\n" + inputs_source(program)
