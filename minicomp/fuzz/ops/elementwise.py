"""Elementwise ops: unary math and activations, binary ops with broadcasting and type
promotion, comparisons, where and masked_fill, and casts."""

from __future__ import annotations

import functools

import torch

from minicomp.fuzz.ops.draw import Draw, is_bool, is_float
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Ref

# Ops defined for any real input (ints promote to float where the op needs it).
UNARY_ANY = {
    "neg": "-{0}",
    "abs": "{0}.abs()",
    "exp": "torch.exp({0})",
    "log": "torch.log({0})",
    "sqrt": "{0}.sqrt()",
    "rsqrt": "torch.rsqrt({0})",
    "sin": "torch.sin({0})",
    "cos": "{0}.cos()",
    "tanh": "torch.tanh({0})",
    "sigmoid": "torch.sigmoid({0})",
    "relu": "torch.relu({0})",
    "erf": "torch.erf({0})",
    "log1p": "torch.log1p({0})",
    "expm1": "{0}.expm1()",
    "sign": "torch.sign({0})",
    "reciprocal": "{0}.reciprocal()",
    "square": "{0}.square()",
    "isnan": "{0}.isnan()",
    "logical_not": "torch.logical_not({0})",
}
# Ops PyTorch defines for floating inputs only.
UNARY_FLOAT = {
    "gelu": "F.gelu({0})",
    "gelu_tanh": "F.gelu({0}, approximate='tanh')",
    "silu": "F.silu({0})",
    "softplus": "F.softplus({0})",
    "elu": "F.elu({0})",
    "leaky_relu": "F.leaky_relu({0}, 0.1)",
    "hardtanh": "F.hardtanh({0})",
    "hardsigmoid": "F.hardsigmoid({0})",
    "floor": "torch.floor({0})",
    "ceil": "{0}.ceil()",
    "round": "torch.round({0})",
    "trunc": "{0}.trunc()",
    "frac": "{0}.frac()",
    "nan_to_num": "torch.nan_to_num({0})",
}
BINARY = {
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "div": "{0} / {1}",
    "maximum": "torch.maximum({0}, {1})",
    "minimum": "torch.minimum({0}, {1})",
    "pow": "torch.pow({0}, {1})",
    "atan2": "torch.atan2({0}, {1})",
    "remainder": "{0} % {1}",
    "floor_divide": "{0} // {1}",
    "fmod": "torch.fmod({0}, {1})",
    "hypot": "torch.hypot({0}, {1})",
    "copysign": "torch.copysign({0}, {1})",
}
BITWISE = {
    "bitwise_and": "{0} & {1}",
    "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}",
    "logical_and": "torch.logical_and({0}, {1})",
    "logical_or": "torch.logical_or({0}, {1})",
}
COMPARE = {
    "eq": "{0} == {1}",
    "ne": "{0} != {1}",
    "lt": "{0} < {1}",
    "le": "torch.le({0}, {1})",
    "gt": "{0} > {1}",
    "ge": "{0} >= {1}",
}
# Ops that jump where their input crosses a point: see Draw.pick's `steep`.
STEEP = {
    "sign",
    "logical_not",
    "floor",
    "ceil",
    "round",
    "trunc",
    "frac",
    "remainder",
    "floor_divide",
    "fmod",
    "copysign",
}
CASTS = {
    "float": "{0}.float()",
    "half": "{0}.half()",
    "bfloat16": "{0}.bfloat16()",
    "double": "{0}.double()",
    "long": "{0}.long()",
    "int": "{0}.int()",
    "bool": "{0}.bool()",
}


def _castable_to_int(t: torch.Tensor) -> bool:
    # A float outside int8's range or not finite has no defined C conversion: UB, not a bug.
    if not is_float(t):
        return True
    return bool(torch.isfinite(t).all()) and bool((t.abs() < 100).all())


def _unary_any(d: Draw, steep: bool = False):
    return d.one(lambda t: not is_bool(t) or d.chance(0.3), steep=steep)


def _unary_float(d: Draw, steep: bool = False):
    return d.one(is_float, steep=steep)


def _binary(d: Draw, steep: bool = False):
    x = d.pick(lambda t: not is_bool(t), steep=steep)
    if x is None:
        return None
    other = d.operand(x, steep=steep)
    return (other, Ref(x.name)) if d.chance(0.15) else (Ref(x.name), other)


def _bitwise(d: Draw):
    x = d.pick(lambda t: not is_float(t))
    if x is None:
        return None
    return Ref(x.name), d.partner(x) if d.chance(0.8) else d.scalar(x.tensor)


def _compare(d: Draw):
    x = d.pick(steep=True)
    return None if x is None else (Ref(x.name), d.operand(x, steep=True))


def _steep(draw, name: str):
    return functools.partial(draw, steep=True) if name in STEEP else draw


