"""Two-pass reductions for the CUDA targets: long reductions over few rows split into chunks.

The CUDA scheduler reduces each output row on one block (or warp), so `x.sum()` over 2^24
elements, or `x.sum(dim=1)` over a (2, 2^22) tensor, keeps one or two SMs busy. This pass
rewrites such a compute op into two:

- partial, shape (outer..., C): element (o..., c) reduces CHUNK consecutive elements of the
  reduced axes flattened in row-major order (flat index c * CHUNK + k, unravelled back into
  the original reduce variables). When L % CHUNK != 0, or L is symbolic, the flat index is
  clamped into range (so every load stays in bounds, see ops/shape.py) and the element past
  the end is replaced by the reduction's identity with a Select;
- final, shape (outer...): the original definition with its Reduce replaced by the same
  reduction of the C partials (anything around the Reduce, like a cast back to f16, a divide
  or a sqrt, stays in the final op, where fusion keeps it with the final reduction).

Partials have the Reduce's own type, which is the accumulator the unsplit reduction uses (an
f16 or bf16 sum accumulates in f32 because the lowering casts its body to f32; integer sums in
i64), so splitting only changes the order of the combination, never its precision. Producers
still fuse into the partial op (they are read at the unravelled index), and consumers of the
result into the final op.

Kinds: sum, prod, max, min, any and all are associative and split as above. argmax/argmin
split too, with index partials: the partial holds, per chunk, the flat index of its best
element (chunk-local argmax + c * CHUNK; out-of-range elements get the identity of max/min,
which never beats an in-range element and loses ties, being later); the final op takes the
argmax over the chunks of the element value gathered at those indices and returns the
partial index of the winning chunk. As chunks are in index order, NaN-first and
first-of-ties hold across chunks as within one. (The final op reads the reduction's inputs
again at C gathered indices; an injective producer the argument reads is therefore shared
by two reductions and is computed as a kernel of its own instead of fusing.)

When to split (R = number of output rows, L = reduced length, both products of extents):
- R static and 1 <= R <= MAX_ROWS (256): with more rows the grid is already wide enough;
- L static and >= MIN_LENGTH (2^15), or L symbolic (a full reduction under dynamic=True);
- CHUNK, for static L, is the power of two that makes R * C land in (TARGET_ROWS / 2,
  TARGET_ROWS] (1024 block rows: about 8 resident 256-thread blocks per SM on an H100's 132;
  a fixed count, not the compile's `sm_count`: a GPU with fewer SMs runs more rounds of
  blocks, a larger one still fills with 1024 when its SMs hold 8 each),
  but at least MIN_CHUNK (2048, 8 elements per thread of a block); for symbolic L it is
  SYMBOLIC_CHUNK (4096) and C the symbolic ceil-div (L + 4095) // 4096.
Each partial row is then >= 2048 long (a block per row in the CUDA scheduler), and each final
row C <= a few thousand long for static L.
Row statistics that chain reductions (softmax, var, layer_norm over one long row) split each
reduction: one fused row kernel becomes a partial and a final kernel per reduction plus the
elementwise tail, worth it when the row is long enough for one block to be the bottleneck.
Rows of symbolic count are never split.
"""

from __future__ import annotations

from collections.abc import Sequence

from minicomp.ir.compute import Compute, Reduce, TensorInput, identity
from minicomp.ir.expr import Dim, Expr, Var, const, dim_expr, minimum, prod, select
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ComputeOp, Graph, Op, TensorType, Value
from minicomp.ir.types import i64
from minicomp.passes.graph.rewrite import fresh_name, inputs_read, value_names

# Only reductions with at most this many output rows are split.
MAX_ROWS = 256
# Static reductions shorter than this stay as they are.
MIN_LENGTH = 2**15
# The number of partial rows (blocks of the partial kernel) aimed at.
TARGET_ROWS = 1024
# The shortest chunk; the chunk of a symbolic length.
MIN_CHUNK = 2048
SYMBOLIC_CHUNK = 4096

