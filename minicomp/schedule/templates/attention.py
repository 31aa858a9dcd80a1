"""A fused attention template (flash attention): softmax(Q K^T * scale + mask) V in one kernel,
f16 or bf16 operands, tensor cores (mma.sync m16n8k16) and f32 accumulation.

A block owns BM query rows of one (batch, head): BM / WM warps, WM rows each (16, or 32 as
two m16 tiles: each K or V fragment read from shared memory then feeds two mma, which halves
the shared-memory traffic per mma that bounds the kernel at 16). It walks the keys in steps
of BN. Each step's K and V tiles reach shared memory through `stages` buffers
(16-byte cp.async copies, zero-filled past the last key; the copy of step t + stages - 1 is
in flight while step t computes, as in matmul_tc), and a warp then computes

    S = Q K^T                    mma, Q fragments (ldmatrix) against K rows (ldmatrix)
    S = S * scale * log2(e) (+ mask * log2(e)), -inf where masked
    m' = max(m, rowmax(S));  P = exp2(S - m');  l = l * exp2(m - m') + rowsum(P)
    O = O * exp2(m - m') + P V   P converted to f16/bf16 in registers: the accumulator
                                 layout of S is the A-operand layout of P; V by ldmatrix.trans

all in registers (f32 running max and sum per row; a lane holds two rows, reduced across the
four lanes of a row with shuffles). At the end O / l goes through shared memory to coalesced
16-byte stores, and the logsumexp ((m + log2 l) * ln 2) to its own output when asked for.

Masks: causal (top-left aligned, like PyTorch: query i sees keys j <= i) stops the key loop
at the block's last row and masks only the steps that cross the diagonal; an additive mask
of any float type, broadcastable to (B, H, Sq, Sk), is read with its strides (a broadcast
dimension has stride 0). Rows that every key masks give 0 (and logsumexp 0, as in PyTorch).

Every tensor is addressed with its own strides (kernel constants, or size expressions when
symbolic): Q, K, V and O may be transposed views such as a projection's (B, S, H, D) seen
as (B, H, S, D). The 16-byte copies need a unit stride along the head dim and row strides
that are multiples of 8 elements (checked at compile time when static) and 16-byte aligned
bases, checked at run time once per (batch, head); otherwise the block loads and stores the
same elements one by one. K and V may have fewer heads than Q (grouped-query attention).

Q's fragments stay in registers for the whole loop when `q_regs` (its shared rows are then
reused by the last stage buffer); otherwise they are read from shared memory every step
(large head dims, where registers are short).

`instantiate` builds the kernel in steps: the tile copies of Q, K/V and O (`_copies`,
tiles.py), the stages of a key step (`_scores`, `_scale_and_mask`, `_online_softmax`,
`_add_pv`) and the final division (`_normalize`) as fragments, then the loops calling them
(`_kernel`).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir import types as T
from minicomp.ir.expr import Dim, Expr, Var, dim_expr, maximum, minimum, prod
from minicomp.ir.func import Function
from minicomp.ir.functor import collect
from minicomp.schedule.templates import tiles
from minicomp.schedule.templates.base import (
    DEFAULT_ARCH,
    MAX_DYNAMIC_SHARED,
    Template,
    WarpTiled,
    finish,
    search_space,
)
from minicomp.schedule.templates.problem import MAX_GRID_Z, ceil_div, needs_check
from minicomp.script.function import script
from minicomp.script.lang import (
    Macro,
    attrs,
    blockIdx,
    cp_async_commit,
    cp_async_wait,
    cp_async_wait_all,
    dynamic_shared_tensor,
    exp2,
    gridDim,
    is_aligned,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    log2,
    mma_sync_m16n8k16,
    register_tensor,
    shfl_xor_sync,
    syncthreads,
    threadIdx,
    unroll,
)
from minicomp.script.mma import MMA_TYPES
from minicomp.script.types import bf16, f16, f32, i32, i64
from minicomp.script.values import TensorRef

NAME = "attention"
MAX_SHARED = MAX_DYNAMIC_SHARED
# f32 registers a thread may hold in accumulators and Q fragments (more spill).
MAX_ACC_REGS = 144
# With two m16 tiles a warp, the most keys a step by head dim: ptxas's register use is no
# simple sum there (NVRTC for sm_80 and sm_90 with a mask or causal spills at head dim 128
# with 48 keys, 112 with 32, 96 with 48 and 64 with 128), so only measured pairs are allowed.
MAX_BN_2M = {64: 64, 128: 32}
# The same with an additive mask, whose loads and guards need registers too (head dim 128
# with 32 keys spills on sm_80 then).
MAX_BN_2M_MASKED = {64: 64}
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = float("-inf")
_SCRIPT_TYPES = {T.f16: f16, T.bf16: bf16}


@dataclass(frozen=True)
class AttnConfig(WarpTiled):
    """BM query rows a block, WM of them a warp (16 or 32: one or two m16 tiles), BN keys a
    step, `stages` K/V buffers, and whether Q's fragments stay in registers."""

    bm: int
    bn: int
    stages: int
    q_regs: bool
    wm: int = 16

    @property
    def warps(self) -> int:
        return self.bm // self.wm

    @property
    def m_tiles(self) -> int:
        """The warp's m16 tiles: each K or V fragment read from shared memory feeds this many
        mma (shared traffic per mma falls as it grows; registers rise)."""
        return self.wm // 16

    def __str__(self) -> str:
        wm = f"_w{self.wm}" if self.wm != 16 else ""
        return f"{self.bm}x{self.bn}_s{self.stages}{'_qr' if self.q_regs else ''}{wm}"