for _name, _template in UNARY_ANY.items():
    op(_name, "unary", _template)(_steep(_unary_any, _name))
for _name, _template in UNARY_FLOAT.items():
    op(_name, "unary", _template)(_steep(_unary_float, _name))
for _name, _template in BINARY.items():
    op(_name, "binary", _template)(_steep(_binary, _name))
for _name, _template in BITWISE.items():
    op(_name, "binary", _template)(_bitwise)
for _name, _template in COMPARE.items():
    op(_name, "compare", _template)(_compare)


@op("bitwise_not", "unary", "~{0}")
def _bitwise_not(d: Draw):
    return d.one(lambda t: not is_float(t))


@op("clamp", "unary", "{0}.clamp({1}, {2})")
def _clamp(d: Draw):
    x = d.pick(lambda t: not is_bool(t))
    if x is None:
        return None
    low = d.choice([-1, -0.5, 0])
    return Ref(x.name), low, low + d.choice([1, 2, 0.5])


@op("clamp_min", "unary", "torch.clamp({0}, min={1})")
def _clamp_min(d: Draw):
    x = d.pick(lambda t: not is_bool(t))
    return None if x is None else (Ref(x.name), d.scalar(x.tensor))


@op("pow_scalar", "unary", "{0} ** {1}")
def _pow_scalar(d: Draw):
    x = d.pick(lambda t: not is_bool(t))
    if x is None:
        return None
    exponents = [2, 3, 0.5, -1.0, 0, 1.5] if is_float(x.tensor) else [2, 3, 0, 1]
    return Ref(x.name), d.choice(exponents)


@op("add_alpha", "binary", "torch.add({0}, {1}, alpha={2})")
def _add_alpha(d: Draw):
    x = d.pick(lambda t: not is_bool(t))
    if x is None:
        return None
    alpha = d.choice([2, -1, 0.5]) if is_float(x.tensor) else d.choice([2, -1])
    return Ref(x.name), d.partner(x), alpha


@op("lerp", "binary", "torch.lerp({0}, {1}, {2})")
def _lerp(d: Draw):
    x = d.pick(is_float)
    if x is None:
        return None
    return Ref(x.name), d.partner(x, same_dtype=True), d.choice([0.25, 0.5, 2.0])


@op("addcmul", "binary", "torch.addcmul({0}, {1}, {2}, value={3})")
def _addcmul(d: Draw):
    x = d.pick(is_float)
    if x is None:
        return None
    return Ref(x.name), d.partner(x), d.partner(x), d.choice([1, 0.5, -2])


@op("where", "where", "torch.where({0}, {1}, {2})")
def _where(d: Draw):
    x = d.pick()
    if x is None:
        return None
    cond = d.pick(is_bool)
    if cond is None or d.chance(0.3):
        cond_ref = d.new_input(d.broadcast_shape_for(tuple(x.tensor.shape)), torch.bool)
    else:
        cond_ref = Ref(cond.name)
    return cond_ref, Ref(x.name), d.operand(x)


@op("where_positive", "where", "torch.where({0} > 0, {0}, {1})")
def _where_positive(d: Draw):
    x = d.pick(lambda t: not is_bool(t), steep=True)
    return None if x is None else (Ref(x.name), d.operand(x))


@op("masked_fill", "where", "{0}.masked_fill({1}, {2})")
def _masked_fill(d: Draw):
    x = d.pick()
    if x is None:
        return None
    mask = d.pick(lambda t: is_bool(t) and t.shape == x.tensor.shape)
    if mask is None or d.chance(0.5):
        mask_ref = d.new_input(d.broadcast_shape_for(tuple(x.tensor.shape)), torch.bool)
    else:
        mask_ref = Ref(mask.name)
    return Ref(x.name), mask_ref, d.scalar(x.tensor)


for _name, _template in CASTS.items():

    def _cast(d: Draw, name=_name):
        to_int = name in ("long", "int", "bool")
        return d.one(_castable_to_int if to_int else None, steep=to_int)

    op(_name, "cast", _template)(_cast)


@op("to_dtype", "cast", "{0}.to({1})")
def _to_dtype(d: Draw):
    dtype = d.choice([torch.float32, torch.float16, torch.float64, torch.int32, torch.int8])
    to_int = not dtype.is_floating_point
    x = d.pick(_castable_to_int if to_int else None, steep=to_int)
    return None if x is None else (Ref(x.name), dtype)


@op("type_as", "cast", "{0}.type_as({1})")
def _type_as(d: Draw):
    other = d.pick()
    if other is None:
        return None
    to_int = not is_float(other.tensor)
    x = d.pick(_castable_to_int if to_int else None, steep=to_int)
    if x is None:
        return None
    return Ref(x.name), Ref(other.name)
