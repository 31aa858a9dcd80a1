"""Draw a random program from a seed: inputs of varied shapes (0 and 1 included), dtypes and
layouts, then ops from the table, each run eagerly as drawn so that eager accepts the program
(an op application eager rejects is drawn again)."""

from __future__ import annotations

import random
import string
import warnings
from dataclasses import replace

import torch

from minicomp.fuzz.ops import FAMILY_WEIGHTS, ops_of
from minicomp.fuzz.ops.draw import DTYPES, MAX_NUMEL, Draw, Value, numel
from minicomp.fuzz.program import InputSpec, Layout, Program, Ref, Step, step_refs
from minicomp.fuzz.run import evaluate, load, trace

MAX_STEPS = 10
MAX_INPUTS = 6
# Draws tried per step before the program stops growing.
ATTEMPTS = 25
INPUT_NUMEL = 1024
# Small sizes mostly, 0 and 1 among them; a few past a vector width, a warp or a block's loop.
_SIZES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 33, 100, 257)
_SIZE_WEIGHTS = (2, 10, 12, 12, 10, 8, 6, 5, 5, 3, 2, 2, 1, 1)
_INPUT_DTYPES = DTYPES + (torch.int8, torch.uint8)


def _shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4, 4))
    while True:
        shape = tuple(rng.choices(_SIZES, _SIZE_WEIGHTS, k=rank))
        if numel(shape) <= INPUT_NUMEL:
            return shape


def _layout(rng: random.Random, shape: tuple[int, ...]) -> Layout:
    rank, roll = len(shape), rng.random()
    if rank >= 2 and roll < 0.15:
        perm = list(range(rank))
        while perm == sorted(perm):
            rng.shuffle(perm)
        return Layout("permuted", tuple(perm))
    if rank >= 1 and roll < 0.3:
        arg = tuple((rng.choice((0, 0, 1)), rng.choice((1, 1, 2, 3))) for _ in shape)
        if any(pair != (0, 1) for pair in arg):
            return Layout("strided", arg)
    if rank == 4 and roll < 0.4:
        return Layout("channels_last")
    wide = [i for i, n in enumerate(shape) if n > 1]
    if wide and roll < 0.45:
        return Layout("expanded", tuple(sorted(rng.sample(wide, rng.randint(1, len(wide))))))
    return Layout()


def draw_input(rng: random.Random, name: str) -> InputSpec:
    """A random input: shape, dtype, layout and requires_grad."""
    shape = _shape(rng)
    dtype = rng.choice(_INPUT_DTYPES)
    requires_grad = dtype.is_floating_point and rng.random() < 0.5
    return InputSpec(name, shape, dtype, rng.randrange(1 << 16), _layout(rng, shape), requires_grad)


class _Builder:
    """A program growing one validated step at a time."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.inputs: list[InputSpec] = []
        self.steps: list[Step] = []
        self.values: dict[str, torch.Tensor] = {}
        self.pending: list[InputSpec] = []  # inputs the op being drawn added

    def name(self) -> str:
        """The name of the next input: a, b, c..."""
        return string.ascii_lowercase[len(self.inputs) + len(self.pending)]

    def add_input(self, shape, dtype, high, requires_grad) -> Ref:
        """A new input for the op being drawn (kept if the step is)."""
        if len(self.inputs) + len(self.pending) >= MAX_INPUTS:
            raise _TooManyInputs
        seed = self.rng.randrange(1 << 16)
        spec = InputSpec(self.name(), shape, dtype, seed, requires_grad=requires_grad, high=high)
        self.pending.append(spec)
        return Ref(spec.name)

    def scope(self) -> list[Value]:
        """The values a step may read."""
        input_names = {spec.name for spec in self.inputs}
        return [Value(n, t, n in input_names) for n, t in self.values.items() if _readable(t)]

    def try_step(self) -> bool:
        """Draw one op application and keep it if eager runs it; True when kept."""
        family = self.rng.choices(list(FAMILY_WEIGHTS), list(FAMILY_WEIGHTS.values()))[0]
        opdef = self.rng.choice(ops_of(family))
        self.pending = []
        try:
            args = opdef.draw(Draw(self.rng, self.scope(), self.add_input))
        except _TooManyInputs:
            return False
        if args is None:
            return False
        out = None if opdef.statement else f"v{len(self.steps)}"
        step = Step(out, opdef.name, tuple(args))
        candidate = Program(tuple(self.inputs + self.pending), (*self.steps, step), ())
        try:
            values = trace(candidate)
        except Exception:
            return False
        if out is not None and not _acceptable(values[out]):
            return False
        self.inputs += self.pending
        self.steps.append(step)
        self.values = values
        return True


class _TooManyInputs(Exception):
    pass


def _readable(t: torch.Tensor) -> bool:
    """Whether eager lets a step read t: not a view from unbind or split whose base a later
    step wrote in place."""
    try:
        torch.isfinite(t)
    except RuntimeError:
        return False
    return True


def _acceptable(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and not value.is_complex()
        and value.numel() <= MAX_NUMEL
        and value.dim() <= 6
    )


def _outputs(rng: random.Random, steps: list[Step]) -> tuple[str, ...]:
    """The last value, and up to two values no later step reads (so that few steps are dead)."""
    last = steps[-1]
    first = last.out if last.out is not None else last.args[0].name
    read = {name for step in steps for name in step_refs(step)}
    unread = [s.out for s in steps if s.out is not None and s.out not in read and s.out != first]
    return (first, *rng.sample(unread, min(len(unread), rng.choice((1, 2, 2)))))


def _backward_works(program: Program) -> bool:
    fn, make_inputs = load(program)
    try:
        evaluate(fn, make_inputs, backward=True)
    except Exception:
        return False
    return True


def generate(seed: int, *, max_steps: int = MAX_STEPS) -> Program:
    """The program of a seed: the same seed gives the same program."""
    rng = random.Random(seed)
    builder = _Builder(rng)
    for _ in range(rng.randint(1, 3)):
        builder.inputs.append(draw_input(rng, builder.name()))
    builder.values = trace(Program(tuple(builder.inputs), (), ()))
    wanted = rng.randint(1, max_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(wanted * ATTEMPTS):
            if len(builder.steps) >= wanted:
                break
            builder.try_step()
        if not builder.steps:
            builder.steps.append(Step("v0", "clone", (Ref(builder.inputs[0].name),)))
        program = Program(tuple(builder.inputs), tuple(builder.steps), _outputs(rng, builder.steps))
        if any(spec.requires_grad for spec in program.inputs) and not _backward_works(program):
            program = without_grad(program)
    return program


def without_grad(program: Program) -> Program:
    """The program with no input requiring grad."""
    inputs = tuple(replace(spec, requires_grad=False) for spec in program.inputs)
    return replace(program, inputs=inputs)
