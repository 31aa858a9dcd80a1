"""A Hopper (sm_90a) attention forward: softmax(Q K^T * scale) V with f16 or bf16 operands, TMA
loads and warpgroup MMA for both products, f32 accumulation (FlashAttention-3's structure).

A block owns BM = 64C query rows of one (batch, head) and is C consumer warpgroups (threads 0
to 128C - 1, warpgroup wg the rows 64wg to 64wg + 63) and one producer warp after them. The
producer's first thread loads Q's tile once by TMA, then walks the keys in steps of BN,
loading each step's K and V tiles into a ring of STAGES stages (full and empty mbarriers, as
matmul_hopper's ring). Every tile lands in 64-column boxes (128 bytes a row, 128-byte
swizzle): Q [D / 64, BM, 64], a stage's K and V [D / 64, BN, 64] each. A consumer warpgroup
then computes, for its 64 rows and the step's keys:

    S = Q K^T                D / 16 mma_async m64nBNk16, Q and K both K-major (over D)
    S = S * scale * log2(e), -inf past the last key and above the causal diagonal
    m' = max(m, rowmax(S));  P = exp2(S - m');  l = l * exp2(m - m') + rowsum(P)
    O = O * exp2(m - m') + P V   BN / 16 mma_async m64nDk16, P from registers (S's
                                 accumulator converted to f16/bf16 pairs is the register A
                                 layout), V read MN-major as it lies ([keys, D])

then frees the stage. A thread holds two rows of S (16w + l / 4 and 8 more, warp w, lane l),
reduced across the four lanes of a row with shuffles, as attention.py does. At the end each
warpgroup writes O / l into its rows of Q's tile (swizzled as TMA reads them), and one thread
stores the tile's 64-row, 64-column boxes by TMA (rows past the last query are not written);
the logsumexp ((m + log2 l) ln 2) goes straight to memory when asked for.

Overlap: with `overlap`, a consumer issues the next step's S = Q K^T (into a second S
accumulator, copied over after the step) before it computes the softmax of this step's S, so
the tensor cores multiply while the softmax's exp2 and shuffles run (FlashAttention-3's
intra-warpgroup pipelining); the stage of a step is freed after its P V retires. ptxas
serializes the mma's (C7518/C7519) when anything between them branches or writes the P
registers after the fence: the loop has no guards (the last step issues its own S again,
discarded), the masking is selects on every step, and the register-A mma fences itself
(wgmma.h).

Causal masking (top-left aligned, like PyTorch: query i sees keys j <= i) stops the key walk
at the block's last row and masks only the steps that cross the diagonal; blocks take the
longest rows first. K and V may have fewer heads than Q (grouped-query attention). TMA fills
the rows past Q's, K's and V's ends with zeros, so partial tiles need only the mask.

What it takes (`refusal` says why not): sm_90a, static sizes and strides, f16/bf16, head dim
64 or 128, unit stride along the head dim and the other strides multiples of 16 bytes (TMA),
no additive mask, at most 65535 (batch, head) pairs (the grid's y).
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.backends.cuda.arch import WGMMA_ARCH
from minicomp.ir import types as T
from minicomp.ir.func import Function
from minicomp.schedule.templates import tiles
from minicomp.schedule.templates.base import Template, finish
from minicomp.schedule.templates.problem import MAX_GRID_Z, ceil_div
from minicomp.script.function import script
from minicomp.script.hopper import (
    fence_proxy_async,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait,
)
from minicomp.script.lang import (
    Macro,
    attrs,
    blockIdx,
    dynamic_shared_tensor,
    exp2,
    log2,
    register_tensor,
    shared_tensor,
    shfl_xor_sync,
    syncthreads,
    threadIdx,
    unroll,
)
from minicomp.script.tma import bulk_commit_group, bulk_wait_group, tma_load, tma_store
from minicomp.script.types import ScalarType, f32, i32, i64, tensor_map, u64
from minicomp.script.wgmma import (
    wgmma_commit_group,
    wgmma_fence,
    wgmma_mma_async,
    wgmma_wait_group,
)

NAME = "attention_hopper"
WARPGROUP = 128
BOX = 64  # head-dim columns a TMA box: one 128-byte swizzle span of 16-bit elements
SWIZZLE = 128
MAX_SHARED = 227 * 1024  # an H100's opt-in dynamic shared memory a block
BARRIER_BYTES = 1024
HEAD_DIMS = (64, 128)
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = float("-inf")


@dataclass(frozen=True)
class HopperAttnConfig:
    """`consumers` warpgroups of 64 query rows (BM = 64 * consumers), BN = `bn` keys a step,
    `stages` K/V stages, and whether a step's Q K^T overlaps the softmax before it."""

    consumers: int = 1
    bn: int = 64
    stages: int = 2
    overlap: bool = False

    @property
    def bm(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return WARPGROUP * self.consumers + 32

    def shared_bytes(self, head_dim: int) -> int:
        return (self.bm + 2 * self.stages * self.bn) * head_dim * 2

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}_s{self.stages}{'_ov' if self.overlap else ''}"

    def check(self, head_dim: int) -> None:
        if self.consumers not in (1, 2) or self.bn not in (64, 128) or self.stages < 2:
            raise ValueError(
                f"{NAME}: no config {self} (1 or 2 consumer warpgroups, 64 or 128 keys a "
                "step, 2 stages or more)"
            )
        if self.shared_bytes(head_dim) + BARRIER_BYTES > MAX_SHARED:
            raise ValueError(f"{NAME}[{self}]: head dim {head_dim} does not fit shared memory")


