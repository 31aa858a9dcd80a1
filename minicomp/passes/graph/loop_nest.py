"""Building the loop-nest form of a group of compute ops, or saying why it has none."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from minicomp.ir.compute import Compute, Reduce, TensorElement
from minicomp.ir.expr import Const, Expr, Var, const
from minicomp.ir.functor import Mutator, collect, substitute
from minicomp.ir.graph import ComputeOp, FusedOp, ReduceStage, StoreStage, Value
from minicomp.ir.types import i64

# Groups whose inlined expressions grow past this many nodes stay apart: inlining a
# producer at every use duplicates it, and chains of such uses grow exponentially.
MAX_EXPR_SIZE = 3000


class NoLoopNest(Exception):
    """The ops cannot share one kernel; the message says why."""


class _OffRow(NoLoopNest):
    """Member `name`, shaped like the nest's rows and so taken for a value of the row, is read
    at another row: a transposed square weight ([K, N] read at [k, n]) of an [M, N] product
    with M == K. The nest is built again with it inlined at its reads instead."""

    def __init__(self, name: str):
        super().__init__(f"{name} is read at another row than the one computed")
        self.name = name


class _Unplaced(NoLoopNest):
    """A row-shaped member reads no member that places its axes on the nest's loops (an
    `exp` of an input): where a reader inlines it, the reader's indices place it."""


def _proj(shape: Sequence) -> tuple:
    return tuple(d for d in shape if not (isinstance(d, int) and d == 1))


def _canonical_index(shape: Sequence, outer: Sequence[Var]) -> tuple[Expr, ...]:
    it = iter(outer)
    return tuple(const(0) if isinstance(d, int) and d == 1 else next(it) for d in shape)


class _Inliner(Mutator):
    """Inlines member definitions at their uses; scalar members become their expressions."""

    def __init__(self, nest: _NestBuilder):
        super().__init__()
        self.nest = nest

    def visit_TensorElement(self, e: TensorElement) -> Expr:
        idx = self.visit(e.indices)
        name = e.tensor.name
        nest = self.nest
        if name in nest.scalars:
            shape = nest.defs[name].shape
            if tuple(idx) != _canonical_index(shape, nest.outer):
                raise _OffRow(name)
            return nest.scalars[name]
        d = nest.defs.get(name)
        if d is None:
            return e if idx is e.indices else TensorElement(e.tensor, idx)
        if name in nest.reductions:
            raise NoLoopNest(f"{name} is read before its row is reduced")
        nest.accesses.setdefault(name, []).append(tuple(idx))
        body = substitute(d.body, dict(zip(d.axes, idx)))
        return _Inliner(nest).visit(body)


