"""Task mappings (Hidet's idea): how a group of workers covers a grid of tasks.

`spatial(4, 8)` gives each of 32 workers one task of a 4x8 grid (worker w does task
(w // 8, w % 8)); `repeat(2, 2)` gives a single worker all 4 tasks of a 2x2 grid, in loops;
`a * b` composes them: each task of `a` is a block of `b`'s task shape, so
`spatial(4, 8) * repeat(2, 2)` has 32 workers each doing a 2x2 block of an 8x16 grid.
In scripts, `for i, j in m.on(threadIdx.x):` runs the body for every task of the worker.

The contract with the parser: `TaskMapping.on(worker)` returns `TaskLoops`, whose `loops` are
the repeat dimensions as `(Var, extent)` pairs, outermost first (each becomes a `For` loop),
and whose `indices` are i64 expressions (one per task dimension) over `worker` and those
loop variables. A worker at or past `num_workers` must do no task; the parser guards it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.ir.expr import Expr, ExprLike, Var, as_expr, cast
from minicomp.ir.types import i64


@dataclass(frozen=True)
class TaskLoops:
    """The tasks of one worker: loops over the repeat dimensions and the task indices."""

    loops: list[tuple[Var, int]]
    indices: tuple[Expr, ...]


class TaskMapping:
    """A mapping of `num_workers` workers onto a grid of `task_shape` tasks."""

    def __init__(self, task_shape: tuple[int, ...], num_workers: int):
        self.task_shape = task_shape
        self.num_workers = num_workers

    def tasks(self, worker: Expr, names: list[str]) -> tuple[list[tuple[Var, int]], list[Expr]]:
        """Hook: (loops, indices) of `worker` (an i64 expression); new loop variables take
        their names from the end of `names`, which they pop."""
        raise NotImplementedError

    def on(self, worker: ExprLike) -> TaskLoops:
        """The tasks worker `worker` (an int expression, e.g. threadIdx.x) performs."""
        names = [f"t{k}" for k in range(64)][::-1]
        loops, indices = self.tasks(cast(as_expr(worker), i64), names)
        return TaskLoops(loops, tuple(indices))

    def __mul__(self, other: TaskMapping) -> TaskMapping:
        if not isinstance(other, TaskMapping):
            return NotImplemented
        if len(self.task_shape) != len(other.task_shape):
            raise ValueError(
                f"cannot compose task mappings of {len(self.task_shape)} and "
                f"{len(other.task_shape)} dimensions"
            )
        return ComposedMapping(self, other)

    def __repr__(self) -> str:
        raise NotImplementedError


class SpatialMapping(TaskMapping):
    """One task per worker, workers laid over the task grid in row-major order."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape, _product(shape))

    def tasks(self, worker, names):
        indices = []
        stride = self.num_workers
        for d, extent in enumerate(self.task_shape):
            stride //= extent
            if extent == 1:
                indices.append(as_expr(0, i64))
            else:
                # A worker past the last one does no task, so the first index needs no modulo.
                index = worker // stride
                indices.append(index if d == 0 else index % extent)
        return [], indices

    def __repr__(self) -> str:
        return f"spatial({', '.join(map(str, self.task_shape))})"


class RepeatMapping(TaskMapping):
    """Every task done by a single worker, in row-major loop order."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape, 1)

    def tasks(self, worker, names):
        loops = [(Var(names.pop(), i64), extent) for extent in self.task_shape]
        return loops, [v for v, _ in loops]

    def __repr__(self) -> str:
        return f"repeat({', '.join(map(str, self.task_shape))})"


class ComposedMapping(TaskMapping):
    """`outer * inner`: each task of `outer` is a block of inner's tasks; worker w is worker
    w // inner.num_workers of `outer` and w % inner.num_workers of `inner`."""

    def __init__(self, outer: TaskMapping, inner: TaskMapping):
        shape = tuple(a * b for a, b in zip(outer.task_shape, inner.task_shape))
        super().__init__(shape, outer.num_workers * inner.num_workers)
        self.outer = outer
        self.inner = inner

    def tasks(self, worker, names):
        n = self.inner.num_workers
        outer_loops, outer = self.outer.tasks(worker // n if n > 1 else worker, names)
        inner_loops, inner = self.inner.tasks(worker % n, names)
        indices = [a * extent + b for a, b, extent in zip(outer, inner, self.inner.task_shape)]
        return outer_loops + inner_loops, indices

    def __repr__(self) -> str:
        return f"{self.outer!r} * {self.inner!r}"


def _product(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _shape(fn: str, dims: tuple) -> tuple[int, ...]:
    if not dims:
        raise ValueError(f"{fn}() needs at least one dimension")
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            raise ValueError(f"{fn}() takes positive compile-time ints, got {d!r}")
    return tuple(dims)


def spatial(*shape: int) -> TaskMapping:
    """A task grid of `shape` with one task per worker (prod(shape) workers)."""
    return SpatialMapping(_shape("spatial", shape))


def repeat(*shape: int) -> TaskMapping:
    """A task grid of `shape` done entirely by one worker."""
    return RepeatMapping(_shape("repeat", shape))
