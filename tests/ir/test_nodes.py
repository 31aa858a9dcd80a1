"""IR node basics: structural equality and hashing, replace, immutability, expression building
and folding, the functor bases (Visitor, Mutator, substitute, collect), and the typed launch
attributes of functions."""

import dataclasses

import pytest

from minicomp.ir import expr as E
from minicomp.ir.compute import Compute, Reduce, TensorElement, compute, reduce, tensor_input
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.functor import Mutator, Visitor, collect, substitute
from minicomp.ir.stmt import For, Store, seq
from minicomp.ir.types import PointerType, boolean, f32, f64, i32, i64

x, y, z = E.Var("x", i64), E.Var("y", i64), E.Var("z", i64)
a, b = E.Var("a", f32), E.Var("b", f32)
p = E.Var("p", boolean)


def _tree():
    """The same expression tree, built afresh on every call (no shared sub-objects)."""
    u, v = E.Var("u", i64), E.Var("v", i64)
    t = tensor_input("t", (8, 8), f32)
    body = E.call("exp", t[u, v + 1]) * E.const(2.0) + E.cast(u * v, f32)
    return E.select(u < v, body, E.const(0.0))


# --- structural equality and hashing -------------------------------------------------------


def test_equal_trees_from_separate_constructions_are_equal_and_hash_equal():
    t1, t2 = _tree(), _tree()
    assert t1 is not t2
    assert t1 == t2
    assert hash(t1) == hash(t2)
    assert len({t1, t2}) == 1
    assert {t1: "first"}[t2] == "first"


@pytest.mark.parametrize(
    "other",
    [
        E.Var("x", i32),  # same name, other type
        E.Var("w", i64),  # other name
        E.Const(1, i64),  # other class
    ],
    ids=["type", "name", "class"],
)
def test_different_leaves_differ(other):
    assert x != other
    assert (x == other) is False


def test_different_trees_differ():
    assert x + y != y + x
    assert x + y != x - y
    assert x + 1 != x + 2
    assert E.const(1, i64) != E.const(1, i32)
    assert E.const(True) != E.const(1)
    assert E.call("exp", a) != E.call("log", a)
    assert E.cast(a, f64) != E.cast(a, i64)
    assert _tree() != _tree().replace(b=E.const(1.0))


def test_statements_and_computes_compare_structurally():
    buf = E.Var("buf", PointerType(f32))

    def loop():
        return For(x, E.const(4), Store(buf, x, E.const(1.0)), "parallel")

    assert loop() == loop() and hash(loop()) == hash(loop())
    assert loop() != loop().replace(kind="serial")
    c1 = compute("c", (4,), lambda i: tensor_input("t", (4,), f32)[i] * 2)
    c2 = compute("c", (4,), lambda i: tensor_input("t", (4,), f32)[i] * 2)
    c3 = compute("c", (4,), lambda i: tensor_input("t", (4,), f32)[i] * 3)
    assert c1 == c2 and hash(c1) == hash(c2)
    assert c1 != c3


def test_signed_zero_constants_differ():
    assert E.const(0.0) != E.const(-0.0)


def test_nan_constants_from_separate_constructions_are_equal():
    n1, n2 = E.const(float("nan")), E.const(float("nan"))
    assert n1 == n2


# --- replace and immutability --------------------------------------------------------------


def test_replace_returns_a_changed_copy_and_leaves_the_original():
    e = x + y
    e2 = e.replace(op="sub")
    assert isinstance(e2, E.Binary) and e2.op == "sub" and e2.a is x and e2.b is y
    assert e.op == "add"
    assert x.replace(name="w") == E.Var("w", i64)
    assert x.name == "x"


def test_replace_checks_like_the_constructor():
    with pytest.raises(ValueError):
        (x + y).replace(op="frobnicate")


def test_assigning_a_field_raises():
    e = x + y
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.op = "sub"
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.name = "w"
    assert e.op == "add" and x.name == "x"


@pytest.mark.parametrize(
    "make",
    [
        lambda: E.Binary("frobnicate", x, y),
        lambda: Reduce("median", (x,), (4,), a),
        lambda: For(x, E.const(4), seq(), "sideways"),
    ],
    ids=["binary", "reduce", "for"],
)
def test_constructors_reject_unknown_kinds(make):
    with pytest.raises(ValueError):
        make()


# --- expression building and folding -------------------------------------------------------


def test_operator_overloads_build_the_named_ops():
    cases = {
        "add": x + y,
        "sub": x - y,
        "mul": x * y,
        "div": x / y,
        "idiv": x // y,
        "imod": x % y,
        "lt": x < y,
        "le": x <= y,
        "gt": x > y,
        "ge": x >= y,
        "bitand": x & y,
        "bitor": x | y,
        "and": p & (x < y),
        "or": p | (x < y),
    }
    for op, e in cases.items():
        assert isinstance(e, E.Binary) and e.op == op, (op, e)
    assert (x < y).dtype == boolean and (x + y).dtype == i64
    assert isinstance(-x, E.Unary) and (-x).op == "neg"
    assert (~x).op == "bitnot" and (~p).op == "not"
    # Reflected operators keep the operand order.
    assert 3 - x == E.Binary("sub", E.const(3), x)
    assert 2 // x == E.Binary("idiv", E.const(2), x)