# Registers a consumer thread holds: S (BN / 2 f32, twice when overlapping), P (BN / 2 16-bit)
# and O (D / 2 f32); with two consumer warpgroups (288 threads, one block an SM) ptxas gives a
# thread at most 168. NVRTC 13 for sm_90a, measured: head dim 128 spills with 128 keys a step
# there, and overlapped with two warpgroups; at 64, overlapped with 128 keys and two.
CONFIGS = (
    HopperAttnConfig(2, 128, 2),
    HopperAttnConfig(2, 64, 3),
    HopperAttnConfig(1, 128, 2),
    HopperAttnConfig(1, 64, 2),
    HopperAttnConfig(2, 64, 2, overlap=True),
    HopperAttnConfig(1, 128, 2, overlap=True),
    HopperAttnConfig(1, 64, 2, overlap=True),
)


def valid(problem, cfg: HopperAttnConfig) -> bool:
    """Whether `cfg` fits the problem's head dim in shared memory and registers (see
    CONFIGS)."""
    d = problem.head_dim
    try:
        cfg.check(d)
    except ValueError:
        return False
    if d == 128 and cfg.bn == 128:
        return False
    if cfg.overlap and cfg.consumers == 2:
        return d == 64 and cfg.bn == 64
    return True


def heuristic(problem) -> HopperAttnConfig:
    """Two consumer warpgroups (128 query rows), 128 keys a step at head dim 64 and 64 (with a
    third stage) at 128; one warpgroup when 128-row blocks would not fill the GPU's SMs. Not
    overlapped: the lens cannot tell what overlapping gains (the tuner measures it on a GPU),
    and without it the tiles are larger."""
    d = problem.head_dim
    cfg = HopperAttnConfig(2, 128, 2) if d == 64 else HopperAttnConfig(2, 64, 3)
    bh, sq = problem.batch * problem.heads, problem.seq_q
    if bh * ceil_div(sq, 128) < problem.sms:
        cfg = HopperAttnConfig(1, cfg.bn, 2)
    return cfg


def space(problem, level: int) -> list[HopperAttnConfig]:
    """The heuristic's config at level 0; the valid configs of CONFIGS above."""
    if level <= 0:
        return [heuristic(problem)]
    return list(dict.fromkeys((heuristic(problem), *(c for c in CONFIGS if valid(problem, c)))))


