"""Split-K for the CUDA targets: a matrix product with few output tiles and a long K becomes S
partial products over chunks of K and their sum.

A matmul template gives each BM x BN tile of C (per batch) one block, which walks all of K. A
product such as (M=16, N=1024, K=16384) or (64 x 64 x 65536) has a handful of tiles, so a
handful of the GPU's SMs (an H100 has 132) do all the work while the rest idle. This pass rewrites a
compute op that is a contraction (one `sum` over K of a product `a * b`, classified into
batch, M and N axes by minicomp.ir.contraction.product_sides, exactly as the
template will see the fused group) into two:

- partial, shape (S, *out_shape): element (s, ...) is the same sum over the chunk
  k = s * CHUNK + kk, kk < CHUNK, in the Reduce's own type (the accumulator: f32 for f16 and
  bf16 operands, so precision is unchanged; only the order of the additions differs). S
  comes first, so every partial slice is a contiguous matrix that the template stores
  coalesced. The partial is itself a contraction in which s is read by both operands, a
  batch axis, so a matmul template computes it with S times as many blocks;
- final, out_shape: the original definition with its Reduce replaced by the sum over s of
  partial[s, ...]. Whatever surrounded the Reduce (a cast back to f16, alpha) stays there, and
  the product's consumers (addmm's bias, an activation) fuse into this small reduction.

With several K variables (a convolution's channels and taps) only the outermost non-unit one
is chunked, the others kept whole in every chunk, so that the flat K index of the partial is
still `s * CHUNK + kk` (CHUNK = the chunk of that variable times the inner extents) and the
operands' indices stay affine: a template copies an operand read at `s * CHUNK + kk` with
cp.async like a bare strided read (schedule/templates/problem.py, `_plain`), the chunk
offset becoming a batch stride. When the chunks cannot tile the axis exactly, the last one is
guarded as in split_reductions.py (its index clamped into range, the product past the end
replaced by 0); the clamp makes the operand a computed one (loaded through registers), so
the chunk is chosen to divide the axis whenever that costs little parallelism.

When to split (all sizes static; tiles = B * ceil(M / TILE) * ceil(N / TILE), the blocks the
template's largest tiles launch; SMS is the SM count of the GPU the graph compiles for, the
`sm_count` option the CUDA targets bind as `split_k(graph, sms=)`, 132 on an H100, the
numbers in parentheses):
- tiles < max_tiles(SMS) (66, half of SMS): with more, the grid already keeps at least half
  the GPU busy and the partials' round trip through memory would cost more than it frees;
- K >= MIN_K (8192): with a shorter K a tile's work is a few microseconds, no more than the
  second kernel's launch and the partials' round trip;
- the chunk is at least MIN_CHUNK (512) long: a block then reads at least 512 * (BM + BN)
  operand elements for the BM * BN partials it writes (f32) and the final kernel reads back,
  so the extra traffic is at most half of a full 128 x 128 tile's operand reads (f16), and
  much less for the skinny tiles (M = 16) that split-K is mostly for. This is the form of
  "K long compared with M and N" that matters per block: a rule such as K >= 4 * max(M, N)
  would leave the skinny LLM products (16 x 4096 x 11008: 32 tiles, memory bound, where a
  quarter of the SMs cannot pull the GPU's bandwidth) unsplit, although their partials are
  2 MB against 90 MB of weights.
- S: tiles * S at most target_blocks(SMS) (264, two blocks per SM) and CHUNK >= MIN_CHUNK, with
  CHUNK = ceil(K / S), the most even chunks for S (only the last may be shorter). Of the
  counts launching at least FILL_SLACK (3/4) of the most blocks any of them launches (counting
  up to SMS), the pass prefers an exact chunk (dividing the axis: no guard, plain operands),
  then S with tiles * S >= SMS, then a chunk that is a multiple of ALIGN (64: every template's
  K step divides it, and chunk offsets keep 16-byte cp.async sources aligned), then the
  fewest chunks (the least partial traffic). (16 x 1024 x 16384: 8 tiles, S = 32 chunks of
  512; 64 x 64 x 65536: S = 128 of 512; 16 x 4096 x 11008: S = 8 of 1376.)

The pass runs before split_reductions (the CUDA targets' pass list, minicomp/targets.py),
which would otherwise take a long-K product with few outputs (16 x 16 x 2^15) for a row
reduction and split it with the chunk index last and unravelled, a form no template
computes. After split-K, split_reductions finds the partials' rows short (or, when chunks are
long, too many: S * M * N with M, N >= 2) and the final sums S <= 2 * SMS long, and leaves
both alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir.compute import Compute, Reduce, TensorInput
from minicomp.ir.contraction import product_sides
from minicomp.ir.expr import Cast, Expr, Var, const, minimum, prod, select
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ComputeOp, Graph, Op, TensorType, Value
from minicomp.ir.types import i64
from minicomp.passes.graph.rewrite import fresh_name, inputs_read, value_names

# The largest tile edge of the matmul templates: a product launches about
# B * ceil(M / TILE) * ceil(N / TILE) blocks.
TILE = 128
# Products over a shorter K stay whole.
MIN_K = 8192
# The shortest chunk of K a partial product sums.
MIN_CHUNK = 512
# A chunk that is a multiple of this many elements is preferred.
ALIGN = 64
# A split may launch this fraction of the most blocks (up to SMS) any split launches, when
# that buys an exact or aligned chunk, or fewer chunks.
FILL_SLACK = 3 / 4


def max_tiles(sms: int) -> int:
    """Products with at least this many tiles keep half of `sms` SMs busy and stay whole."""
    return sms // 2


def target_blocks(sms: int) -> int:
    """The most blocks (tiles * chunks) a split aims at: two per SM."""
    return 2 * sms


@dataclass(frozen=True)
class KSplit:
    """How K is chunked: the reduce axis at `axis` (the outermost non-unit one) runs over
    `chunks` chunks of `length` (the last one shorter unless `exact`)."""

    axis: int
    chunks: int
    length: int
    exact: bool


def split_k(graph: Graph, *, sms: int = H100_SMS) -> Graph:
    """`graph` with every small-grid, long-K matrix product replaced by a partial product per
    K-chunk and their sum, grids judged small and chunks sized for a GPU of `sms` SMs (see the
    module docstring)."""
    names = value_names(graph)
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        split = _split_op(n, names, sms) if isinstance(n, ComputeOp) else None
        nodes.extend(split or (n,))
        changed |= split is not None
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def product_tiles(d: Compute) -> tuple[int, Reduce] | None:
    """(tiles, the sum) of a compute definition holding one sum that is a contraction with
    static sizes: the blocks a template with TILE x TILE tiles launches for it; else None."""
    found = collect(d.body, Reduce)
    if len(found) != 1 or found[0].kind != "sum":
        return None
    red = found[0]
    sizes = (*d.shape, *red.extents)
    if not all(isinstance(x, int) and x > 0 for x in sizes):
        return None
    outer = [(v, x) for v, x in zip(d.axes, d.shape) if x != 1]
    sides = product_sides(red.body, outer, red.axes)
    if sides is None:
        return None
    batch = prod(x for _, x in sides.batch)
    m, n = prod(x for _, x in sides.m), prod(x for _, x in sides.n)
    return batch * -(-m // TILE) * -(-n // TILE), red


def plan_split(tiles: int, k_extents: Sequence[int], sms: int = H100_SMS) -> KSplit | None:
    """How to chunk a product of `tiles` tiles over K extents `k_extents` on a GPU of `sms`
    SMs, or None when it is not worth splitting (see the module docstring for the rules)."""
    k = prod(k_extents)
    if not 1 <= tiles < max_tiles(sms) or k < MIN_K:
        return None
    axis = next(q for q, x in enumerate(k_extents) if x != 1)
    extent = k_extents[axis]
    inner = k // extent
    options: dict[int, KSplit] = {}
    most_blocks = target_blocks(sms)
    for s in range(2, most_blocks // tiles + 1):
        length = -(-extent // s)
        chunks = -(-extent // length)
        if chunks >= 2 and length * inner >= MIN_CHUNK and tiles * chunks <= most_blocks:
            options[length] = KSplit(axis, chunks, length, chunks * length == extent)
    if not options:
        return None
    most = max(min(tiles * o.chunks, sms) for o in options.values())
    fair = [o for o in options.values() if min(tiles * o.chunks, sms) >= FILL_SLACK * most]

    def preference(o: KSplit) -> tuple:
        aligned = o.length * inner % ALIGN == 0
        return (o.exact, tiles * o.chunks >= sms, aligned, -o.chunks, -o.length)

    return max(fair, key=preference)


def _split_op(op: ComputeOp, names: set[str], sms: int) -> list[ComputeOp] | None:
    d = op.definition
    found = product_tiles(d)
    if found is None:
        return None
    tiles, red = found
    plan = plan_split(tiles, red.extents, sms)
    if plan is None:
        return None
    used = {v.name for v in collect(d, Var)}
    s, kk, j = (Var(fresh_name(base, used), i64) for base in ("s", "kk", "j"))
    k_var, extent = red.axes[plan.axis], red.extents[plan.axis]
    flat = s * plan.length + kk
    if plan.exact:
        body = substitute(red.body, {k_var: flat})
    else:
        # The last chunk runs past the axis: its loads are clamped into range and both
        # operands are 0 past the end (so is their product, even where the clamped element
        # is infinite). The guard goes inside the operands' widening casts, so that they keep
        # their narrow type (f16 operands for tensor cores), and the body stays a product.
        body = substitute(red.body, {k_var: minimum(flat, extent - 1)})
        inside = flat < extent
        body = body.replace(a=_guarded(body.a, inside), b=_guarded(body.b, inside))
    axes = tuple(kk if q == plan.axis else v for q, v in enumerate(red.axes))
    extents = tuple(plan.length if q == plan.axis else x for q, x in enumerate(red.extents))
    value = op.outputs[0]
    pname = fresh_name(f"{value.name}_splitk", names)
    shape = (plan.chunks, *d.shape)
    partial = Compute(pname, shape, (s, *d.axes), Reduce("sum", axes, extents, body))
    pvalue = Value(pname, TensorType(shape, partial.dtype, value.type.device))
    ptensor = TensorInput(pname, shape, partial.dtype)
    total = Reduce("sum", (j,), (plan.chunks,), ptensor[(j, *d.axes)])
    final = d.replace(body=substitute(d.body, {red: total}))
    return [
        ComputeOp(op.name, inputs_read(partial, op.inputs), (pvalue,), partial),
        ComputeOp(op.name, inputs_read(final, (pvalue, *op.inputs)), op.outputs, final),
    ]


def _guarded(e: Expr, inside: Expr) -> Expr:
    """`e` where `inside` holds, else 0, selected inside any float-widening casts of `e`."""
    if isinstance(e, Cast) and e.a.dtype.is_float and e.a.dtype.nbytes <= e.dtype.nbytes:
        return e.replace(a=_guarded(e.a, inside))
    return select(inside, e, const(0, e.dtype))
