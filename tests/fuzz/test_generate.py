"""The program generator: programs eager accepts, the same from the same seed, covering every
op family, sizes 0 and 1, every layout and the dtypes."""

import random
from collections import Counter

import pytest
import torch

from minicomp.fuzz.generate import generate
from minicomp.fuzz.ops import FAMILIES, TABLE
from minicomp.fuzz.ops.draw import Draw, Value
from minicomp.fuzz.program import InputSpec, Layout, Program, Ref, Step
from minicomp.fuzz.run import evaluate, load, trace

SEEDS = range(150)


@pytest.fixture(scope="module")
def programs():
    return [generate(seed) for seed in SEEDS]


def test_a_seed_gives_the_same_program_every_time():
    assert generate(41) == generate(41)
    assert generate(41) != generate(42)


def test_programs_run_eagerly_forward_and_backward(programs):
    for program in programs[:60]:
        fn, make_inputs = load(program)
        backward = any(spec.requires_grad for spec in program.inputs)
        result = evaluate(fn, make_inputs, backward=backward)
        assert len(result.outputs) == len(program.outputs) >= 1


def test_every_family_is_drawn(programs):
    table_families = {op.family for op in TABLE.values()}
    assert table_families == set(FAMILIES)
    drawn = Counter(TABLE[step.op].family for p in programs for step in p.steps)
    assert set(drawn) == set(FAMILIES), f"never drawn: {set(FAMILIES) - set(drawn)}"


def test_inputs_have_sizes_0_and_1_every_layout_and_many_dtypes(programs):
    inputs = [spec for p in programs for spec in p.inputs]
    sizes = {size for spec in inputs for size in spec.shape}
    assert {0, 1} <= sizes
    assert {spec.layout.kind for spec in inputs} == {
        "contiguous",
        "permuted",
        "strided",
        "channels_last",
        "expanded",
    }
    dtypes = {spec.dtype for spec in inputs}
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool} <= dtypes
    assert any(spec.requires_grad for spec in inputs)
    assert any(spec.shape == () for spec in inputs)


SCOPE = (
    InputSpec("a", (3, 4), torch.float32, seed=1),
    InputSpec("b", (2, 3, 4), torch.float32, seed=2),
    InputSpec("c", (2, 3, 4, 5), torch.float32, seed=3),
    InputSpec("d", (4,), torch.int64, seed=4),
    InputSpec("e", (3, 4), torch.bool, seed=5),
    InputSpec("f", (4, 4), torch.float16, seed=6),
    InputSpec("g", (4, 3), torch.float32, seed=7, layout=Layout("permuted", (1, 0))),
    InputSpec("h", (1, 3), torch.float32, seed=8),
)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_op_has_applications_eager_accepts(name):
    opdef, scope = TABLE[name], trace(Program(SCOPE, (), ()))
    for seed in range(60):
        added = []

        def new_input(shape, dtype, high, requires_grad, added=added):
            added.append(InputSpec(f"n{len(added)}", shape, dtype, 1, high=high))
            return Ref(added[-1].name)

        values = [Value(n, t, True) for n, t in scope.items()]
        args = opdef.draw(Draw(random.Random(seed), values, new_input))
        if args is None:
            continue
        step = Step(None if opdef.statement else "out", name, tuple(args))
        program = Program(SCOPE + tuple(added), (step,), ())
        try:
            trace(program)
        except Exception:
            continue
        return
    pytest.fail(f"op {name}: no draw out of 60 that eager accepts")


def test_layouts_make_the_strides_they_name():
    def spec(kind, arg=(), shape=(3, 4)):
        return InputSpec("a", shape, torch.float32, seed=1, layout=Layout(kind, arg))

    program = Program((spec("permuted", (1, 0)),), (), ())
    assert trace(program)["a"].stride() == (1, 3)
    program = Program((spec("strided", ((1, 2), (0, 1))),), (), ())
    assert trace(program)["a"].stride() == (8, 1)
    program = Program((spec("expanded", (0,)),), (), ())
    assert trace(program)["a"].stride() == (0, 1)
    program = Program((spec("channels_last", shape=(2, 3, 4, 5)),), (), ())
    assert trace(program)["a"].is_contiguous(memory_format=torch.channels_last)