@dataclass(frozen=True)
class Operand:
    """A tensor the kernel reads or writes: its buffer as a flat script tensor and the element
    strides of its (batch, head, row, column) dimensions (0 where broadcast)."""

    ref: TensorRef
    strides: tuple[Dim, Dim, Dim, Dim]

    @property
    def dtype(self) -> T.DataType:
        return self.ref.dtype

    def vector_ok(self) -> bool:
        """Whether 16-byte accesses along rows can work: unit column stride and row, head and
        batch strides that are multiples of 8 elements (False when a static one is not)."""
        sb, sh, sr, sc = self.strides
        if isinstance(sc, int) and sc != 1:
            return False
        return not any(isinstance(s, int) and s % tiles.CHUNK for s in (sb, sh, sr))


@dataclass
class AttentionProblem:
    """One attention call: sizes, types, operands, mask and scale (see the module doc).

    `params` are the kernel's IR parameters in the order a KernelOp passes them: the buffers
    of q, k, v, (mask), o, (lse), then the size symbols the sizes and strides use.

    `sms` is the SM count of the GPU it compiles for, which the heuristic fills with blocks.
    It is not part of the signature, as in MatmulProblem: tuning records are keyed by the
    architecture, and a record's config stays a valid candidate whatever the SM count. `arch`
    is the architecture it compiles for (sm_90a: the Hopper template, attention_hopper.py).
    """

    name: str
    dtype: T.DataType
    batch: Dim
    heads: Dim
    kv_heads: Dim
    seq_q: Dim
    seq_k: Dim
    head_dim: int
    q: Operand
    k: Operand
    v: Operand
    o: Operand
    lse: Operand | None = None
    mask: Operand | None = None
    causal: bool = False
    scale: float = 1.0
    sms: int = H100_SMS
    arch: str = DEFAULT_ARCH

    @property
    def buffers(self) -> tuple[Var, ...]:
        ops = (self.q, self.k, self.v, self.mask, self.o, self.lse)
        return tuple(op.ref.var for op in ops if op is not None)

    @property
    def symbols(self) -> tuple[Var, ...]:
        dims = [self.batch, self.heads, self.kv_heads, self.seq_q, self.seq_k]
        for op in (self.q, self.k, self.v, self.mask, self.o, self.lse):
            if op is not None:
                dims += [*op.strides, *op.ref.shape]
        found = {v for d in dims if isinstance(d, Expr) for v in collect(d, Var)}
        return tuple(sorted(found, key=lambda v: v.name))

    @property
    def params(self) -> tuple[Var, ...]:
        return self.buffers + self.symbols

    def signature(self) -> str:
        """A stable description for the tuning database: sizes, types, strides, mask, scale."""
        sizes = ",".join(_dim_text(d) for d in (self.batch, self.heads, self.kv_heads))
        seqs = ",".join(_dim_text(d) for d in (self.seq_q, self.seq_k))
        parts = [f"bhk={sizes} s={seqs} d={self.head_dim} t={self.dtype.short}"]
        for label, op in (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o)):
            parts.append(f"{label}={','.join(_dim_text(s) for s in op.strides)}")
        if self.mask is not None:
            parts.append(
                f"mask={self.mask.dtype.short}:{','.join(map(_dim_text, self.mask.strides))}"
            )
        parts.append(
            f"causal={int(self.causal)} scale={self.scale!r} lse={int(self.lse is not None)}"
        )
        return " ".join(parts)