class _NestBuilder:
    def __init__(
        self,
        ops: Sequence[ComputeOp],
        outputs: Sequence[Value],
        reduces: Callable[[ComputeOp], bool] | None = None,
        off_row: frozenset[str] = frozenset(),
    ):
        self.ops = list(ops)
        self.off_row = off_row  # row-shaped members that are no values of the row (_OffRow)
        self.outputs = list(outputs)
        self.defs: dict[str, Compute] = {op.outputs[0].name: op.definition for op in ops}
        if reduces is None:
            self.reductions = {n for n, d in self.defs.items() if not d.is_injective}
        else:
            self.reductions = {op.outputs[0].name for op in ops if reduces(op)}
        self.scalars: dict[str, Expr] = {}
        self.accesses: dict[str, list[tuple]] = {}
        self.outer: list[Var] = []
        self.outer_extents: tuple = ()
        self.inner: list[Var] = []
        self.stages: list = []
        self.mappings: dict[str, dict] = {}
        first = next((op.definition for op in ops if op.outputs[0].name in self.reductions), None)
        self.inner_extents = tuple(_the_reduce(first).extents) if first is not None else ()

    def inline(self, e: Expr) -> Expr:
        out = _Inliner(self).visit(e)
        if _size(out) > MAX_EXPR_SIZE:
            raise NoLoopNest("inlined expression too large")
        return out

    def build(self, name: str) -> FusedOp:
        if not self.reductions:
            return self.build_injective(name)
        return self.build_reduction(name)

    def build_injective(self, name: str) -> FusedOp:
        shapes = {tuple(v.shape) for v in self.outputs}
        if len(shapes) != 1:
            raise NoLoopNest(f"outputs of different shapes {sorted(map(str, shapes))}")
        shape = shapes.pop()
        self.outer = [Var(f"o{k}", i64) for k in range(len(shape))]
        for k, v in enumerate(self.outputs):
            d = self.defs[v.name]
            body = self.inline(substitute(d.body, dict(zip(d.axes, self.outer))))
            self.stages.append(StoreStage(k, tuple(self.outer), body, False))
        return self.finish(name, shape, ())

    def build_reduction(self, name: str) -> FusedOp:
        first = next(op.definition for op in self.ops if op.outputs[0].name in self.reductions)
        red = _the_reduce(first)
        outer_dims = _proj(first.shape)
        self.outer = [Var(f"o{k}", i64) for k in range(len(outer_dims))]
        self.outer_extents = tuple(outer_dims)
        self.inner = [Var(f"r{k}", i64) for k in range(len(red.extents))]
        for op in self.ops:
            vname, d = op.outputs[0].name, op.definition
            if vname in self.reductions:
                self.add_reduction(vname, d, outer_dims, red.extents)
            elif (
                _proj(d.shape) == outer_dims
                and vname not in self.off_row
                and not _reads_full(d, self)
            ):
                self.scalars[vname] = self.inline(self.to_outer(d))
        stored = [(k, v) for k, v in enumerate(self.outputs)]
        for k, v in stored:
            if v.name in self.scalars:
                idx = _canonical_index(v.shape, self.outer)
                self.stages.append(StoreStage(k, idx, self.scalars[v.name], False))
        for k, v in stored:
            if v.name not in self.scalars:
                self.stages.append(self.full_store(k, v))
        return self.finish(name, outer_dims, tuple(red.extents))

    def to_outer(self, d: Compute) -> Expr:
        return substitute(d.body, dict(zip(d.axes, _canonical_index(d.shape, self.outer))))

    def add_reduction(self, vname: str, d: Compute, outer_dims, extents) -> None:
        if _proj(d.shape) != outer_dims:
            raise NoLoopNest(f"{vname} reduces to another shape")
        red = _the_reduce(d)
        if tuple(red.extents) != tuple(extents):
            raise NoLoopNest(f"{vname} reduces over other extents")
        body = self.to_outer(d)
        red = _the_reduce_in(body)
        rbody = self.inline(substitute(red.body, dict(zip(red.axes, self.inner))))
        acc = Var(f"acc{len(self.stages)}", red.dtype)
        self.stages.append(ReduceStage(acc, red.kind, rbody))
        self.scalars[vname] = self.inline(substitute(body, {red: acc}))

    def full_store(self, k: int, v: Value) -> StoreStage:
        d = self.defs[v.name]
        mapping = self.axis_mapping(v.name, d)
        body = self.inline(substitute(d.body, mapping))
        idx = tuple(mapping[a] for a in d.axes)
        return StoreStage(k, idx, body, True)

    def axis_mapping(self, vname: str, d: Compute) -> dict:
        """Which loop variable each axis of a row-shaped member runs along."""
        hit = self.mappings.get(vname)
        if hit is not None:
            return hit
        canon = set(self.outer) | set(self.inner)
        extent_of = dict(zip(d.axes, d.shape))
        loop_extent = dict(zip(self.outer, self.outer_extents))
        loop_extent.update(zip(self.inner, self.inner_extents))
        for idx in self.accesses.get(vname, []):
            if all(isinstance(i, Var) and i in canon or _is_zero(i) for i in idx):
                used = [i for i in idx if isinstance(i, Var)]
                fits = all(
                    extent_of[a] == (loop_extent[i] if isinstance(i, Var) else 1)
                    for a, i in zip(d.axes, idx)
                )
                if fits and len(set(used)) == len(used) == len(canon):
                    self.mappings[vname] = dict(zip(d.axes, idx))
                    return self.mappings[vname]
        mapping: dict = {}
        for el in collect(d.body, TensorElement):
            name = el.tensor.name
            if name in self.scalars:
                want = _canonical_index(self.defs[name].shape, self.outer)
            elif name in self.defs and name not in self.reductions:
                try:
                    other = self.axis_mapping(name, self.defs[name])
                except _Unplaced:
                    continue  # constrains nothing: read like a graph input
                want = tuple(other[a] for a in self.defs[name].axes)
            else:
                continue
            for i, w in zip(el.indices, want):
                if isinstance(w, Var) and (w in self.outer or name not in self.scalars):
                    if not isinstance(i, Var) or i not in d.axes or mapping.get(i, w) != w:
                        raise NoLoopNest(f"{vname} reads a row at a computed index")
                    if extent_of[i] != loop_extent[w]:
                        # A slice of the rows: stored along the whole loop it would overrun.
                        raise NoLoopNest(f"{vname} covers part of a loop's extent")
                    if any(a != i and m == w for a, m in mapping.items()):
                        # Two axes along one loop (a broadcast of a reduced value against its
                        # input): the nest would store only their diagonal.
                        raise NoLoopNest(f"{vname} runs two of its axes along one loop")
                    mapping[i] = w
        if not set(self.outer) <= set(mapping.values()):
            if not mapping:
                raise _Unplaced(f"{vname} does not run along the reduced rows")
            raise NoLoopNest(f"{vname} does not run along the reduced rows")
        rest = [(a, x) for a, x in zip(d.axes, d.shape) if a not in mapping]
        free = [(v, x) for v, x in zip(self.inner, self.inner_extents) if v not in mapping.values()]
        inner = iter(free)
        for a, x in rest:
            if isinstance(x, int) and x == 1:
                mapping[a] = const(0)
                continue
            var, ext = next(inner, (None, None))
            if var is None or ext != x:
                raise NoLoopNest(f"{vname} has other extents than the reduced rows")
            mapping[a] = var
        if next(inner, None) is not None:
            raise NoLoopNest(f"{vname} covers fewer dims than the reduced rows")
        self.mappings[vname] = mapping
        return mapping

    def finish(self, name: str, outer_extents, inner_extents) -> FusedOp:
        produced = set(self.defs)
        inputs: dict[Value, None] = {}
        for op in self.ops:
            for v in op.inputs:
                if v.name not in produced:
                    inputs.setdefault(v)
        members = tuple(op.name for op in self.ops)
        return FusedOp(
            name,
            tuple(inputs),
            tuple(self.outputs),
            members,
            tuple(self.outer),
            tuple(outer_extents),
            tuple(self.inner),
            tuple(inner_extents),
            tuple(self.stages),
        )


