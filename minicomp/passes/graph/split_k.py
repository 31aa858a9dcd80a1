"""Split-K for the CUDA targets: a matrix product whose few output tiles leave SMs idle becomes
S partial products over chunks of K and their sum.

A matmul template gives each BM x BN tile of C (per batch) one block, which walks all of K. A
product such as (M=16, N=1024, K=16384) or (64 x 64 x 65536) has a handful of tiles, so a
handful of the GPU's SMs (an H100 has 132) do all the work while the rest idle. This pass rewrites a
compute op that is a contraction (one `sum` over K of a product `a * b`, classified into
batch, M and N axes by minicomp.ir.contraction.product_sides, exactly as the
template will see the fused group) into two:

- partial, shape (S, *out_shape) with the output's axes in the product's order (batch axes,
  then M's, then N's: a convolution's (n, c, h, w) becomes (n, h, w, c)): element (s, ...)
  is the same sum over the chunk k = s * CHUNK + kk, kk < CHUNK, in the Reduce's own type
  (the accumulator: f32 for f16 and bf16 operands, so precision is unchanged; only the order
  of the additions differs). S comes first and N last, so every partial slice is a
  contiguous matrix that the template stores coalesced, and the final sum reads it along
  the rows. The partial is itself a contraction in which s is read by both operands, a batch
  axis, so a matmul template computes it with S times as many blocks;
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
numbers in parentheses). Two rules, the second tried where the first keeps the product whole.

The first fills the GPU for a long K (`plan_split`):
- tiles < max_tiles(SMS) (66, half of SMS): with more, the grid already keeps at least half
  the GPU busy and the partials' round trip through memory would cost more than it frees;
- K >= MIN_K (8192): the rule splits by the grid alone, which pays where each block's walk
  over K is long against the partials' round trip; the second rule weighs shorter ones;
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

The second weighs a split of a tensor-core product (16-bit operands summed in f32, what
matmul_tc computes) with fewer tiles than SMs (`plan_balanced_split`). Such a grid leaves SMs
idle, or the template fills them with half tiles (128 x 64) whose 64 x 32 warp tiles ask
1.4 times the shared-memory bandwidth the tensor cores' rate allows (matmul_tc.step_cost); S
chunks give S times the blocks, of the efficient 128 x 128 tiles, at the price of the
partials' round trip. matmul_tc splits such a product itself, inside one kernel, where its
level-0 model finds that pays (matmul_tc.level0_splits: the last block of each tile adds the
partials); this rule splits it in the graph, a partial product and a final sum, only where
that beats what the template would do with it whole. `estimated_time` prices each choice in
mma flops of one SM with matmul_tc's model (matmul_tc.product_work: the longest of the
busiest SM's mma work at the tile the level-0 heuristic picks, and the bytes DRAM and L2
move), plus for a split in the graph the final sum's reads of the partials, which the partial
product just wrote, at L2 speed where they fit in L2 (L2_BYTES), and its writes of the output
at DRAM speed, and its launch (LAUNCH_FLOPS); `in_kernel_time` is the template's own choice.
Of the exact chunkings (no guard) with chunks a multiple of ALIGN, at least MIN_CHUNK long and
tiles * S <= target_blocks(SMS), the one with the least estimate splits the product if it
beats the template's. (ResNet-50's late 3 x 3 convolutions, 1568 x 512 over K = 512 x 9, 52
tiles: whole on 104 half tiles, in 2 chunks of 256 channels on 104 full ones, 19% less in
two kernels, 26% less in one; their 1 x 1 neighbour over K = 2048 (22% less) and 1024 x 1024
x 1024 (8%) also split in 2 inside the kernel.) f32 products, on the SIMT template, split by
the first rule only.

On sm_90a (`arch`, which the targets bind to the compile's) a tensor-core product is the
Hopper matmul's (templates/matmul_hopper.py), whose persistent grid, tile sizes down to 64 x
64 and deep TMA ring change the trade: both rules give way to one weighing with that
template's level-0 model (`hopper_time`: matmul_hopper.config_time of the whole product, or
of the batch of partial products plus the final sum priced as above at the wgmma rate). It
keeps 128 x 4096 x 11008 whole (the lens: 29.0 us whole against 34.6 split in 8, the grid
rule's choice) and still splits one 64 x 64 tile over K = 8192 into 16 chunks of 512.

The pass runs before split_reductions (the CUDA targets' pass list, minicomp/targets.py),
which would otherwise take a long-K product with few outputs (16 x 16 x 2^15) for a row
reduction and split it with the chunk index last and unravelled, a form no template
computes. After split-K, split_reductions finds the partials' rows short (or, when chunks are
long, too many: S * M * N with M, N >= 2) and the final sums S <= 2 * SMS long, and leaves
both alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minicomp.backends.cuda.arch import WGMMA_ARCH
from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir.compute import Compute, Reduce, TensorInput
from minicomp.ir.contraction import is_widening, product_sides
from minicomp.ir.expr import Expr, Var, const, minimum, prod, select
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ComputeOp, Graph, Op, TensorType, Value
from minicomp.ir.types import f32, i64
from minicomp.passes.graph.rewrite import fresh_name, inputs_read, value_names
from minicomp.schedule.templates import matmul_hopper
from minicomp.schedule.templates.base import DEFAULT_ARCH
from minicomp.schedule.templates.matmul_tc import (
    FLOPS_PER_DRAM_BYTE,
    FLOPS_PER_L2_BYTE,
    level0_splits,
    product_work,
)
from minicomp.script.mma import MMA_TYPES

# The largest tile edge of the matmul templates: a product launches about
# B * ceil(M / TILE) * ceil(N / TILE) blocks.
TILE = 128
# The first rule leaves products over a shorter K to the second.
MIN_K = 8192
# The shortest chunk of K a partial product sums.
MIN_CHUNK = 512
# A chunk that is a multiple of this many elements is preferred.
ALIGN = 64
# The second rule's price of the final sum's launch, in mma flops of one SM (an H100 SM's 5
# TFLOP/s for the microsecond a launch in a CUDA graph takes); its bytes are priced as
# matmul_tc's model prices them (FLOPS_PER_DRAM_BYTE, FLOPS_PER_L2_BYTE).
LAUNCH_FLOPS = 5e6
# The same launch in wgmma flops of one SM (an H100 SM's 7.5 TFLOP/s of wgmma for a
# microsecond), as the Hopper model (matmul_hopper.tile_time) counts.
HOPPER_LAUNCH_FLOPS = 7.5e6
# Partials of at most this many bytes are still in L2 when the final sum reads them: the
# smaller L2 of the GPUs the lens describes (an A100's 40 MB; an H100's is 50).
L2_BYTES = 40 * 2**20
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


def split_k(graph: Graph, *, sms: int = H100_SMS, arch: str = DEFAULT_ARCH) -> Graph:
    """`graph` with every small-grid, long-K matrix product replaced by a partial product per
    K-chunk and their sum, grids judged small and chunks sized for a GPU of `sms` SMs and
    architecture `arch` (see the module docstring)."""
    names = value_names(graph)
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        split = _split_op(n, names, sms, arch) if isinstance(n, ComputeOp) else None
        nodes.extend(split or (n,))
        changed |= split is not None
    return graph.replace(nodes=tuple(nodes)) if changed else graph


@dataclass(frozen=True)
class Product:
    """A matrix product with static sizes as the split weighs it: `batch` products of an
    m x n matrix over K extents `k`; `order`, the positions of its compute's axes with the
    batch axes first, then M's, then N's (unit axes, which no side claims, first of all); the
    bytes of an output and of an accumulator (partial) element, of the tensors it reads (None
    when a size is symbolic), whether matmul_tc computes it (16-bit operands, f32 sums), and
    the bytes of an operand element."""

    batch: int
    m: int
    n: int
    k: tuple[int, ...]
    order: tuple[int, ...] = ()
    out_size: int = 2
    acc_size: int = 4
    operand_bytes: int | None = None
    tensor_cores: bool = True
    in_size: int = 2

    @property
    def tiles(self) -> int:
        """The blocks a template with TILE x TILE tiles launches for the product."""
        return self.batch * -(-self.m // TILE) * -(-self.n // TILE)


def find_product(d: Compute, reads: Sequence[Value] = ()) -> tuple[Product, Reduce] | None:
    """The product a compute definition holding one sum that is a contraction with static
    sizes computes, reading values `reads`, and its sum; else None."""
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
    side_of = {v: q for q, axes in enumerate((sides.batch, sides.m, sides.n)) for v, _ in axes}
    order = sorted(range(len(d.axes)), key=lambda q: (side_of.get(d.axes[q], -1), q))
    batch = prod(x for _, x in sides.batch)
    m, n = prod(x for _, x in sides.m), prod(x for _, x in sides.n)
    read = [prod(v.type.shape) * v.type.dtype.nbytes for v in reads]
    a, b = sides.operand_dtypes
    tensor_cores = a == b and a in MMA_TYPES and red.dtype == f32
    p = Product(
        batch,
        m,
        n,
        red.extents,
        tuple(order),
        d.dtype.nbytes,
        red.dtype.nbytes,
        sum(read) if all(isinstance(x, int) for x in read) else None,
        tensor_cores,
        a.nbytes,
    )
    return p, red


def plan(p: Product, sms: int = H100_SMS, arch: str = DEFAULT_ARCH) -> KSplit | None:
    """How to chunk product `p` on a GPU of `sms` SMs and architecture `arch`, or None to keep
    it whole: on sm_90a a tensor-core product's `plan_hopper_split`; else the first rule's
    split (`plan_split`), else the second's (`plan_balanced_split`)."""
    if arch == WGMMA_ARCH and p.tensor_cores:
        return plan_hopper_split(p, sms)
    return plan_split(p.tiles, p.k, sms) or plan_balanced_split(p, sms)