def _dim_text(d: Dim) -> str:
    if isinstance(d, int):
        return str(d)
    from minicomp.ir.printer import expr_str

    return "s" + hashlib.sha256(expr_str(d).encode()).hexdigest()[:6]


# ---- the search space ----


def shared_rows(problem: AttentionProblem, cfg: AttnConfig) -> int:
    """Rows of head-dim elements the block keeps in shared memory (see _layout)."""
    return _layout(cfg)[2]


def _layout(cfg: AttnConfig) -> tuple[int, int, int]:
    """(first row of Q, first row of the stage buffers, total rows) of the shared rows: stage
    s holds K at rows 2 s BN + [0, BN) and V after it; with `q_regs`, Q shares the rows of
    the last stage when it fits there (it is in registers before that stage is first filled),
    else it comes first."""
    stage_rows = cfg.stages * 2 * cfg.bn
    if cfg.q_regs and cfg.bm <= 2 * cfg.bn:
        return (cfg.stages - 1) * 2 * cfg.bn, 0, stage_rows
    return 0, cfg.bm, cfg.bm + stage_rows


def shared_bytes(problem: AttentionProblem, cfg: AttnConfig) -> int:
    return shared_rows(problem, cfg) * (problem.head_dim + tiles.PAD) * problem.dtype.nbytes


def valid(problem: AttentionProblem, cfg: AttnConfig) -> bool:
    """Whether `cfg` is a consistent tiling within the register and shared-memory limits."""
    d = problem.head_dim
    if cfg.wm not in (16, 32) or cfg.bm % cfg.wm or not 1 <= cfg.warps <= 8:
        return False
    if cfg.bn % 16 or cfg.bn < 16 or not 2 <= cfg.stages <= 4:
        return False
    if cfg.m_tiles > 1:
        # Two tiles of Q fragments would not fit beside the accumulators: Q from shared.
        limits = MAX_BN_2M if problem.mask is None else MAX_BN_2M_MASKED
        regs_ok = not cfg.q_regs and cfg.bn <= limits.get(d, 0)
    elif cfg.q_regs and problem.mask is not None and d >= 64:
        # Q's fragments beside an additive mask's loads and conversions: 128x64 spills on
        # sm_80 (NVRTC 13, hardware f16 conversions) at head dims 64 and 128.
        regs_ok = False
    else:
        regs_ok = d // 2 + cfg.bn // 2 + (d // 4 if cfg.q_regs else 0) <= MAX_ACC_REGS
    return regs_ok and shared_bytes(problem, cfg) <= MAX_SHARED


_LEVEL1 = (
    AttnConfig(128, 64, 2, False, 32),
    AttnConfig(128, 32, 2, False, 32),
    AttnConfig(128, 64, 2, True),
    AttnConfig(64, 64, 2, True),
    AttnConfig(128, 32, 2, True),
    AttnConfig(64, 64, 3, False),
    AttnConfig(128, 32, 3, False),
    AttnConfig(64, 32, 2, False),
    AttnConfig(32, 32, 2, False),
    AttnConfig(64, 16, 2, False),
    AttnConfig(64, 16, 3, False),
)


def space(problem: AttentionProblem, level: int) -> list[AttnConfig]:
    """The configs to try: level 1 a handful, level 2 every valid combination of a grid of
    choices (level 0: the heuristic's alone)."""
    grid = itertools.product(
        (32, 64, 128), (16, 32, 48, 64, 128), (2, 3, 4), (True, False), (16, 32)
    )
    return search_space(problem, level, heuristic, valid, _LEVEL1, AttnConfig, grid)


