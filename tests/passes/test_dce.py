"""Dead-code elimination, as before/expected graph pairs."""

import pytest
import torch
from graph_builder import GraphBuilder, assert_graph_equal
from helpers import assert_same, compile_minicomp

from minicomp.ir.types import f32
from minicomp.passes.graph.dce import eliminate_dead_code

aten = torch.ops.aten


def test_drops_unused_chain_keeps_used():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.compute("y", (4, 8), lambda i, j: x[i, j] * 2)
    d1 = b.compute("d1", (4, 8), lambda i, j: x[i, j] + 1)
    b.compute("d2", (4, 8), lambda i, j: d1[i, j] + y[i, j])
    b.output(y)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4, 8))
    y = e.compute("y", (4, 8), lambda i, j: x[i, j] * 2)
    e.output(y)
    assert_graph_equal(eliminate_dead_code(g), e.build())


def test_drops_unread_constants_and_dead_externs():
    b = GraphBuilder()
    x = b.input("x", (4,))
    c = b.constant("c", torch.arange(4, dtype=torch.float32))
    unused = b.constant("unused", torch.ones(4))
    b.extern("e", aten.mm.default, [unused, unused], (4,))
    y = b.compute("y", (4,), lambda i: x[i] + c[i])
    b.output(y, None)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4,))
    c = e.constant("c", torch.arange(4, dtype=torch.float32))
    y = e.compute("y", (4,), lambda i: x[i] + c[i])
    e.output(y, None)
    assert_graph_equal(eliminate_dead_code(g), e.build())


def test_keeps_everything_returned_and_returns_same_graph():
    b = GraphBuilder()
    s = b.symbol("s")
    x = b.input("x", (s,), f32)
    y = b.compute("y", (s,), lambda i: x[i] * 3)
    z = b.compute("z", (s,), lambda i: y[i] - x[i])
    c = b.constant("c", torch.zeros(2))
    b.output(z, x, y, s * 2, c)
    g = b.build()
    assert eliminate_dead_code(g) is g


def test_empty_when_nothing_is_returned():
    b = GraphBuilder()
    x = b.input("x", (3,))
    b.compute("y", (3,), lambda i: x[i] * 3)

    e = GraphBuilder()
    e.input("x", (3,))  # inputs stay: the caller passes them
    assert_graph_equal(eliminate_dead_code(b.build()), e.build())


# A custom op whose result nobody reads but that PyTorch says has side effects: registered
# effectful (AOTAutograd threads an effect token through with_effects) or marked with
# torch.fx.node.has_side_effect. Each call appends the sum of its input to its log.
logged_sums: dict[str, list[float]] = {"effectful": [], "side_effect": []}


@torch.library.custom_op("minicomp_tests::log_sum_effectful", mutates_args=())
def log_sum_effectful(x: torch.Tensor) -> torch.Tensor:
    logged_sums["effectful"].append(x.sum().item())
    return x.sum()


@torch.library.custom_op("minicomp_tests::log_sum_side_effect", mutates_args=())
def log_sum_side_effect(x: torch.Tensor) -> torch.Tensor:
    logged_sums["side_effect"].append(x.sum().item())
    return x.sum()


for _op in (log_sum_effectful, log_sum_side_effect):
    _op.register_fake(lambda x: x.new_empty(()))
torch.library._register_effectful_op(
    torch.ops.minicomp_tests.log_sum_effectful.default, torch._library.effects.EffectType.ORDERED
)
torch.fx.node.has_side_effect(torch.ops.minicomp_tests.log_sum_side_effect.default)


@pytest.mark.parametrize("kind", ["effectful", "side_effect"])
def test_unused_result_of_an_op_with_side_effects_still_runs(kind, target):
    log = logged_sums[kind]
    op = log_sum_effectful if kind == "effectful" else log_sum_side_effect

    def scale_and_log(x):
        op(x * 2)
        return x + 1

    x = torch.randn(6)
    log.clear()
    expected = scale_and_log(x)
    eager_log = list(log)
    log.clear()
    assert_same(compile_minicomp(scale_and_log, target)(x), expected)
    assert log == pytest.approx(eager_log)