def refusal(problem) -> str | None:
    """Why the template does not compute AttentionProblem `problem`, in a few words for
    explain; None when it does (see the module doc)."""
    if problem.mask is not None:
        return "an additive mask (it takes causal masking or none)"
    qkvo = ("q", "k", "v", "o")
    return shape_refusal(problem) or stride_refusal(problem, qkvo, qkvo)


def shape_refusal(problem) -> str | None:
    """Why the Hopper attention templates (this forward, attention_hopper_bwd's backward) do not
    take `problem`'s architecture, operand type, head dim or sizes; None when they do."""
    if problem.arch != WGMMA_ARCH:
        return f"wgmma needs {WGMMA_ARCH}, not {problem.arch}"
    if problem.dtype not in (T.f16, T.bf16):
        return f"{problem.dtype.short} operands"
    if problem.head_dim not in HEAD_DIMS:
        return f"head dim {problem.head_dim} (it takes {' or '.join(map(str, HEAD_DIMS))})"
    sizes = (problem.batch, problem.heads, problem.kv_heads, problem.seq_q, problem.seq_k)
    if not all(isinstance(s, int) for s in sizes):
        return "symbolic sizes"
    if min(sizes) == 0:
        return "an empty attention"
    if problem.batch * problem.heads > MAX_GRID_Z:
        return f"{problem.batch * problem.heads} (batch, head) pairs (at most {MAX_GRID_Z})"
    return None


def stride_refusal(problem, roles, tma_roles) -> str | None:
    """Why operands `roles` of `problem` cannot be read as the Hopper attention templates read
    them: symbolic strides; for those TMA moves (`tma_roles`), a head-dim stride other than 1
    or others not multiples of 16 bytes. None when they can."""
    for role in roles:
        if not all(isinstance(s, int) for s in getattr(problem, role).strides):
            return f"{role.upper()}'s strides are symbolic"
    for role in tma_roles:
        strides = getattr(problem, role).strides
        if strides[3] != 1:
            return f"{role.upper()} has head-dim stride {strides[3]} (TMA needs 1)"
        if any(s % 8 for s in strides[:3]):
            return f"{role.upper()}'s strides {strides} are not multiples of 16 bytes (TMA)"
    return None


def applies(problem) -> bool:
    """Whether the template computes `problem` (see refusal)."""
    return refusal(problem) is None


def map_view(problem, role: str, heads: int, seq: int) -> tuple:
    """(map parameter, buffer, base, shape, strides) of the 4-D map over operand `role`
    (batch, head, row, head dim): a dimension of size 1 gets a stride TMA takes whatever the
    tensor's (it is never stepped)."""
    op = getattr(problem, role)
    shape = (problem.batch, heads, seq, problem.head_dim)
    strides = tuple(s if n > 1 else BOX for s, n in zip(op.strides, shape))
    return (f"tma_{role}", op.ref.var.name, 0, shape, strides)


def instantiate(problem, cfg: HopperAttnConfig) -> Function:
    """The kernel computing `problem` (which `applies`) with `cfg`: its tensor maps of Q, K,
    V and O first (attrs.tensor_maps: the plan encodes them), then the problem's buffers and
    sizes."""
    refused = refusal(problem)
    if refused is not None:
        raise ValueError(f"{NAME} does not compute this attention: {refused}")
    cfg.check(problem.head_dim)
    names = tiles.Names()
    softmax, epilogue = _softmax(problem, cfg, names), _epilogue(problem, names)
    kernel = _kernel(problem, cfg, softmax, epilogue)
    maps = (
        map_view(problem, "q", problem.heads, problem.seq_q),
        map_view(problem, "k", problem.kv_heads, problem.seq_k),
        map_view(problem, "v", problem.kv_heads, problem.seq_k),
        map_view(problem, "o", problem.heads, problem.seq_q),
    )
    return finish(kernel, problem.name, f"{NAME}[{cfg}]", min_blocks=1, tensor_maps=maps)