# Level-0 preferences by head dim, first valid wins: FlashAttention-2's shapes where they fit
# (32 query rows a warp, so that each K and V fragment read from shared memory feeds two mma:
# with 16, the kernel waits for shared memory; at head dim 128, 32 keys a step for registers).
_PREFERRED = {
    64: (AttnConfig(128, 64, 2, False, 32), AttnConfig(64, 64, 2, True)),
    128: (
        AttnConfig(128, 32, 2, False, 32),
        AttnConfig(128, 64, 2, True),
        AttnConfig(64, 64, 2, True),
    ),
    256: (AttnConfig(64, 16, 2, False), AttnConfig(32, 32, 2, False)),
}


def heuristic(problem: AttentionProblem) -> AttnConfig:
    """The config used without measuring: per head dim (rounded up to 64, 128 or 256), the
    first valid preference; 64-row blocks when 128-row ones would give fewer blocks than the
    GPU has SMs (`problem.sms`)."""
    d = problem.head_dim
    key = 64 if d <= 64 else 128 if d <= 128 else 256
    prefs = [c for c in _PREFERRED[key] if valid(problem, c)]
    if not prefs:
        prefs = space(problem, 1) or [AttnConfig(32, 16, 2, False)]
    best = prefs[0]
    bh, sq = problem.batch * problem.heads, problem.seq_q
    if best.bm == 128 and isinstance(bh, int) and isinstance(sq, int):
        if bh * ceil_div(sq, 128) < problem.sms:
            smaller = [c for c in prefs if c.bm == 64]
            best = smaller[0] if smaller else best
    return best


def applies(problem: AttentionProblem) -> bool:
    """f16 or bf16 operands with a head dim the mma tiles cover (a multiple of 16, <= 256)."""
    d = problem.head_dim
    return problem.dtype in MMA_TYPES and d % 16 == 0 and 16 <= d <= 256


# ---- the kernel ----


def _grid(problem: AttentionProblem, bm: int) -> tuple[Dim, Dim, Dim]:
    """Query tiles along x (at least one block), (batch, head) pairs along y (at most
    MAX_GRID_Z: the kernel loops over the rest)."""
    tiles = ceil_div(problem.seq_q, bm)
    x = max(tiles, 1) if isinstance(tiles, int) else maximum(tiles, 1)
    bh = problem.batch * problem.heads if _static(problem.batch, problem.heads) else None
    if bh is not None:
        return x, min(max(bh, 1), MAX_GRID_Z), 1
    bh_e = dim_expr(problem.batch) * dim_expr(problem.heads)
    return x, minimum(maximum(bh_e, 1), MAX_GRID_Z), 1


def _static(*dims: Dim) -> bool:
    return all(isinstance(d, int) for d in dims)


def instantiate(problem: AttentionProblem, cfg: AttnConfig) -> Function:
    """The kernel computing `problem` with tiling `cfg` (named after the problem)."""
    if not applies(problem):
        raise ValueError(
            f"{NAME} does not compute {problem.dtype.name} with head dim {problem.head_dim}"
        )
    names = tiles.Names()
    copies = _copies(problem, cfg, names)
    steps = _Steps(
        _scores(problem, cfg, names),
        _scale_and_mask(problem, cfg, names),
        _online_softmax(problem, cfg, names),
        _add_pv(problem, cfg, names),
        _normalize(problem, cfg, names),
    )
    kernel = _kernel(problem, cfg, copies, steps)
    return finish(kernel, problem.name, f"{NAME}[{cfg}]")


@dataclass(frozen=True)
class _Copies:
    """The block's tile copies (tiles.py): `q(smem, rows, bases, m0, 0, fast, partial)` and
    `kv(...)` into the shared rows, `o(smem, base, m0, fast)` out of them."""

    q: Macro
    kv: Macro
    o: Macro