_KINDS = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin")


def split_reductions(graph: Graph) -> Graph:
    """`graph` with every long, few-row reduction op replaced by a partial and a final op."""
    names = value_names(graph)
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        split = _split_op(n, names) if isinstance(n, ComputeOp) else None
        if split is None:
            nodes.append(n)
        else:
            nodes.extend(split)
            changed = True
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def chunk_size(rows: Dim, length: Dim) -> int | None:
    """The chunk a reduction of `rows` rows of `length` elements is split into, or None when it
    is not worth splitting (see the module docstring)."""
    if not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        return None
    if not isinstance(length, int):
        return SYMBOLIC_CHUNK
    if length < MIN_LENGTH:
        return None
    want = -(-length * rows // TARGET_ROWS)
    return max(MIN_CHUNK, 1 << (want - 1).bit_length())


def _split_op(op: ComputeOp, names: set[str]) -> list[ComputeOp] | None:
    d = op.definition
    found = collect(d.body, Reduce)
    if len(found) != 1 or found[0].kind not in _KINDS:
        return None
    red = found[0]
    length = prod(red.extents)
    chunk = chunk_size(prod(d.shape), length)
    if chunk is None:
        return None
    chunks = _ceil_div(length, chunk)
    used = {v.name for v in collect(d, Var)}
    c, k, j = (Var(fresh_name(base, used), i64) for base in ("c", "k", "j"))
    flat = c * chunk + k
    exact = isinstance(length, int) and length % chunk == 0
    at = flat if exact else minimum(flat, dim_expr(length) - 1)
    element = _element(red, at)
    arg = red.kind in ("argmax", "argmin")
    if not exact:
        fill = identity(red.kind[3:] if arg else red.kind, element.dtype)
        element = select(flat < dim_expr(length), element, fill)
    part_body: Expr = Reduce(red.kind, (k,), (chunk,), element)
    if arg:
        part_body = part_body + c * chunk
    value = op.outputs[0]
    pname = fresh_name(f"{value.name}_partial", names)
    shape = tuple(d.shape) + (chunks,)
    partial = Compute(pname, shape, tuple(d.axes) + (c,), part_body)
    pvalue = Value(pname, TensorType(shape, partial.dtype, value.type.device))
    pt = TensorInput(pname, shape, partial.dtype)
    if arg:
        # The value of each chunk's best element, gathered at its index; the winning chunk's
        # index is the answer.
        best = Reduce(red.kind, (j,), (chunks,), _element(red, pt[(*d.axes, j)]))
        combined: Expr = pt[(*d.axes, best)]
    else:
        combined = Reduce(red.kind, (j,), (chunks,), pt[(*d.axes, j)])
    final = d.replace(body=substitute(d.body, {red: combined}))
    return [
        ComputeOp(op.name, inputs_read(partial, op.inputs), (pvalue,), partial),
        ComputeOp(op.name, inputs_read(final, (pvalue, *op.inputs)), op.outputs, final),
    ]


def _element(red: Reduce, flat: Expr) -> Expr:
    """The body of `red` at the element of row-major flat index `flat` of its reduced axes."""
    return substitute(red.body, dict(zip(red.axes, _unravel(flat, red.extents))))


def _unravel(flat: Expr, extents: Sequence[Dim]) -> list[Expr]:
    """The row-major coordinates of `flat` over `extents` (0 along unit extents)."""
    out: list[Expr] = []
    for q, x in enumerate(extents):
        if isinstance(x, int) and x == 1:
            out.append(const(0))
            continue
        below = prod(extents[q + 1 :])
        e = flat if isinstance(below, int) and below == 1 else flat // dim_expr(below)
        if any(not (isinstance(y, int) and y == 1) for y in extents[:q]):
            e = e % dim_expr(x)
        out.append(e)
    return out


def _ceil_div(n: Dim, d: int) -> Dim:
    if isinstance(n, int):
        return -(-n // d)
    return (dim_expr(n) + (d - 1)) // d