def _softmax(problem, cfg: HopperAttnConfig, names: tiles.Names) -> Macro:
    """Macro `softmax(s, p, m_i, l_i, o, row0, n0, first_row, tq)`: the step's scores `s`
    scaled (log2 domain), -inf past the last key and above the causal diagonal (row0 and
    row0 + 8 the thread's rows, first_row its warpgroup's first, n0 the step's first key); the
    running max and sum updated, the probabilities into `p` (16-bit) and O rescaled. Element i
    of S or O is row half i // 2 % 2, column 8 (i // 4) + 2 tq + i % 2."""
    BN, D, SK, CAUSAL = cfg.bn, problem.head_dim, problem.seq_k, problem.causal
    OVERLAP = cfg.overlap
    SCALE2 = problem.scale * LOG2E
    CAST = ScalarType(problem.dtype)

    def softmax(s, p, m_i, l_i, o, row0, n0, first_row, tq):
        @script
        def online_softmax():
            if OVERLAP:
                # Every step: a branch around the selects, while the next S is in flight,
                # has ptxas serialize the mma's (C7518).
                edge = True
            else:
                edge = n0 + BN > SK
                if CAUSAL:
                    edge = edge or n0 + BN - 1 > first_row
            for i in unroll(range(BN // 2)):
                s[i] = s[i] * SCALE2
            if edge:
                # Selects, not branches: a divergent branch writing S's registers while the
                # next S is in flight makes ptxas serialize the mma's (C7518).
                for i in unroll(range(BN // 2)):
                    col = n0 + 8 * (i // 4) + 2 * tq + i % 2
                    if CAUSAL:
                        out = col >= SK or col > row0 + 8 * (i // 2 % 2)
                    else:
                        out = col >= SK
                    s[i] = NEG_INF if out else s[i]
            for r in unroll(range(2)):
                mx = m_i[r]
                for j in unroll(range(BN // 8)):
                    mx = max(mx, s[4 * j + 2 * r], s[4 * j + 2 * r + 1])
                mx = max(mx, shfl_xor_sync(mx, 1))
                mx = max(mx, shfl_xor_sync(mx, 2))
                base = 0.0 if mx == NEG_INF else mx
                alpha = exp2(m_i[r] - base)
                m_i[r] = mx
                total = 0.0
                for j in unroll(range(BN // 8)):
                    for c in unroll(range(2)):
                        e = exp2(s[4 * j + 2 * r + c] - base)
                        p[4 * j + 2 * r + c] = CAST(e)
                        total += e
                l_i[r] = l_i[r] * alpha + total
                for j in unroll(range(D // 8)):
                    o[4 * j + 2 * r] *= alpha
                    o[4 * j + 2 * r + 1] *= alpha

        return online_softmax

    return names.fragment("sm", softmax)


def _epilogue(problem, names: tiles.Names) -> Macro:
    """Macro `epilogue(o, m_i, l_i, o_s, lr, row0, lse_off, tq)`: O / l of the thread's rows
    into shared `o_s` [D / 64, rows, 64] at rows lr and lr + 8, each 64-column box swizzled
    as TMA stores it (chunk c of row r at chunk c ^ r % 8); the logsumexp of rows row0 and
    row0 + 8 (those before the last query) when asked for."""
    SQ, D = problem.seq_q, problem.head_dim
    CAST = ScalarType(problem.dtype)
    HAS_LSE = problem.lse is not None
    L_G = problem.lse.ref if HAS_LSE else None
    LSS = problem.lse.strides[2] if HAS_LSE else 0

    def epilogue(o, m_i, l_i, o_s, lr, row0, lse_off, tq):
        @script
        def store_o():
            for r in unroll(range(2)):
                lt = l_i[r]
                lt += shfl_xor_sync(lt, 1)
                lt += shfl_xor_sync(lt, 2)
                inv = 1.0 / lt if lt > 0.0 else 0.0
                sr = lr + 8 * r
                for j in unroll(range(D // 8)):
                    for c in unroll(range(2)):
                        chunk = j % 8 ^ sr % 8
                        o_s[j // 8, sr, chunk * 8 + 2 * tq + c] = CAST(o[4 * j + 2 * r + c] * inv)
                row = row0 + 8 * r
                if HAS_LSE:
                    if row < SQ:
                        if tq == 0:
                            # A row every key masks: 0, as PyTorch's kernels give.
                            lse = (m_i[r] + log2(lt)) * LN2 if lt > 0.0 else 0.0
                            L_G[lse_off + i64(row) * LSS] = lse

        return store_o

    return names.fragment("out", epilogue)


def _kernel(problem, cfg: HopperAttnConfig, softmax: Macro, epilogue: Macro):
    """The script kernel (see the module doc)."""
    dt = ScalarType(problem.dtype)
    B, H, HK, SQ, SK, D = (
        problem.batch,
        problem.heads,
        problem.kv_heads,
        problem.seq_q,
        problem.seq_k,
        problem.head_dim,
    )
    BM, BN, STAGES, OVERLAP = cfg.bm, cfg.bn, cfg.stages, cfg.overlap
    CONSUMERS = WARPGROUP * cfg.consumers
    DB = D // BOX  # 64-column boxes a row
    K_AT = BM * D * 2  # byte offsets: multiples of 1024
    V_AT = K_AT + STAGES * BN * D * 2
    STAGE_BYTES = 2 * BN * D * 2
    CAUSAL = problem.causal
    LSB, LSH = problem.lse.strides[:2] if problem.lse is not None else (0, 0)
    SA = 2 if OVERLAP else 1  # S accumulators: the step's and, overlapping, the next's
    LAG = 1 if OVERLAP else 0  # how many steps ahead a step's S is issued

    # The annotations name only what the body uses (the closure holds no other names).
    @script(params=problem.params)
    def attention_hopper(
        tma_q: tensor_map(dt[B, H, SQ, D], box=(1, 1, BM, BOX), swizzle=SWIZZLE),
        tma_k: tensor_map(dt[B, HK, SK, D], box=(1, 1, BN, BOX), swizzle=SWIZZLE),
        tma_v: tensor_map(dt[B, HK, SK, D], box=(1, 1, BN, BOX), swizzle=SWIZZLE),
        tma_o: tensor_map(dt[B, H, SQ, D], box=(1, 1, 64, BOX), swizzle=SWIZZLE),
    ):
        tiles_m = (SQ + BM - 1) // BM
        attrs.grid_dim = ((SQ + BM - 1) // BM, B * H)
        attrs.block_dim = CONSUMERS + 32
        t = threadIdx.x
        q_s = dynamic_shared_tensor(dt, (DB, BM, BOX), at=0)
        k_s = dynamic_shared_tensor(dt, (STAGES, DB, BN, BOX), at=K_AT)
        v_s = dynamic_shared_tensor(dt, (STAGES, DB, BN, BOX), at=V_AT)
        q_full = shared_tensor(u64, (1,))
        full = shared_tensor(u64, (STAGES,))
        empty = shared_tensor(u64, (STAGES,))
        if t == 0:
            mbarrier_init(q_full[0], 1)
            for s in range(STAGES):
                mbarrier_init(full[s], 1)
                mbarrier_init(empty[s], CONSUMERS)
        syncthreads()
        b = blockIdx.y // H
        h = blockIdx.y % H
        hk = h // (H // HK)
        if CAUSAL:
            m0 = i32(tiles_m - 1 - blockIdx.x) * BM  # the longest rows first
            n_end = min(SK, m0 + BM)
        else:
            m0 = blockIdx.x * BM
            n_end = SK
        steps = (n_end + BN - 1) // BN
        if t == CONSUMERS:  # the producer: one thread issues every copy
            mbarrier_arrive_expect_tx(q_full[0], BM * D * 2)
            for j in unroll(range(DB)):
                tma_load(q_s[j], tma_q, b, h, m0, BOX * j, q_full[0])
            for it in range(steps):
                s = it % STAGES
                mbarrier_wait(empty[s], it // STAGES % 2 ^ 1)
                mbarrier_arrive_expect_tx(full[s], STAGE_BYTES)
                for j in unroll(range(DB)):
                    tma_load(k_s[s, j], tma_k, b, hk, it * BN, BOX * j, full[s])
                    tma_load(v_s[s, j], tma_v, b, hk, it * BN, BOX * j, full[s])
        elif t < CONSUMERS:
            wg = t // WARPGROUP
            lane = t % 32
            tq = lane % 4
            first_row = m0 + 64 * wg
            row0 = first_row + t % WARPGROUP // 32 * 16 + lane // 4
            s_acc = register_tensor(f32, (SA, BN // 2))
            p = register_tensor(dt, (BN // 2,))
            o = register_tensor(f32, (D // 2,))
            m_i = register_tensor(f32, (2,))
            l_i = register_tensor(f32, (2,))
            for i in unroll(range(D // 2)):
                o[i] = 0.0
            for r in unroll(range(2)):
                m_i[r] = NEG_INF
                l_i[r] = 0.0
            mbarrier_wait(q_full[0], 0)
            # Every guard around an mma_async that computes on wgmma results (the softmax,
            # P V) makes ptxas serialize the mma's (C7519): the loop has none. A block has a
            # step at least (at least one key, and a causal block's first row sees key 0).
            # (The S issues are written out here, not a fragment: a fragment's parser does not
            # know q_s and k_s as the aligned dynamic tensors the swizzle needs.)
            if OVERLAP:
                mbarrier_wait(full[0], 0)
                wgmma_fence()
                for kk in unroll(range(D // 16)):
                    wgmma_mma_async(
                        s_acc[0],
                        q_s[kk // 4, 64 * wg, 16 * (kk % 4)],
                        k_s[0, kk // 4, 0, 16 * (kk % 4)],
                        swizzle=SWIZZLE,
                        scale_d=kk > 0,
                    )
                wgmma_commit_group()
            for it in range(steps):
                s = it % STAGES
                # Overlapping: step it + 1's S into s_acc[1], in flight through this step's
                # softmax; at the last step the last S again (no guard: see above), discarded.
                # Else this step's S into s_acc[0].
                nx = min(it + LAG, steps - 1)
                sn = nx % STAGES
                mbarrier_wait(full[sn], nx // STAGES % 2)
                wgmma_fence()
                for kk in unroll(range(D // 16)):
                    wgmma_mma_async(
                        s_acc[LAG],
                        q_s[kk // 4, 64 * wg, 16 * (kk % 4)],
                        k_s[sn, kk // 4, 0, 16 * (kk % 4)],
                        swizzle=SWIZZLE,
                        scale_d=kk > 0,
                    )
                wgmma_commit_group()
                wgmma_wait_group(LAG, s_acc[0])
                softmax(s_acc[0], p, m_i, l_i, o, row0, it * BN, first_row, tq)
                wgmma_fence()
                for kk in unroll(range(BN // 16)):
                    wgmma_mma_async(
                        o, p[8 * kk], v_s[s, 0, 16 * kk, 0], swizzle=SWIZZLE, trans_b=True
                    )
                wgmma_commit_group()
                wgmma_wait_group(0, o)
                mbarrier_arrive(empty[s])
                if OVERLAP:
                    for i in unroll(range(BN // 2)):
                        s_acc[0, i] = s_acc[1, i]
            # O into Q's rows of this warpgroup, which no mma reads any more.
            lr = row0 - m0
            epilogue(o, m_i, l_i, q_s, lr, row0, i64(b) * LSB + i64(h) * LSH, tq)
            fence_proxy_async()  # the stores, before the TMA store reads them
        syncthreads()
        if t == 0:  # O's boxes by TMA: rows past the last query are not written
            for wgi in unroll(range(CONSUMERS // WARPGROUP)):
                for j in unroll(range(DB)):
                    tma_store(tma_o, b, h, m0 + 64 * wgi, BOX * j, q_s[j, 64 * wgi, 0])
            bulk_commit_group()
            bulk_wait_group(0)

    return attention_hopper.ir


TEMPLATE = Template(NAME, space, heuristic, instantiate, applies)
