"""ATen's GEMM as a tuning candidate of fused matrix products, and the rewrite that runs it.

A fused contraction group (minicomp.ir.contraction) is computed by a matmul template
with its prologue and epilogue inlined. PyTorch's GEMM (cuBLAS on CUDA) computes the same
product when each operand is a bare strided read of a group input, possibly through a
widening cast (f16 -> f32); an operand that computes something (`(x * 2) @ w`, an implicit
GEMM's convolution window) is no GEMM operand, and its group stays a template. For an
eligible group the rewrite is:

    views   each operand as a (batch..., rows, cols) tensor: `aten.select` for the dims it
            reads at a nonzero constant index, then `aten.as_strided` (relative to the input's own
            storage offset) for the strides of its B, M or N and K variables, and
            `aten._to_copy` when the GEMM runs in another type
    GEMM    `aten.mm`, `aten.bmm` or, with several batch dims, `aten.matmul`, writing the
            accumulator `acc` of shape (batch..., M, N) (unit extents left out)
    epilogue  an injective FusedOp: the group's stores with the accumulator replaced by a
            read of `acc`, cast to the accumulator type

The GEMM runs in the operands' type when both are f16 (or bf16) and so are all the group's
outputs (what eager's mm gives: f16 for f16 inputs, rounded once before the epilogue, as
eager rounds it), or when the epilogue rounds the accumulator to that type before using it;
else in the accumulator type (f32 or f64), so that an f32 result is never rounded to f16 on
its way. When the epilogue only stores the accumulator, in the GEMM's type, at the positions
the GEMM's row-major result has (a plain mm, or a 1x1 channels-last convolution), the output
is that result (or an `aten.as_strided` view of it) and no epilogue kernel is built. Every
call is an ATen operator overload, so CUDA graphs capture it; the plan checks that the inputs
the views read have the strides the views were computed from, as it does for kernels.

Operand indices may be loop variables, constants (a `select`), or a variable split by a
reshape into `(v // d) % m` digits whose strides keep it one stride (`x.view(B * S, K)` of a
contiguous x); a symbolic divisor, or any other index, leaves the group to the template.

`tune_contractions` (run by the CUDA targets' tune_graph, after tune_attention) asks the
chooser about each eligible group with the ATen candidate: a function of a tune.tuner.Workload
running these ATen calls and the compiled epilogue kernel, which is what would run in its
place, so the tuner times the pair against the template's configs. When the Choice says ATen
won, the group is replaced by the rewrite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from minicomp.config import Options
from minicomp.ir import types as T
from minicomp.ir.compute import TensorElement, TensorInput
from minicomp.ir.contraction import Axis, Contraction
from minicomp.ir.expr import Binary, Cast, Const, Dim, Expr, Var, cast, const, dim_expr, prod
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp, Graph, Op, TensorType, Value
from minicomp.passes.graph.layout import contiguous_strides
from minicomp.passes.graph.rewrite import fresh_name
from minicomp.passes.kernel.simplify_indices import simplify_indices
from minicomp.schedule.templates import template_choice
from minicomp.schedule.templates.base import arch_of, sm_count_of
from minicomp.schedule.templates.problem import (
    MatmulProblem,
    flat_stride,
    is_unit,
    matmul_problem,
    strip_widening,
)

aten = torch.ops.aten

# Operand types the GEMM keeps (narrower than the accumulator) when the outputs have them too.
_NARROW_GEMM_TYPES = (T.f16, T.bf16)


@dataclass(frozen=True)
class _OperandView:
    """A GEMM operand read from group input `value` (whose strides are `layout`): the dims
    read at a constant index (`selects`: (dim, index), in increasing dim order), then sizes and
    strides (of the storage) of the (batch..., rows, cols) view."""

    value: Value
    layout: tuple[Dim, ...]
    selects: tuple[tuple[int, int], ...]
    sizes: tuple[Dim, ...]
    strides: tuple[Dim, ...]


@dataclass(frozen=True)
class AtenRewrite:
    """A fused contraction group `op` as ATen calls and an epilogue group (module docstring).

    `externs` are the operand views and the GEMM (then a view when the GEMM writes the output
    itself), `gemm` the GEMM's call among them, `acc` its result, `epilogue` the injective
    group computing the outputs from `acc` (None when the GEMM writes them).
    """

    op: FusedOp
    externs: tuple[ExternOp, ...]
    gemm: ExternOp
    acc: Value
    epilogue: FusedOp | None

    def nodes(self, reason: str) -> tuple[Op, ...]:
        """The graph nodes replacing `op`, the GEMM's call carrying `reason` (which
        `minicomp.explain` prints) and the views around it saying what they are for."""
        at = self.externs.index(self.gemm)
        externs = [n.replace(reason=f"operand of {self.gemm.name}") for n in self.externs[:at]]
        externs.append(self.gemm.replace(reason=reason))
        externs += [n.replace(reason=f"result of {self.gemm.name}") for n in self.externs[at + 1 :]]
        return tuple(externs) + ((self.epilogue,) if self.epilogue is not None else ())


def aten_rewrite(problem: MatmulProblem, names: set[str]) -> AtenRewrite | None:
    """The rewrite of the group `problem` describes, or None when an operand is no strided
    read of an input (see the module docstring). New value names are taken from, and added
    to, `names`."""
    c: Contraction = problem.contraction
    op = problem.op
    if not c.acc_dtype.is_float:
        # An integer product (_int_mm's): cuBLAS has no int32 mm, and its _int_mm takes s8
        # operands only, with sizes and layouts of its own; the template computes these.
        return None
    va = _operand_view(c.a, c.m, c, op, problem.layouts, rows_first=True)
    vb = _operand_view(c.b, c.n, c, op, problem.layouts, rows_first=False)
    if va is None or vb is None:
        return None
    gemm_dtype = _gemm_dtype(c, va.value.dtype, vb.value.dtype)
    device = op.outputs[0].type.device
    externs: list[ExternOp] = []
    a = _view_ops(va, gemm_dtype, f"{op.name}_a", names, externs)
    b = _view_ops(vb, gemm_dtype, f"{op.name}_b", names, externs)
    batch = _kept(c.batch)
    acc_shape = (*(x for _, x in batch), _extent(c.m), _extent(c.n))
    direct = _output_strides(c, problem.layouts, gemm_dtype)
    out = op.outputs[0]
    row_major = contiguous_strides(acc_shape)
    if direct is not None and tuple(out.shape) == acc_shape and direct == row_major:
        acc = out
    else:
        name = fresh_name(f"{op.name}_acc", names)
        acc = Value(name, TensorType(acc_shape, gemm_dtype, device, row_major))
    target = (aten.mm.default, aten.bmm.default)[len(batch)] if len(batch) < 2 else None
    gemm = ExternOp(
        f"{op.name}_gemm",
        (a, b) if a != b else (a,),
        (acc,),
        target or aten.matmul.default,
        (ArgRef(0), ArgRef(0 if a == b else 1)),
        (),
        ((),),
    )
    externs.append(gemm)
    if direct is not None and acc is not out:
        # The output's elements sit where the GEMM wrote them: a view, no copy.
        externs.append(
            _call(f"{op.name}_view", acc, out, aten.as_strided.default, (out.shape, direct))
        )
    epilogue = None if direct is not None else _epilogue(c, acc, batch)
    return AtenRewrite(op, tuple(externs), gemm, acc, epilogue)


def _operand_view(
    e: Expr, side: tuple[Axis, ...], c: Contraction, op: FusedOp, layouts, rows_first: bool
) -> _OperandView | None:
    """How operand `e` (reading the `side` variables and K) is a view of one group input, or
    None when it computes something or its side or K variables are not one stride each."""
    el = strip_widening(e)
    if not isinstance(el, TensorElement):
        return None
    value = next((v for v in op.inputs if v.name == el.tensor.name), None)
    if value is None:
        return None
    strides = layouts[value.name]
    digits: dict[Var, list[tuple[int, int | None, Dim]]] = {}
    selects = []
    for d, (index, stride) in enumerate(zip(el.indices, strides)):
        if isinstance(index, Const):
            if index.value != 0:  # index 0 is at offset 0: the strided view drops the dim
                selects.append((d, int(index.value)))
            continue
        found = _digit(index)
        if found is None:
            return None
        v, div, mod = found
        digits.setdefault(v, []).append((div, mod, stride))
    extents = dict((*c.batch, *side, *c.k))
    coeff: dict[Var, Dim] = {}
    for v, terms in digits.items():
        stride = _linear(terms, extents.get(v))
        if stride is None:
            return None
        coeff[v] = stride
    along_side, along_k = _collapse(side, coeff), _collapse(c.k, coeff)
    if along_side is None or along_k is None:
        return None
    batch = _kept(c.batch)
    sizes = tuple(x for _, x in batch)
    batch_strides = tuple(coeff.get(v, 0) for v, _ in batch)
    pairs = (along_side, along_k) if rows_first else (along_k, along_side)
    return _OperandView(
        value,
        tuple(strides),
        tuple(selects),
        (*sizes, *(size for size, _ in pairs)),
        (*batch_strides, *(stride for _, stride in pairs)),
    )


def _digit(index: Expr) -> tuple[Var, int, int | None] | None:
    """(v, d, m) when `index` is `(v // d) % m` for a loop variable v (d = 1 or m = None
    where that part is missing: a reshape's view splits a variable so), else None."""
    if isinstance(index, Var):
        return index, 1, None
    if not isinstance(index, Binary) or index.op not in ("idiv", "imod"):
        return None
    by = index.b
    if not isinstance(by, Const) or not isinstance(by.value, int) or by.value <= 0:
        return None
    inner = _digit(index.a)
    if inner is None or inner[2] is not None:
        return None
    v, div, _ = inner
    return (v, div * by.value, None) if index.op == "idiv" else (v, div, by.value)


def _linear(terms: list[tuple[int, int | None, Dim]], extent: Dim | None) -> Dim | None:
    """The element stride of a variable of `extent` read through the digits `terms` ((d, m,
    stride of the dim read at (v // d) % m)) when its offset is that stride times v, else
    None: the digits must be a mixed radix of v (1, then each d times its m) with strides in
    proportion."""
    if extent is None:
        return None
    terms = sorted(terms, key=lambda t: t[0])
    if len(terms) == 1 and terms[0][:2] == (1, None):
        return terms[0][2]
    first = terms[0][2]
    if terms[0][0] != 1 or not isinstance(first, int):
        return None
    for j, (div, mod, stride) in enumerate(terms):
        if not isinstance(stride, int) or stride != first * div:
            return None
        if j + 1 < len(terms):
            if mod is None or div * mod != terms[j + 1][0]:
                return None
        elif mod is not None and not (isinstance(extent, int) and div * mod >= extent):
            return None
    return first


def _collapse(axes: tuple[Axis, ...], coeff: Mapping[Var, Dim]) -> tuple[Dim, Dim] | None:
    """(extent, stride) of the flat coordinate over `axes` when the element offset is linear
    in it (problem.flat_stride), else None; (1, 1) when every extent is 1."""
    if not _kept(axes):
        return 1, 1
    inner = flat_stride(axes, coeff)
    return None if inner is None else (_extent(axes), inner)


def _kept(axes: tuple[Axis, ...]) -> tuple[Axis, ...]:
    return tuple((v, x) for v, x in axes if not is_unit(x))


def _extent(axes: tuple[Axis, ...]) -> Dim:
    return prod(x for _, x in _kept(axes))


def _gemm_dtype(c: Contraction, a: T.DataType, b: T.DataType) -> T.DataType:
    """The type the GEMM reads and writes (see the module docstring)."""
    if a != b or a not in _NARROW_GEMM_TYPES:
        return c.acc_dtype
    if {v.dtype for v in c.op.outputs} == {a}:
        return a
    # An epilogue that rounds the accumulator to the operands' type before anything else
    # (`mm(x, w).relu().float()` in f16) loses nothing to a GEMM computing in that type.
    rounded, marker = cast(c.acc, a), Var("rounded", a)
    for st in c.epilogue:
        if c.acc in collect(substitute(st.body, {rounded: marker}), Var):
            return c.acc_dtype
    return a


def _view_ops(
    view: _OperandView, dtype: T.DataType, prefix: str, names: set[str], externs: list
) -> Value:
    """The value holding operand `view` in type `dtype`, its ATen calls appended to
    `externs` (none when the input already is that tensor)."""
    v = view.value
    shape, strides = list(v.shape), list(view.layout)
    for dim, index in reversed(view.selects):
        del shape[dim], strides[dim]
        out = _new(f"{prefix}_select", shape, v.dtype, strides, v, names)
        externs.append(_call(f"{out.name}", v, out, aten.select.int, (dim, index)))
        v = out
    if tuple(v.shape) != view.sizes or tuple(strides) != view.strides:
        out = _new(f"{prefix}_view", view.sizes, v.dtype, view.strides, v, names)
        sizes, strided = tuple(view.sizes), tuple(view.strides)
        externs.append(_call(out.name, v, out, aten.as_strided.default, (sizes, strided)))
        v = out
    if v.dtype != dtype:
        row_major = contiguous_strides(view.sizes)
        out = _new(f"{prefix}_{dtype.name}", view.sizes, dtype, row_major, v, names)
        kwargs = (("dtype", T.to_torch(dtype)), ("memory_format", torch.contiguous_format))
        externs.append(
            ExternOp(out.name, (v,), (out,), aten._to_copy.default, (ArgRef(0),), kwargs, ((),))
        )
        v = out
    return v


def _new(base: str, shape, dtype: T.DataType, strides, like: Value, names: set[str]) -> Value:
    name = fresh_name(base, names)
    return Value(name, TensorType(tuple(shape), dtype, like.type.device, tuple(strides)))


def _call(name: str, src: Value, out: Value, target: Any, args: tuple) -> ExternOp:
    return ExternOp(name, (src,), (out,), target, (ArgRef(0), *args), (), ((),))


def _output_strides(c: Contraction, layouts, gemm_dtype: T.DataType) -> tuple | None:
    """The strides of the group's only output when the GEMM's row-major result (batch...,
    M, N) holds its elements where they belong, so a view of it is the output; else None.

    That is when the epilogue stores the bare accumulator (or its cast) in the GEMM's type,
    every variable of the output's index at the stride the GEMM's result gives it, and the
    output's layout is the one PyTorch gave it (an ATen call's result keeps that one).
    """
    op = c.op
    if len(op.outputs) != 1 or len(c.epilogue) != 1:
        return None
    st, out = c.epilogue[0], op.outputs[0]
    body = st.body
    if isinstance(body, Cast) and body.dtype == out.dtype:
        body = body.a
    if body != c.acc or out.dtype != gemm_dtype:
        return None
    strides = tuple(layouts[out.name])
    if out.type.strides is not None and tuple(out.type.strides) != strides:
        return None
    want = _acc_strides(c)
    seen = set()
    for index, size, stride in zip(st.indices, out.shape, strides):
        if isinstance(index, Var) and index in want and index not in seen:
            if not _same(stride, want[index]):
                return None
            seen.add(index)
        elif not (isinstance(index, Const) and index.value == 0 and is_unit(size)):
            return None
    return strides if seen == set(want) else None


def _acc_strides(c: Contraction) -> dict[Var, Dim]:
    """The stride of each batch, M and N variable (unit extents left out) in the GEMM's
    row-major result."""
    batch = _kept(c.batch)
    shape = (*(x for _, x in batch), _extent(c.m), _extent(c.n))
    strides = contiguous_strides(shape)
    found: dict[Var, Dim] = {v: s for (v, _), s in zip(batch, strides)}
    for axes, below in ((_kept(c.m), strides[-2]), (_kept(c.n), strides[-1])):
        for v, x in reversed(axes):
            found[v] = below
            below = _mul(below, x)
    return found


def _mul(a: Dim, b: Dim) -> Dim:
    return a * b if isinstance(a, int) and isinstance(b, int) else dim_expr(a) * dim_expr(b)


def _same(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return isinstance(a, Expr) and isinstance(b, Expr) and a == b


def _epilogue(c: Contraction, acc: Value, batch: tuple[Axis, ...]) -> FusedOp:
    """The group's stores as an injective group reading the accumulator from `acc`."""
    op = c.op
    t = TensorInput(acc.name, acc.shape, acc.dtype)
    index = (*(v for v, _ in batch), _flat(c.m), _flat(c.n))
    read = cast(t[index], c.acc_dtype)
    stages = tuple(st.replace(body=substitute(st.body, {c.acc: read})) for st in c.epilogue)
    used = {el.tensor.name for st in stages for el in collect(st, TensorElement)}
    inputs = tuple(v for v in op.inputs if v.name in used) + (acc,)
    return FusedOp(
        op.name,
        inputs,
        op.outputs,
        op.members,
        op.outer_vars,
        op.outer_extents,
        (),
        (),
        stages,
    )


def _flat(axes: tuple[Axis, ...]) -> Expr:
    """The row-major flat coordinate over the variables of `axes`."""
    kept = _kept(axes)
    if not kept:
        return const(0)
    flat: Expr = kept[0][0]
    for v, x in kept[1:]:
        flat = flat * dim_expr(x) + v
    return flat


def _names(graph: Graph) -> set[str]:
    names = {v.name for v in graph.inputs if isinstance(v, Value)} | set(graph.constants)
    for n in graph.nodes:
        names.add(n.name)
        names.update(v.name for v in (*n.inputs, *n.outputs))
    return names


# -- tuning ---------------------------------------------------------------------------------


def tune_contractions(
    graph: Graph,
    choose: Callable,
    layouts: Mapping[str, tuple],
    *,
    options: Options | None = None,
    target: Any,
    device_index: int | None = None,
) -> Graph:
    """`graph` with each eligible contraction group that ATen computes faster replaced by the
    rewrite (module docstring).

    `choose` is tune.chooser's make_chooser: on the cuda target with search space 1 or 2
    it times the template's configs and the ATen candidate (whose epilogue kernel is built
    for `target`, a minicomp.targets.Target, with `options`, on CUDA device `device_index`);
    elsewhere it returns the
    template's heuristic and nothing changes. The template is picked as the CUDA scheduler
    picks it, so its later choose() call asks about the same problem.
    """
    names = _names(graph)
    sms, arch = sm_count_of(options), arch_of(options)
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        is_product = isinstance(n, FusedOp) and n.is_reduction
        problem = matmul_problem(n, layouts, sms, arch) if is_product else None
        rewrite = aten_rewrite(problem, names) if problem is not None else None
        if rewrite is not None:
            template, why = template_choice(problem, options)
            aten = aten_candidate(
                rewrite, layouts, target=target, options=options, device_index=device_index
            )
            choice = choose(template, problem, n, aten, why=why)
            if choice.aten:
                nodes.extend(rewrite.nodes(_reason(choice)))
                changed = True
                continue
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _reason(choice: Any) -> str:
    if choice.aten_time_us is None or choice.time_us is None:
        return "cuBLAS measured faster than the fused template"
    return (
        f"cuBLAS measured faster than the fused template: {choice.aten_time_us:.1f} us "
        f"against {choice.time_us:.1f} us"
    )


def aten_candidate(
    rewrite: AtenRewrite,
    layouts: Mapping[str, tuple],
    *,
    target: Any,
    options: Options | None = None,
    device_index: int | None = None,
) -> Callable:
    """The tuner's ATen candidate for `rewrite.op`: a function of a tune.tuner.Workload (the
    group's inputs, then its outputs, as tensors with the group's layouts and static sizes)
    running the rewrite's ATen calls and its epilogue kernel, built for `target` (a
    minicomp.targets.Target) on the first call, writing the group's outputs."""
    op = rewrite.op
    launch_epilogue: list[Callable] = []

    def run(w) -> None:
        env = {v.name: t for v, t in zip(op.inputs, w.inputs)}
        outputs = {v.name: t for v, t in zip(op.outputs, w.outputs)}
        for n in rewrite.externs:
            if n is rewrite.gemm and rewrite.epilogue is None:
                # The GEMM writes the output's memory, as it does in the plan.
                (result,) = n.outputs
                final = outputs[op.outputs[0].name]
                shape = tuple(result.shape)
                into = final.as_strided(shape, contiguous_strides(shape), final.storage_offset())
                n.target.overloadpacket.out(*_arguments(n, env), out=into)
                env[result.name] = into
                continue
            result = n.target(*_arguments(n, env), **dict(n.kwargs))
            env[n.outputs[0].name] = result
        if rewrite.epilogue is None:
            return
        if not launch_epilogue:
            launch_epilogue.append(
                epilogue_launcher(rewrite, layouts, target, options, device_index)
            )
        ep = rewrite.epilogue
        acc = env[rewrite.acc.name]
        if tuple(acc.stride()) != contiguous_strides(acc.shape):
            acc = acc.contiguous()
        env[rewrite.acc.name] = acc
        launch_epilogue[0]([env[v.name] for v in ep.inputs] + list(w.outputs))

    return run


def _arguments(n: ExternOp, env: dict) -> list:
    """The call's positional arguments, tensors from `env` (static sizes only)."""

    def value(a):
        if isinstance(a, ArgRef):
            return env[n.inputs[a.index].name]
        if isinstance(a, tuple):
            return [value(x) for x in a]
        if isinstance(a, Expr):
            raise ValueError(f"{n.name} takes a symbolic size; the ATen candidate needs static")
        return a

    return [value(a) for a in n.args]


def epilogue_launcher(
    rewrite: AtenRewrite,
    layouts: Mapping[str, tuple],
    target: Any,
    options: Options | None = None,
    device_index: int | None = None,
) -> Callable[[list], None]:
    """The rewrite's epilogue kernel built for `target` (a minicomp.targets.Target), as a
    function of its tensors (its inputs, then its outputs, in the rewrite's layouts)."""
    ep = rewrite.epilogue
    options = options if options is not None else Options()
    strides = dict(layouts)
    strides[rewrite.acc.name] = contiguous_strides(rewrite.acc.shape)
    kernel = simplify_indices(target.schedule(ep, strides, None, options))
    if any(isinstance(p.type, T.DataType) for p in kernel.params):
        raise ValueError(f"{ep.name} takes symbolic sizes; the ATen candidate needs static ones")
    fns, _ = target.build([kernel], options, device_index)
    fn = fns[kernel.name]

    def launch(tensors: list) -> None:
        fn(*(t.data_ptr() for t in tensors))

    return launch