def hopper_time(p: Product, chunks: int, sms: int = H100_SMS) -> float:
    """The Hopper matmul's level-0 model of product `p` in `chunks` exact chunks (1: whole) on
    a GPU of `sms` SMs, in wgmma flops of one SM: matmul_hopper.config_time of the product, or
    of `chunks` partial products writing f32 partials plus the final sum's reads of them (at
    L2 speed where they fit in L2_BYTES), its writes of the output and its launch."""
    k = prod(p.k)
    if chunks == 1:
        return matmul_hopper.config_time(
            p.m, p.n, k, sms, p.batch, in_bytes=p.in_size, out_bytes=p.out_size
        )
    main = matmul_hopper.config_time(
        p.m, p.n, -(-k // chunks), sms, chunks * p.batch, in_bytes=p.in_size, out_bytes=p.acc_size
    )
    partials = chunks * p.batch * p.m * p.n * p.acc_size
    out = p.batch * p.m * p.n * p.out_size
    read = (
        matmul_hopper.WGMMA_FLOPS_PER_L2_BYTE
        if partials <= L2_BYTES
        else matmul_hopper.WGMMA_FLOPS_PER_DRAM_BYTE
    )
    final = partials * read + out * matmul_hopper.WGMMA_FLOPS_PER_DRAM_BYTE
    return main + final / sms + HOPPER_LAUNCH_FLOPS


def plan_hopper_split(p: Product, sms: int = H100_SMS) -> KSplit | None:
    """The split of tensor-core product `p` on sm_90a with `sms` SMs: of the exact chunkings
    with chunks a multiple of ALIGN, at least MIN_CHUNK long and tiles * chunks at most
    target_blocks(sms), the one with the least `hopper_time`, if that is less than the
    product's whole; else None."""
    if prod(p.k) == 1:
        return None
    return _least_exact_split(p, sms, hopper_time(p, 1, sms), hopper_time)


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


def estimated_time(p: Product, chunks: int, sms: int = H100_SMS) -> float:
    """What the second rule weighs for product `p` in `chunks` exact chunks (1: whole) on a
    GPU of `sms` SMs, in mma flops of one SM (the time its tensor cores take for them):
    matmul_tc's level-0 model of the whole product or of the partial one (chunks products
    writing f32 partials: matmul_tc.product_work, the longest of the busiest SM's mma work
    and the bytes DRAM and L2 move); for a split, plus the final sum's reads of the partials
    (at L2 speed where they fit in L2_BYTES: the partial product just wrote them) and writes of
    the output at DRAM speed, and its launch."""
    k = prod(p.k)
    operands = p.operand_bytes or 0
    if chunks == 1:
        return product_work(p.batch, p.m, p.n, k, sms, operand_bytes=operands, out_size=p.out_size)
    main = product_work(
        chunks * p.batch,
        p.m,
        p.n,
        -(-k // chunks),
        sms,
        operand_bytes=operands,
        out_size=p.acc_size,
    )
    partials = chunks * p.batch * p.m * p.n * p.acc_size
    out = p.batch * p.m * p.n * p.out_size
    read = FLOPS_PER_L2_BYTE if partials <= L2_BYTES else FLOPS_PER_DRAM_BYTE
    return main + (partials * read + out * FLOPS_PER_DRAM_BYTE) / sms + LAUNCH_FLOPS


def in_kernel_time(p: Product, sms: int = H100_SMS) -> float:
    """The least time matmul_tc's level-0 heuristic gives product `p` on a GPU of `sms` SMs
    when it stays whole in the graph: whole, or split inside the kernel
    (matmul_tc.level0_splits), in `estimated_time`'s unit."""
    k, operands = prod(p.k), p.operand_bytes or 0
    splits = level0_splits(p.batch, p.m, p.n, k, sms, operands, p.out_size)
    return product_work(
        p.batch, p.m, p.n, k, sms, operand_bytes=operands, out_size=p.out_size, splits=splits
    )


def plan_balanced_split(p: Product, sms: int = H100_SMS) -> KSplit | None:
    """The second rule's split of product `p` on a GPU of `sms` SMs (see the module
    docstring): the exact, aligned chunking with the least `estimated_time`, if that is less
    than what matmul_tc does with the product whole (`in_kernel_time`); else None."""
    k = prod(p.k)
    if not p.tensor_cores or p.operand_bytes is None or not 1 <= p.tiles < sms or k == 1:
        return None  # k == 1: an outer product, nothing to chunk
    return _least_exact_split(p, sms, in_kernel_time(p, sms), estimated_time)


def _least_exact_split(
    p: Product, sms: int, whole: float, time_of: Callable[[Product, int, int], float]
) -> KSplit | None:
    """Of product `p`'s exact chunkings (chunks a multiple of ALIGN, at least MIN_CHUNK long,
    tiles * chunks at most target_blocks(sms)), the one `time_of(p, chunks, sms)` prices
    least, if below `whole`; else None."""
    k = prod(p.k)
    axis = next(q for q, x in enumerate(p.k) if x != 1)
    extent = p.k[axis]
    inner = k // extent
    best, least = None, whole
    for s in range(2, max(2, target_blocks(sms) // p.tiles) + 1):
        length = extent // s
        if extent % s or length * inner % ALIGN or length * inner < MIN_CHUNK:
            continue
        t = time_of(p, s, sms)
        if t < least:
            best, least = KSplit(axis, s, length, True), t
    return best


def _split_op(op: ComputeOp, names: set[str], sms: int, arch: str) -> list[ComputeOp] | None:
    d = op.definition
    found = find_product(d, inputs_read(d, op.inputs))
    if found is None:
        return None
    product, red = found
    how = plan(product, sms, arch)
    if how is None:
        return None
    used = {v.name for v in collect(d, Var)}
    s, kk, j = (Var(fresh_name(base, used), i64) for base in ("s", "kk", "j"))
    k_var, extent = red.axes[how.axis], red.extents[how.axis]
    flat = s * how.length + kk
    if how.exact:
        body = substitute(red.body, {k_var: flat})
    else:
        # The last chunk runs past the axis: its loads are clamped into range and both
        # operands are 0 past the end (so is their product, even where the clamped element
        # is infinite). The guard goes inside the operands' widening casts, so that they keep
        # their narrow type (f16 operands for tensor cores), and the body stays a product.
        body = substitute(red.body, {k_var: minimum(flat, extent - 1)})
        inside = flat < extent
        body = body.replace(a=_guarded(body.a, inside), b=_guarded(body.b, inside))
    axes = tuple(kk if q == how.axis else v for q, v in enumerate(red.axes))
    extents = tuple(how.length if q == how.axis else x for q, x in enumerate(red.extents))
    value = op.outputs[0]
    pname = fresh_name(f"{value.name}_splitk", names)
    # The partial's axes in the product's order (batch, M, N): a row-major slice is then
    # the template's C matrix, stored coalesced whatever order the output's axes have (a
    # convolution's (n, c, h, w) is (n, h, w) x c).
    p_axes = tuple(d.axes[q] for q in product.order)
    shape = (how.chunks, *(d.shape[q] for q in product.order))
    partial = Compute(pname, shape, (s, *p_axes), Reduce("sum", axes, extents, body))
    pvalue = Value(pname, TensorType(shape, partial.dtype, value.type.device))
    ptensor = TensorInput(pname, shape, partial.dtype)
    total = Reduce("sum", (j,), (how.chunks,), ptensor[(j, *p_axes)])
    final = d.replace(body=substitute(d.body, {red: total}))
    return [
        ComputeOp(op.name, inputs_read(partial, op.inputs), (pvalue,), partial),
        ComputeOp(op.name, inputs_read(final, (pvalue, *op.inputs)), op.outputs, final),
    ]


def _guarded(e: Expr, inside: Expr) -> Expr:
    """`e` where `inside` holds, else 0, selected inside any widening casts of `e`
    (contraction.is_widening: f16 -> f32, i8 -> i32)."""
    if is_widening(e):
        return e.replace(a=_guarded(e.a, inside))
    return select(inside, e, const(0, e.dtype))