def _copies(problem: AttentionProblem, cfg: AttnConfig, names: tiles.Names) -> _Copies:
    """The copies of Q (BM rows), K and V (BN rows each, one step) and O, each row a head's
    D elements: 16-byte chunks, a thread's rows a constant apart; rows past the sequence
    guarded where a tile can cross it."""
    D, BM, BN, threads = problem.head_dim, cfg.bm, cfg.bn, cfg.threads
    q, k, v, o = problem.q, problem.k, problem.v, problem.o
    sq = problem.seq_q if needs_check(problem.seq_q, BM) else None
    sk = problem.seq_k if needs_check(problem.seq_k, BN) else None
    q_rows, kv_rows = (
        tiles.Tile(BM, D, threads, rows_apart=True),
        tiles.Tile(BN, D, threads, rows_apart=True),
    )
    return _Copies(
        tiles.async_copy(names, "q", q_rows, (_matrix(q, sq),)),
        tiles.async_copy(names, "kv", kv_rows, (_matrix(k, sk), _matrix(v, sk))),
        tiles.store_rows(names, "o", q_rows, _matrix(o, sq)),
    )


def _matrix(op: Operand, rows: Dim | None) -> tiles.Matrix:
    """One (batch, head)'s rows of `op` (its offset given at run time)."""
    _, _, row_stride, col_stride = op.strides
    return tiles.Matrix(op.ref, row_stride, rows=rows, step=col_stride)


@dataclass(frozen=True)
class _Steps:
    """A key step's stages, each a macro over the warp's registers (see the module doc)."""

    scores: Macro
    mask: Macro
    softmax: Macro
    pv: Macro
    normalize: Macro


