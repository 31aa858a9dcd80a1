"""Reductions over dims (with keepdim), whole-tensor reductions, scans, and the normalizations:
softmax, log_softmax, layer_norm, rms_norm, group_norm, batch_norm, normalize."""

from __future__ import annotations

import torch

from minicomp.fuzz.ops.draw import Draw, is_bool, is_float
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Ref

# name: (template, which inputs, how the dims argument is drawn)
DIM_REDUCTIONS = {
    "sum": ("{0}.sum(dim={1}, keepdim={2})", "any", "dims"),
    "mean": ("{0}.mean(dim={1}, keepdim={2})", "float", "dims"),
    "amax": ("{0}.amax(dim={1}, keepdim={2})", "any", "dims"),
    "amin": ("torch.amin({0}, {1}, {2})", "any", "dims"),
    "prod": ("{0}.prod(dim={1}, keepdim={2})", "any", "dim"),
    "argmax": ("{0}.argmax(dim={1}, keepdim={2})", "number", "dim"),
    "argmin": ("torch.argmin({0}, dim={1}, keepdim={2})", "number", "dim"),
    "max_values": ("{0}.max(dim={1}, keepdim={2}).values", "any", "dim"),
    "min_indices": ("{0}.min(dim={1}, keepdim={2}).indices", "number", "dim"),
    "logsumexp": ("torch.logsumexp({0}, dim={1}, keepdim={2})", "float", "dims"),
    "any": ("{0}.any(dim={1}, keepdim={2})", "any", "dim"),
    "all": ("torch.all({0}, dim={1}, keepdim={2})", "any", "dims"),
    "std": ("torch.std({0}, dim={1}, keepdim={2})", "float", "dims"),
}
FULL_REDUCTIONS = {
    "sum_all": ("{0}.sum()", "any"),
    "mean_all": ("{0}.mean()", "float"),
    "amax_all": ("{0}.max()", "any"),
    "prod_all": ("torch.prod({0})", "any"),
    "argmax_all": ("{0}.argmax()", "number"),
    "any_all": ("{0}.any()", "any"),
    "var_all": ("{0}.var()", "float"),
}
# Normalizations over one dim.
DIM_NORMS = {
    "softmax": "torch.softmax({0}, dim={1})",
    "log_softmax": "F.log_softmax({0}, dim={1})",
    "normalize": "F.normalize({0}, dim={1})",
}
# Reductions that jump where values cross (argmax) or leave 0 (any): see Draw.pick's `steep`.
STEEP = {"argmax", "argmin", "min_indices", "any", "all", "argmax_all", "any_all"}
_WHICH = {
    "any": lambda t: True,
    "number": lambda t: not is_bool(t),
    "float": is_float,
}


for _name, (_template, _which, _dims) in DIM_REDUCTIONS.items():

    def _dim_reduction(d: Draw, which=_WHICH[_which], dims=_dims, steep=_name in STEEP):
        x = d.pick(which, steep=steep)
        if x is None:
            return None
        dim = d.dims(x.tensor) if dims == "dims" else d.dim(x.tensor)
        return Ref(x.name), dim, d.chance(0.4)

    op(_name, "reduce", _template)(_dim_reduction)

for _name, (_template, _which) in FULL_REDUCTIONS.items():

    def _full_reduction(d: Draw, which=_WHICH[_which], steep=_name in STEEP):
        return d.one(which, steep=steep)

    op(_name, "reduce", _template)(_full_reduction)


@op("var", "reduce", "{0}.var(dim={1}, correction={2}, keepdim={3})")
def _var(d: Draw):
    x = d.pick(is_float)
    if x is None:
        return None
    return Ref(x.name), d.dims(x.tensor), d.choice([0, 1, 2]), d.chance(0.4)


@op("sum_dtype", "reduce", "{0}.sum(dim={1}, dtype={2})")
def _sum_dtype(d: Draw):
    x = d.pick()
    if x is None:
        return None
    dtype = d.choice([torch.float32, torch.float64] if is_float(x.tensor) else [torch.int64])
    return Ref(x.name), d.dims(x.tensor), dtype


@op("vector_norm", "reduce", "torch.linalg.vector_norm({0}, ord={1}, dim={2})")
def _vector_norm(d: Draw):
    x = d.pick(is_float)
    return None if x is None else (Ref(x.name), d.choice([1, 2, 3]), d.dims(x.tensor))


@op("cumsum", "reduce", "{0}.cumsum({1})")
def _cumsum(d: Draw):
    x = d.pick(lambda t: not is_bool(t))
    return None if x is None else (Ref(x.name), d.dim(x.tensor))


for _name, _template in DIM_NORMS.items():

    def _dim_norm(d: Draw):
        x = d.pick(is_float)
        return None if x is None else (Ref(x.name), d.dim(x.tensor))

    op(_name, "norm", _template)(_dim_norm)


@op("softmax_float", "norm", "F.softmax({0}, dim={1}, dtype=torch.float32)")
def _softmax_float(d: Draw):
    x = d.pick(lambda t: t.dtype in (torch.float16, torch.bfloat16) or d.chance(0.2))
    return None if x is None else (Ref(x.name), d.dim(x.tensor))


def _trailing(d: Draw, t: torch.Tensor) -> tuple[int, ...]:
    count = d.rng.randint(1, min(2, t.dim()))
    return tuple(t.shape[t.dim() - count :])


@op("layer_norm", "norm", "F.layer_norm({0}, {1})")
@op("rms_norm", "norm", "F.rms_norm({0}, {1}, eps=1e-6)")
def _trailing_norm(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() >= 1)
    return None if x is None else (Ref(x.name), _trailing(d, x.tensor))


@op("layer_norm_affine", "norm", "F.layer_norm({0}, {1}, {2}, {3})")
def _layer_norm_affine(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() >= 1)
    if x is None:
        return None
    shape = _trailing(d, x.tensor)
    weight = d.new_input(shape, x.tensor.dtype)
    bias = d.new_input(shape, x.tensor.dtype) if d.chance(0.7) else None
    return Ref(x.name), shape, weight, bias


@op("group_norm", "norm", "F.group_norm({0}, {1})")
def _group_norm(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() >= 2 and t.shape[1] > 0)
    if x is None:
        return None
    channels = x.tensor.shape[1]
    return Ref(x.name), d.choice([g for g in (1, 2, 3, 4) if channels % g == 0])


@op("batch_norm_eval", "norm", "F.batch_norm({0}, {1}, {2}.abs() + 0.5, training=False)")
def _batch_norm_eval(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() >= 2)
    if x is None:
        return None
    channels = (x.tensor.shape[1],)
    mean = d.new_input(channels, x.tensor.dtype, requires_grad=False)
    var = d.new_input(channels, x.tensor.dtype, requires_grad=False)
    return Ref(x.name), mean, var