def test_double_equals_is_structural_not_a_comparison_expression():
    assert (x == y) is False
    assert (x == E.Var("x", i64)) is True
    assert E.eq(x, y) == E.Binary("eq", x, y)
    assert E.ne(x, y).dtype == boolean


@pytest.mark.parametrize(
    "built, expected",
    [
        (lambda: x + 0, lambda: x),
        (lambda: 0 + x, lambda: x),
        (lambda: x - 0, lambda: x),
        (lambda: x * 1, lambda: x),
        (lambda: 1 * x, lambda: x),
        (lambda: x * 0, lambda: E.const(0)),
        (lambda: x // 1, lambda: x),
        (lambda: x % 1, lambda: E.const(0)),
        (lambda: E.const(3) + 4, lambda: E.const(7)),
        (lambda: E.const(6) * E.const(7), lambda: E.const(42)),
        (lambda: E.const(7) // 2, lambda: E.const(3)),
        (lambda: E.const(7) % 3, lambda: E.const(1)),
        (lambda: E.const(3) < 4, lambda: E.const(True)),
        (lambda: E.maximum(E.const(3), 9), lambda: E.const(9)),
        (lambda: -E.const(5), lambda: E.const(-5)),
        (lambda: (x + 2) * 1 + 0, lambda: x + 2),
    ],
)
def test_integer_folding(built, expected):
    assert built() == expected()


def test_folded_constants_keep_the_integer_type():
    v = E.Var("v", i32)
    assert E.const(3, i32) + E.const(4, i32) == E.const(7, i32)
    assert v * 1 is v
    assert (v + 0).dtype == i32


def test_negative_integer_division_is_not_folded_with_python_floor_semantics():
    # idiv/imod truncate like C; folding -7 // 2 with Python's // would give -4.
    for e, c_value in ((E.const(-7) // 2, -3), (E.const(-7) % 2, -1)):
        assert not (isinstance(e, E.Const) and e.value != c_value), e


def test_no_folding_for_floats():
    # x + 0.0 is not x (-0.0 + 0.0 is +0.0) and x * 0.0 is not 0 (inf, nan, -0.0).
    for e in (a + 0.0, a * 1.0, a * 0.0, a - 0.0, E.const(1.5) + E.const(2.0)):
        assert isinstance(e, E.Binary), e


def test_mixed_types_are_promoted_with_casts():
    v = E.Var("v", i32)
    e = v + x
    assert e == E.Binary("add", E.Cast(v, i64), x) and e.dtype == i64
    e = a * x
    assert e == E.Binary("mul", a, E.Cast(x, f32)) and e.dtype == f32
    # A Python number takes the expression's type.
    assert (a + 2).b == E.const(2.0, f32)
    assert (v + 2).b == E.const(2, i32)


def test_cast_folds_no_op_casts_and_constants():
    assert E.cast(x, i64) is x
    assert E.cast(a, f32) is a
    assert E.cast(E.const(3), f32) == E.const(3.0, f32)
    assert E.cast(E.const(2.0), boolean) == E.const(True)
    assert E.cast(a, f64) == E.Cast(a, f64)
    assert E.cast(E.cast(a, f64), f64) == E.Cast(a, f64)


def test_select_folds_constant_conditions_and_promotes_branches():
    assert E.select(True, x, y) is x
    assert E.select(E.const(False), x, y) is y
    e = E.select(p, a, x)
    assert e == E.Select(p, a, E.Cast(x, f32))


def test_bool_of_an_expression_raises():
    with pytest.raises(TypeError):
        bool(x < y)
    with pytest.raises(TypeError):
        if x + 1:
            pass
    with pytest.raises(TypeError):
        # `and` asks for a truth value: chained comparisons must not silently build half a
        # condition.
        0 <= x < y  # noqa: B015


# --- functors ------------------------------------------------------------------------------


class _VarNames(Visitor):
    def __init__(self):
        super().__init__()
        self.names = []

    def visit_Var(self, v):
        self.names.append(v.name)


class _Rename(Mutator):
    def __init__(self, old, new):
        super().__init__()
        self.old, self.new = old, new

    def visit_Var(self, v):
        return v.replace(name=self.new) if v.name == self.old else v


def test_visitor_dispatches_to_visit_var_and_walks_every_child():
    e = E.select(x < y, E.call("exp", a) + E.cast(z, f32), b)
    v = _VarNames()
    v.visit(e)
    assert sorted(v.names) == ["a", "b", "x", "y", "z"]
    # Each distinct node is visited once.
    v = _VarNames()
    v.visit(x * x + x)
    assert v.names == ["x"]


def test_visitor_walks_statements_and_tuples():
    buf = E.Var("buf", PointerType(f32))
    s = For(x, y, seq(Store(buf, x + z, E.const(1.0)), Store(buf, x, a)))
    v = _VarNames()
    v.visit(s)
    assert sorted(v.names) == ["a", "buf", "x", "y", "z"]


def test_mutator_returns_the_same_object_when_nothing_changes():
    e = _tree()
    assert _Rename("nope", "w").visit(e) is e
    assert _Rename("nope", "w").visit((e, x)) == (e, x)
    t = (e, x)
    assert _Rename("nope", "w").visit(t) is t


def test_mutator_rebuilds_only_the_changed_path():
    left = E.call("exp", a)
    e = left + E.cast(x, f32)
    out = _Rename("x", "w").visit(e)
    assert out is not e
    assert out == left + E.cast(E.Var("w", i64), f32)
    assert out.a is left  # the untouched operand is shared, not copied
    assert e == left + E.cast(x, f32)  # the input is unchanged


def test_mutator_keeps_signed_zero_constants_apart():
    e = E.select(p, a * E.const(0.0), a * E.const(-0.0))
    out = substitute(e, {a: b})
    assert out.b.b.value == 0.0 and str(out.b.b.value) == "-0.0"


def test_functor_does_not_descend_into_referenced_tensors():
    inner = compute("c", (4,), lambda i: tensor_input("t", (4,), f32)[i] * E.Var("hidden", f32))
    el = inner[x + 1]
    assert isinstance(el, TensorElement)
    assert collect(el, E.Var) == [x]
    assert substitute(el, {E.Var("hidden", f32): b}) is el


def test_substitute_replaces_all_keys_at_once():
    e = x + y * x
    assert substitute(e, {x: E.const(2)}) == E.Binary(
        "add", E.const(2), E.Binary("mul", y, E.const(2))
    )
    # Simultaneous, not sequential: a swap is a swap.
    assert substitute(x - y, {x: y, y: x}) == E.Binary("sub", y, x)
    assert substitute(e, {}) is e
    assert substitute(e, {z: x}) is e


def test_substitute_reaches_inside_reductions_and_statements():
    r = reduce("sum", (y,), lambda k: tensor_input("t", (8,), f32)[k + x])
    out = substitute(r, {x: z})
    assert isinstance(out, Reduce)
    assert set(collect(out, E.Var)) == {out.axes[0], y, z}
    buf = E.Var("buf", PointerType(f32))
    s = substitute(Store(buf, x, a), {x: z})
    assert s == Store(buf, z, a)


def test_collect_finds_distinct_nodes_of_a_class_in_visiting_order():
    e = (x + y) * (x + y) + E.cast(z, i64)
    assert collect(e, E.Var) == [x, y, z]
    assert collect(e, E.Binary) == [e, e.a, e.a.a]
    assert collect(e, (E.Var, E.Const)) == [x, y, z]
    assert collect(a + 1.0, E.Const) == [E.const(1.0)]
    c = compute("c", (4, 4), lambda i, j: reduce("max", (4,), lambda r: E.Var("q", f32)))
    assert isinstance(c, Compute) and len(collect(c, Reduce)) == 1


# --- launch attributes ---------------------------------------------------------------------


def test_launch_attrs_are_a_typed_record_of_a_function():
    n = E.Var("n", i64)
    attrs = LaunchAttrs(grid_dim=((n + 255) // 256, 1, 1), block_dim=(256, 1, 1), min_blocks=1)
    f = Function("k", (n,), seq(), attrs=attrs)
    assert f.attrs.block_dim == (256, 1, 1) and f.attrs.launch_bounds is None
    assert f.attrs.dynamic_smem == 0 and f.attrs.template is None
    same = LaunchAttrs(grid_dim=((n + 255) // 256, 1, 1), block_dim=(256, 1, 1), min_blocks=1)
    assert f == Function("k", (n,), seq(), attrs=same) and hash(attrs) == hash(same)
    assert f != f.replace(attrs=attrs.replace(template="t[1]"))
    assert Function("d", (), seq(), "device").attrs == LaunchAttrs()
    assert repr(attrs) == (
        "LaunchAttrs(grid_dim=((n + 255) // 256, 1, 1), block_dim=(256, 1, 1), min_blocks=1)"
    )
    # The grid's expressions are children: traversals reach them.
    assert collect(f.attrs, E.Var) == [n]
    assert substitute(f, {n: E.Var("m", i64)}).attrs.grid_dim[0] == (E.Var("m", i64) + 255) // 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        attrs.min_blocks = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"block_dim": 128}, "block_dim is three ints or expressions"),
        ({"grid_dim": (1, 1)}, "grid_dim is three ints or expressions"),
        ({"grid_dim": (1, 1.5, 1)}, "grid_dim is three ints or expressions"),
        ({"dynamic_smem": None}, "dynamic_smem is an int or an expression"),
        ({"launch_bounds": E.const(128)}, "launch_bounds is an int or None"),
        ({"min_blocks": True}, "min_blocks is an int or None"),
        ({"template": 3}, "template is a string or None"),
    ],
)
def test_launch_attrs_check_their_types(fields, message):
    with pytest.raises(TypeError, match=message):
        LaunchAttrs(**fields)


def test_a_function_takes_a_launch_attrs_record_only():
    with pytest.raises(TypeError, match="attrs of k is a LaunchAttrs"):
        Function("k", (), seq(), attrs=(("block_dim", (1, 1, 1)),))