def _scores(problem: AttentionProblem, cfg: AttnConfig, names: tiles.Names) -> Macro:
    """Macro `scores(s, smem, q_frag, q_row, k_row, lane)`: s = Q K^T for the warp's WM rows
    (shared rows q_row...) and the step's keys (shared rows k_row...), s[mt * NT + t] the
    m16 tile mt's n tile t; Q's fragments are `q_frag` ([mt * DK + kk]) when they stay in
    registers, else read into q_frag[mt] at each k step. Each K fragment feeds every m tile."""
    dt, DK, NT, Q_REGS = problem.dtype, problem.head_dim // 16, cfg.bn // 8, cfg.q_regs
    MT = cfg.m_tiles

    def scores(s, smem, q_frag, q_row, k_row, lane):
        @script
        def qk():
            kf = register_tensor(dt, (2, 4))
            for t in unroll(range(MT * NT)):
                for e in unroll(range(4)):
                    s[t, e] = 0.0
            for kk in unroll(range(DK)):
                if not Q_REGS:
                    for mt in unroll(range(MT)):
                        ldmatrix_x4(
                            q_frag[mt],
                            smem[q_row + mt * 16 + lane % 16, kk * 16 + lane // 16 * 8],
                        )
                for t in unroll(range(0, NT, 2)):
                    krow = k_row + t * 8 + lane // 16 * 8 + lane % 8
                    ldmatrix_x4(kf[0, 0], smem[krow, kk * 16 + lane // 8 % 2 * 8])
                    for mt in unroll(range(MT)):
                        qi = mt * DK + kk if Q_REGS else mt
                        st = mt * NT + t
                        mma_sync_m16n8k16(s[st], q_frag[qi], kf[0], s[st])
                        mma_sync_m16n8k16(s[st + 1], q_frag[qi], kf[1], s[st + 1])

        return qk

    return names.fragment("qk", scores)


def _scale_and_mask(problem: AttentionProblem, cfg: AttnConfig, names: tiles.Names) -> Macro:
    """Macro `mask(s, row0, first_row, n0, mk_off, tq)`: the scores scaled (log2 domain), the
    additive mask (at mk_off) added, -inf past the last key and above the causal diagonal; the
    lane's rows are row0 + 16 mt and row0 + 16 mt + 8 in m tile mt (first_row the warp's
    first), the step's keys n0...."""
    BN, NT, SQ, SK, CAUSAL = cfg.bn, cfg.bn // 8, problem.seq_q, problem.seq_k, problem.causal
    MT = cfg.m_tiles
    SCALE2 = problem.scale * LOG2E
    HAS_MASK = problem.mask is not None
    if HAS_MASK:
        M_G = problem.mask.ref
        _, _, MSQ, MSK = problem.mask.strides

    def mask(s, row0, first_row, n0, mk_off, tq):
        @script
        def scale_mask():
            edge = n0 + BN > SK
            if CAUSAL:
                edge = edge or n0 + BN - 1 > first_row
            for t in unroll(range(MT * NT)):
                for e in unroll(range(4)):
                    s[t, e] = s[t, e] * SCALE2
            if HAS_MASK:
                for t in unroll(range(MT * NT)):
                    for e in unroll(range(4)):
                        gr = row0 + t // NT * 16 + e // 2 * 8
                        gc = n0 + t % NT * 8 + tq * 2 + e % 2
                        if gr < SQ and gc < SK:
                            mv = M_G[mk_off + i64(gr) * MSQ + i64(gc) * MSK]
                            s[t, e] = s[t, e] + f32(mv) * LOG2E
            if edge:
                for t in unroll(range(MT * NT)):
                    for e in unroll(range(4)):
                        gr = row0 + t // NT * 16 + e // 2 * 8
                        gc = n0 + t % NT * 8 + tq * 2 + e % 2
                        if CAUSAL:
                            if gc >= SK or gc > gr:
                                s[t, e] = NEG_INF
                        else:
                            if gc >= SK:
                                s[t, e] = NEG_INF

        return scale_mask

    return names.fragment("mask", mask)


def _online_softmax(problem: AttentionProblem, cfg: AttnConfig, names: tiles.Names) -> Macro:
    """Macro `softmax(s, m_i, l_i, acc)`: the running max m_i and sum l_i of the lane's rows
    updated with the step's scores, which become probabilities (exp2), and O (`acc`) rescaled
    by exp2(m - m'). In m tile mt a lane holds rows g (e < 2, m_i[2 mt]) and g + 8 (e >= 2,
    m_i[2 mt + 1])."""
    NT, DT, MT = cfg.bn // 8, problem.head_dim // 8, cfg.m_tiles

    def softmax(s, m_i, l_i, acc):
        @script
        def online_softmax():
            for r in unroll(range(2 * MT)):
                hr = r % 2
                mx = m_i[r]
                for t in unroll(range(r // 2 * NT, r // 2 * NT + NT)):
                    mx = max(mx, s[t, hr * 2], s[t, hr * 2 + 1])
                mx = max(mx, shfl_xor_sync(mx, 1))
                mx = max(mx, shfl_xor_sync(mx, 2))
                base = 0.0 if mx == NEG_INF else mx
                alpha = exp2(m_i[r] - base)
                m_i[r] = mx
                total = 0.0
                for t in unroll(range(r // 2 * NT, r // 2 * NT + NT)):
                    for c2 in unroll(range(2)):
                        p = exp2(s[t, hr * 2 + c2] - base)
                        s[t, hr * 2 + c2] = p
                        total += p
                l_i[r] = l_i[r] * alpha + total
                for d in unroll(range(r // 2 * DT, r // 2 * DT + DT)):
                    acc[d, hr * 2] *= alpha
                    acc[d, hr * 2 + 1] *= alpha

        return online_softmax

    return names.fragment("sm", softmax)


def _add_pv(problem: AttentionProblem, cfg: AttnConfig, names: tiles.Names) -> Macro:
    """Macro `pv(s, smem, acc, v_row, lane)`: acc += P V, P converted to f16/bf16 in registers
    (the accumulator layout of S is the A-operand layout of P), V (shared rows v_row...) by
    ldmatrix.trans, each V fragment feeding every m tile (acc[mt * DT + d])."""
    dt, PK, DT, NT = problem.dtype, cfg.bn // 16, problem.head_dim // 8, cfg.bn // 8
    MT = cfg.m_tiles
    CAST = _SCRIPT_TYPES[dt]

    def pv(s, smem, acc, v_row, lane):
        @script
        def add_pv():
            pa = register_tensor(dt, (MT, 8))
            vf = register_tensor(dt, (2, 4))
            for pk in unroll(range(PK)):
                for mt in unroll(range(MT)):
                    for e in unroll(range(8)):
                        pa[mt, e] = CAST(s[mt * NT + pk * 2 + e // 4, e % 4])
                for d in unroll(range(0, DT, 2)):
                    vrow = v_row + pk * 16 + lane % 16
                    ldmatrix_x4_trans(vf[0, 0], smem[vrow, d * 8 + lane // 16 * 8])
                    for mt in unroll(range(MT)):
                        a = mt * DT + d
                        mma_sync_m16n8k16(acc[a], pa[mt], vf[0], acc[a])
                        mma_sync_m16n8k16(acc[a + 1], pa[mt], vf[1], acc[a + 1])

        return add_pv

    return names.fragment("pv", pv)


def _normalize(problem: AttentionProblem, cfg: AttnConfig, names: tiles.Names) -> Macro:
    """Macro `normalize(acc, m_i, l_i, smem, row, m0, lse_off, tq)`: O / l of the lane's rows
    (block rows row + 16 mt and row + 16 mt + 8) into the shared rows, and their logsumexp
    ((m + log2 l) ln 2) when the problem asks for it."""
    SQ, DT, MT = problem.seq_q, problem.head_dim // 8, cfg.m_tiles
    CAST = _SCRIPT_TYPES[problem.dtype]
    HAS_LSE = problem.lse is not None
    if HAS_LSE:
        L_G = problem.lse.ref
        _, _, LSQ, _ = problem.lse.strides

    def normalize(acc, m_i, l_i, smem, row, m0, lse_off, tq):
        @script
        def divide():
            for r in unroll(range(2 * MT)):
                hr = r % 2
                lt = l_i[r]
                lt += shfl_xor_sync(lt, 1)
                lt += shfl_xor_sync(lt, 2)
                inv = 1.0 / lt if lt > 0.0 else 0.0
                lr = row + r * 8
                for d in unroll(range(DT)):
                    for c2 in unroll(range(2)):
                        a = r // 2 * DT + d
                        smem[lr, d * 8 + tq * 2 + c2] = CAST(acc[a, hr * 2 + c2] * inv)
                if HAS_LSE:
                    if tq == 0 and m0 + lr < SQ:
                        # A row every key masks: 0, as PyTorch's kernels give (its backward
                        # then finds every probability exp(-inf - 0) = 0).
                        lse = (m_i[r] + log2(lt)) * LN2 if lt > 0.0 else 0.0
                        L_G[lse_off + i64(m0 + lr) * LSQ] = lse

        return divide

    return names.fragment("out", normalize)


def _kernel(problem: AttentionProblem, cfg: AttnConfig, copies: _Copies, steps: _Steps):
    """The script kernel: per (batch, head), Q's tile, then the key steps' pipeline of K/V
    copies and the warps' stages, then O (see the module doc)."""
    dt = problem.dtype
    D, BM, BN, STAGES = problem.head_dim, cfg.bm, cfg.bn, cfg.stages
    THREADS = cfg.threads
    Q_REGS = cfg.q_regs
    WM, MT = cfg.wm, cfg.m_tiles
    Q_ROW, KV_ROW, ROWS = _layout(cfg)
    Q_LAST = Q_ROW > 0  # Q shares the last stage's rows
    DK = D // 16  # k steps of Q K^T
    DT = D // 8  # n tiles of O
    NT = BN // 8  # n tiles of S
    B, H, SQ, SK = problem.batch, problem.heads, problem.seq_q, problem.seq_k
    GQ = (
        H // problem.kv_heads
        if _static(H, problem.kv_heads)
        else (dim_expr(H) // dim_expr(problem.kv_heads))
    )
    BH = prod((B, H))
    TILES_M = ceil_div(SQ, BM)
    GRID = _grid(problem, BM)
    CAUSAL = problem.causal
    q, k, v, o = problem.q, problem.k, problem.v, problem.o
    Q_G, K_G, V_G, O_G = q.ref, k.ref, v.ref, o.ref
    QSB, QSH, QSS, QSD = q.strides
    KSB, KSH, KSS, KSD = k.strides
    VSB, VSH, VSS, VSD = v.strides
    OSB, OSH, OSS, OSD = o.strides
    Q_VEC, O_VEC = q.vector_ok(), o.vector_ok()
    KV_VEC = k.vector_ok() and v.vector_ok()
    HAS_MASK = problem.mask is not None
    MSB, MSH = problem.mask.strides[:2] if HAS_MASK else (0, 0)
    LSB, LSH = problem.lse.strides[:2] if problem.lse is not None else (0, 0)
    copy_q, copy_kv, store_o = copies.q, copies.kv, copies.o
    scores, mask, softmax, pv, normalize = (
        steps.scores,
        steps.mask,
        steps.softmax,
        steps.pv,
        steps.normalize,
    )

    @script(params=problem.params)
    def attention():
        attrs.grid_dim = GRID
        attrs.block_dim = THREADS
        tid = threadIdx.x
        lane = tid % 32
        wr = tid // 32 * WM  # the warp's first row in the block
        g = lane // 4
        tq = lane % 4
        smem = dynamic_shared_tensor(dt, (ROWS, D + tiles.PAD))
        q_frag = register_tensor(dt, (MT * DK if Q_REGS else MT, 8))
        s = register_tensor(f32, (MT * NT, 4))
        acc = register_tensor(f32, (MT * DT, 4))
        m_i = register_tensor(f32, 2 * MT)
        l_i = register_tensor(f32, 2 * MT)
        # Row and key coordinates are i32, element offsets i64.
        if CAUSAL:
            m0 = i32(TILES_M - 1 - blockIdx.x) * BM  # the longest rows first
        else:
            m0 = blockIdx.x * BM
        bh = i64(blockIdx.y)
        while bh < BH:
            b = bh // H
            h = bh % H
            hk = h // GQ
            q_off = b * QSB + h * QSH
            k_off = b * KSB + hk * KSH
            v_off = b * VSB + hk * VSH
            o_off = b * OSB + h * OSH
            if HAS_MASK:
                mk_off = b * MSB + h * MSH
            else:
                mk_off = 0
            if CAUSAL:
                n_end = max(min(SK, m0 + BM), 0)
            else:
                n_end = SK
            steps = i32((n_end + (BN - 1)) // BN)
            q_fast = Q_VEC and QSD == 1 and QSS % 8 == 0 and is_aligned(Q_G[q_off], 16)
            kv_fast = KV_VEC and KSD == 1 and VSD == 1 and KSS % 8 == 0 and VSS % 8 == 0
            kv_fast = kv_fast and is_aligned(K_G[k_off], 16) and is_aligned(V_G[v_off], 16)
            # Q: one commit group ahead of the K/V steps.
            copy_q(smem, (Q_ROW,), (q_off,), m0, 0, q_fast, True)
            cp_async_commit()
            for d in unroll(range(MT * DT)):
                for e in unroll(range(4)):
                    acc[d, e] = 0.0
            for e in unroll(range(2 * MT)):
                m_i[e] = NEG_INF
                l_i[e] = 0.0
            # Iteration `it` issues step `it` into buffer it % STAGES (which step it - STAGES,
            # computed one iteration earlier, used) and computes step it - (STAGES - 1).
            for it in range(steps + STAGES - 1):
                cp_async_wait(STAGES - 2)
                syncthreads()
                if Q_REGS and it == STAGES - 1:
                    for qi in unroll(range(MT * DK)):
                        qr = Q_ROW + wr + qi // DK * 16 + lane % 16
                        ldmatrix_x4(q_frag[qi], smem[qr, qi % DK * 16 + lane // 16 * 8])
                    if Q_LAST:
                        syncthreads()  # Q's rows become the last stage's buffer
                if it < steps:
                    kr = KV_ROW + it % STAGES * 2 * BN
                    n0 = it * BN
                    # Only the last tile can cross the last key.
                    copy_kv(smem, (kr, kr + BN), (k_off, v_off), n0, 0, kv_fast, n0 + BN > SK)
                if it >= STAGES - 1:
                    kr = KV_ROW + (it + 1) % STAGES * 2 * BN
                    n0 = (it - (STAGES - 1)) * BN
                    scores(s, smem, q_frag, Q_ROW + wr, kr, lane)
                    mask(s, m0 + wr + g, m0 + wr, n0, mk_off, tq)
                    softmax(s, m_i, l_i, acc)
                    pv(s, smem, acc, kr + BN, lane)
                cp_async_commit()
            cp_async_wait_all()
            syncthreads()
            # O / l through shared memory (the block's first BM rows), then 16-byte stores.
            normalize(acc, m_i, l_i, smem, wr + g, m0, b * LSB + h * LSH, tq)
            syncthreads()
            o_fast = O_VEC and OSD == 1 and OSS % 8 == 0 and is_aligned(O_G[o_off], 16)
            store_o(smem, o_off, m0, o_fast)
            syncthreads()
            bh += gridDim.y

    return attention.ir


TEMPLATE = Template(NAME, space, heuristic, instantiate, applies)