def _reads_full(d: Compute, nest: _NestBuilder) -> bool:
    """Whether a row-shaped-looking member reads full-shape members (then it is one itself).

    A member computed from graph inputs and row values alone (a bias cast to the product's
    dtype, f16(b)[o1]) is no full-shape member: inlined at the reader's indices, which run
    along the rows, it is a value of the row."""
    for el in collect(d.body, TensorElement):
        name = el.tensor.name
        if name in nest.defs and name not in nest.scalars and not _row_free(name, nest):
            return True
    return False


def _row_free(name: str, nest: _NestBuilder) -> bool:
    """Whether member `name` is injective and reads no member but row values and such members."""
    if name in nest.reductions:
        return False
    for el in collect(nest.defs[name].body, TensorElement):
        other = el.tensor.name
        if other in nest.defs and other not in nest.scalars and not _row_free(other, nest):
            return False
    return True


def _the_reduce(d: Compute) -> Reduce:
    return _the_reduce_in(d.body)


def _the_reduce_in(e: Expr) -> Reduce:
    found = collect(e, Reduce)
    if len(found) != 1:
        raise NoLoopNest(f"a definition with {len(found)} reductions")
    return found[0]


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


def _size(e: Expr) -> int:
    sizes: dict[int, int] = {}

    def walk(n) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        total = 1 + sum(walk(c) for c in _expr_children(n))
        sizes[key] = total
        return total

    return walk(e)


def _expr_children(n) -> list:
    out = []
    for c in n.children():
        if isinstance(c, Expr):
            out.append(c)
        elif isinstance(c, tuple):
            out.extend(x for x in c if isinstance(x, Expr))
    return out


def build_loop_nest(
    name: str,
    ops: Sequence[ComputeOp],
    outputs: Sequence[Value],
    reduces: Callable[[ComputeOp], bool] | None = None,
) -> FusedOp:
    """The fused kernel computing `outputs` from the group `ops` (in graph order).

    `reduces(op)`, when given, says whether an op's definition holds a reduction (what
    `not op.definition.is_injective` computes); fusion passes a memoized one, since it builds
    the nests of many overlapping groups. A member shaped like the rows but read at other
    indices (_OffRow) is inlined where it is read, the nest built again without taking it for a
    value of the row.
    """
    off_row: frozenset[str] = frozenset()
    while True:
        try:
            return _NestBuilder(ops, outputs, reduces, off_row).build(name)
        except _OffRow as e:
            if e.name in off_row:
                raise
            off_row |= {e.name}


def try_loop_nest(name: str, ops, outputs, reduces=None) -> FusedOp | None:
    """Like build_loop_nest, None when the group has no loop-nest form."""
    try:
        return build_loop_nest(name, ops, outputs, reduces)
    except NoLoopNest:
        return None
