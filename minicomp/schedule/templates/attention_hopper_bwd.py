"""A Hopper (sm_90a) attention backward: dQ, dK and dV of softmax(Q K^T * scale) V from dO, O
and the forward's logsumexp, with TMA loads and warpgroup MMA (FlashAttention-2/3's structure).

Three kernels, launched in order:

- `pre`: per query row, D = rowsum(dO * O) (f32) and the logsumexp in the log2 domain, both
  into workspace rows padded to a multiple of ROW_PAD queries (padding rows: D = 0 and
  logsumexp +inf, so their probabilities are 0), and the row of the f32 dQ accumulator zeroed.
- `main`: a block owns BN = 64C keys of one (batch, key head): C consumer warpgroups (64 keys
  each) and a producer warp. The producer loads the block's K and V tiles once (TMA), then
  walks the query blocks (BM rows a step) of every query head of the key head's group,
  loading each step's Q and dO tiles (TMA) and its logsumexp and D rows (bulk copies) into a
  ring of STAGES stages. A consumer warpgroup computes, for its 64 keys and the step's rows:

      S^T = K Q^T                 D / 16 mma_async m64nBMk16, K and Q K-major (over D)
      P^T = exp2(S^T * scale * log2(e) - lse2)   0 above the causal diagonal (selects); kept
                                  16-bit only, so that dP^T takes S^T's registers
      dP^T = V dO^T               issued with dV's, after P^T
      dV += P^T dO                P^T from registers (the accumulator's layout), dO MN-major
      dS^T = P^T * (dP^T - D)
      dK += dS^T Q                dS^T from registers, Q MN-major
      dQ^T += K^T dS^T            K^T MN-major from K's tile, dS (= dS^T stored row by query,
                                  K-major over the keys) through shared memory; each 64 rows
                                  of head dim a chunk, added to the f32 accumulator by atomics

  dS^T's shared buffer is double-buffered, written by the warpgroup's 128 threads and read by
  its mma once an mbarrier of 128 arrivals says every thread wrote (there is no warpgroup
  barrier in the language; a buffer is rewritten two steps later, after every thread passed
  the barrier of the step between, so after its last read). At the end dK * scale and dV go
  through the rows of K's and V's tiles (swizzled) to TMA stores (rows past the last key are
  not written).
- `post`: dQ = dQacc * scale in the input type, written with dQ's strides (it takes dK too,
  unread: a graph's launches then keep it after main, which writes dK).

Grouped-query heads: a block loops over the group's query heads itself, summing dK and dV of
the whole group in registers: no atomics on dK and dV, deterministic, and K and V are read once
(the alternative, a block per query head adding into f32 dK/dV buffers, would need two more
accumulators and a conversion kernel). dQ is added by atomics (red.global.add.f32 on a GPU):
the blocks of every key block add into a query row, as in FlashAttention-2 (so dQ's bits may
differ from run to run, by the order of the additions; dK and dV's do not). At H100 sizes
those atomics bound the kernel by L2 (benchmarks/results/lens-h100-2026-12-08-hopper-attention-
bwd.txt): S / BN partials of every dQ element.

Causal masking (top-left aligned, as PyTorch: query i sees keys j <= i): a block skips the
query blocks that end before its first key and masks the products by selects every step (a
branch between the mma's would have ptxas serialize them). Rows past the last query or key
need no mask: TMA fills Q, dO, K and V there with zeros and the padded logsumexp is +inf.

The scores are scaled in the log2 domain as the forward does; dS needs no scale until the end:
dQ = scale dS K and dK = scale dS^T Q (dS the gradient of the scaled scores).

What it takes (`refusal` says why not): what attention_hopper takes (sm_90a, static sizes,
f16/bf16, head dim 64 or 128, TMA strides), for Q, K, V, dO, dK and dV; the logsumexp the
forward wrote (f32); at most 65535 (batch, head) pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir import types as T
from minicomp.ir.expr import Var
from minicomp.ir.func import Function
from minicomp.ir.types import PointerType
from minicomp.schedule.templates import tiles
from minicomp.schedule.templates.attention import Operand
from minicomp.schedule.templates.attention_hopper import (
    BOX,
    LOG2E,
    SWIZZLE,
    map_view,
    shape_refusal,
    stride_refusal,
)
from minicomp.schedule.templates.base import DEFAULT_ARCH, Template, finish
from minicomp.schedule.templates.problem import ceil_div
from minicomp.script.function import script
from minicomp.script.hopper import (
    bulk_copy_g2s,
    fence_proxy_async,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait,
)
from minicomp.script.lang import (
    Macro,
    atomic_add,
    attrs,
    blockIdx,
    dynamic_shared_tensor,
    exp2,
    register_tensor,
    shared_tensor,
    shfl_xor_sync,
    syncthreads,
    threadIdx,
    unroll,
)
from minicomp.script.tma import bulk_commit_group, bulk_wait_group, tma_load, tma_store
from minicomp.script.types import ScalarType, f32, i64, tensor_map, u64
from minicomp.script.values import TensorRef
from minicomp.script.wgmma import (
    wgmma_commit_group,
    wgmma_fence,
    wgmma_mma_async,
    wgmma_wait_group,
)

NAME = "attention_hopper_bwd"
WARPGROUP = 128
MAX_SHARED = 227 * 1024
BARRIER_BYTES = 1024
ROW_PAD = 128  # the workspace's query rows: a multiple of every config's BM
ROWS_A_BLOCK = 4  # pre and post: a warp a query row
INF = float("inf")


@dataclass(frozen=True)
class HopperAttnBwdConfig:
    """`consumers` warpgroups of 64 keys (BN = 64 * consumers keys a block), BM = `bm` query
    rows a step, `stages` Q/dO stages."""

    consumers: int = 1
    bm: int = 64
    stages: int = 2

    @property
    def bn(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return WARPGROUP * self.consumers + 32

    def shared_bytes(self, head_dim: int) -> int:
        kv = 2 * self.bn * head_dim * 2
        ring = self.stages * 2 * self.bm * head_dim * 2
        ds = self.consumers * 2 * self.bm * BOX * 2
        return kv + ring + ds

    def __str__(self) -> str:
        return f"{self.bn}x{self.bm}_s{self.stages}"

    def check(self, head_dim: int) -> None:
        if self.consumers not in (1, 2) or self.bm not in (64, 128) or self.stages < 2:
            raise ValueError(
                f"{NAME}: no config {self} (1 or 2 consumer warpgroups, 64 or 128 query rows "
                "a step, 2 stages or more)"
            )
        if self.shared_bytes(head_dim) + BARRIER_BYTES > MAX_SHARED:
            raise ValueError(f"{NAME}[{self}]: head dim {head_dim} does not fit shared memory")


# Registers a consumer thread holds: dK and dV (D / 2 f32 each), S^T then dP^T (BM / 2 f32),
# P^T and dS^T (BM / 4 32-bit pairs each), a dQ^T chunk (BM / 2 f32). NVRTC 13 for sm_90a,
# measured at 4x16x1024: with two consumer warpgroups (288 threads, at most 168 registers a
# thread) only head dim 64 without causal masking fits (causal spills 16 bytes); with one
# (255), 64 and 128 query rows a step at head dim 64, 64 rows at 128 (237 to 244 registers).
CONFIGS = (
    HopperAttnBwdConfig(2, 64, 2),
    HopperAttnBwdConfig(1, 64, 2),
    HopperAttnBwdConfig(1, 128, 2),
    HopperAttnBwdConfig(1, 64, 3),
)


def valid(problem, cfg: HopperAttnBwdConfig) -> bool:
    """Whether `cfg` fits the problem's head dim in shared memory and registers (see
    CONFIGS)."""
    d = problem.head_dim
    try:
        cfg.check(d)
    except ValueError:
        return False
    if cfg.consumers == 2:
        return d == 64 and cfg.bm == 64 and not problem.causal
    return cfg.bm == 64 or d == 64


def heuristic(problem) -> HopperAttnBwdConfig:
    """Two consumer warpgroups (128 keys a block) where they fit (head dim 64, no causal mask)
    and their blocks fill the GPU's SMs, else one; 64 query rows a step."""
    two, one = CONFIGS[0], CONFIGS[1]
    blocks = problem.batch * problem.kv_heads * ceil_div(problem.seq_k, two.bn)
    return two if valid(problem, two) and blocks >= problem.sms else one


def space(problem, level: int) -> list[HopperAttnBwdConfig]:
    """The heuristic's config at level 0; the valid configs of CONFIGS above."""
    if level <= 0:
        return [heuristic(problem)]
    return list(dict.fromkeys((heuristic(problem), *(c for c in CONFIGS if valid(problem, c)))))


@dataclass
class BackwardProblem:
    """One attention backward: sizes, types, the operands (Operand: a flat buffer and its
    (batch, head, row, column) strides; the logsumexp's column stride 0), causal, scale."""

    name: str
    dtype: T.DataType
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    q: Operand
    k: Operand
    v: Operand
    o: Operand
    do: Operand
    lse: Operand
    dq: Operand
    dk: Operand
    dv: Operand
    causal: bool = False
    scale: float = 1.0
    sms: int = H100_SMS
    arch: str = DEFAULT_ARCH

    @property
    def rows(self) -> int:
        """The workspace's query rows a (batch, head): seq_q rounded up to ROW_PAD."""
        return ceil_div(self.seq_q, ROW_PAD) * ROW_PAD

    def workspace(self) -> dict[str, tuple]:
        """The f32 workspace buffers (name: shape) the kernels pass between them: D and the
        log2 logsumexp [B * H, rows], the dQ accumulator [B * H, rows, head dim] (flat)."""
        bh = self.batch * self.heads
        return {
            "delta": (bh, self.rows),
            "lse2": (bh, self.rows),
            "dqacc": (bh * self.rows * self.head_dim,),
        }

    def workspace_refs(self) -> dict[str, TensorRef]:
        return {
            n: TensorRef(f"{n}_{self.name}", Var(f"{n}_{self.name}", PointerType(T.f32)), s)
            for n, s in self.workspace().items()
        }

    def signature(self) -> str:
        """A stable description for the tuning database."""
        parts = [
            f"bwd bhk={self.batch},{self.heads},{self.kv_heads} s={self.seq_q},{self.seq_k}",
            f"d={self.head_dim} t={self.dtype.short}",
        ]
        for label in ("q", "k", "v", "o", "do", "dq", "dk", "dv"):
            parts.append(f"{label}={','.join(map(str, getattr(self, label).strides))}")
        parts.append(f"causal={int(self.causal)} scale={self.scale!r}")
        return " ".join(parts)


def refusal(problem: BackwardProblem) -> str | None:
    """Why the template does not compute `problem`, in a few words for explain; None when it
    does (see the module doc)."""
    refused = shape_refusal(problem)
    if refused is not None:
        return refused
    if problem.heads % problem.kv_heads:
        return f"{problem.heads} query heads over {problem.kv_heads} key heads"
    if problem.lse.dtype != T.f32:
        return f"a {problem.lse.dtype.short} logsumexp"
    every = ("q", "k", "v", "o", "do", "lse", "dq", "dk", "dv")
    return stride_refusal(problem, every, ("q", "k", "v", "do", "dk", "dv"))


def applies(problem: BackwardProblem) -> bool:
    """Whether the template computes `problem` (see refusal)."""
    return refusal(problem) is None


def instantiate(problem: BackwardProblem, cfg: HopperAttnBwdConfig) -> Function:
    """The main kernel (see the module doc): its tensor maps of Q, K, V, dO, dK and dV first
    (attrs.tensor_maps), then its buffers q, k, v, do, lse2, delta, dqacc, dk, dv."""
    return kernels(problem, cfg)[1]


def kernels(problem: BackwardProblem, cfg: HopperAttnBwdConfig) -> tuple[Function, ...]:
    """(pre, main, post): the three kernels computing `problem` (which `applies`) with `cfg`,
    in launch order. Their parameters are their buffers, named as `params` says."""
    refused = refusal(problem)
    if refused is not None:
        raise ValueError(f"{NAME} does not compute this attention backward: {refused}")
    cfg.check(problem.head_dim)
    work = problem.workspace_refs()
    names = tiles.Names()
    main = _main(problem, cfg, work, _store_grads(problem, names))
    maps = tuple(
        map_view(problem, role, heads, seq)
        for role, heads, seq in (
            ("q", problem.heads, problem.seq_q),
            ("k", problem.kv_heads, problem.seq_k),
            ("v", problem.kv_heads, problem.seq_k),
            ("do", problem.heads, problem.seq_q),
            ("dk", problem.kv_heads, problem.seq_k),
            ("dv", problem.kv_heads, problem.seq_k),
        )
    )
    return (
        finish(_pre(problem, work), f"{problem.name}_pre", f"{NAME}_pre"),
        finish(main, problem.name, f"{NAME}[{cfg}]", min_blocks=1, tensor_maps=maps),
        finish(_post(problem, work), f"{problem.name}_post", f"{NAME}_post"),
    )


def params(problem: BackwardProblem) -> dict[str, tuple[str, ...]]:
    """The buffer parameters of each kernel by role (operand roles and workspace names), in
    the kernel's order: what a launcher passes."""
    return {
        "pre": ("o", "do", "lse", "delta", "lse2", "dqacc"),
        "main": ("q", "k", "v", "do", "lse2", "delta", "dqacc", "dk", "dv"),
        # dK unread: a graph's launch of post then follows main's in every order.
        "post": ("dqacc", "dk", "dq"),
    }


def _var(problem: BackwardProblem, work: dict, role: str) -> Var:
    return work[role].var if role in work else getattr(problem, role).ref.var


def _pre(problem: BackwardProblem, work: dict) -> Function:
    """D = rowsum(dO * O), the log2 logsumexp and a zeroed dQ accumulator row, a warp a row
    (lanes along the head dim, reduced by shuffles)."""
    H, SQ, D, ROWS = problem.heads, problem.seq_q, problem.head_dim, problem.rows
    O_G, DO_G, L_G = problem.o.ref, problem.do.ref, problem.lse.ref
    OB, OH, OR, OC = problem.o.strides
    GB, GH, GR, GC = problem.do.strides
    LB, LH, LR = problem.lse.strides[:3]
    DELTA, LSE2, DQA = work["delta"], work["lse2"], work["dqacc"]
    BH = problem.batch * H
    own = tuple(_var(problem, work, r) for r in params(problem)["pre"])

    @script(params=own)
    def attention_bwd_pre():
        attrs.grid_dim = (ROWS // ROWS_A_BLOCK, BH)
        attrs.block_dim = 32 * ROWS_A_BLOCK
        lane = threadIdx.x % 32
        row = blockIdx.x * ROWS_A_BLOCK + threadIdx.x // 32
        bh = blockIdx.y
        b = bh // H
        h = bh % H
        total = 0.0
        if row < SQ:
            o_at = i64(b) * OB + i64(h) * OH + i64(row) * OR
            g_at = i64(b) * GB + i64(h) * GH + i64(row) * GR
            for c in unroll(range(D // 32)):
                col = lane + 32 * c
                total += f32(O_G[o_at + col * OC]) * f32(DO_G[g_at + col * GC])
        total += shfl_xor_sync(total, 16)
        total += shfl_xor_sync(total, 8)
        total += shfl_xor_sync(total, 4)
        total += shfl_xor_sync(total, 2)
        total += shfl_xor_sync(total, 1)
        if lane == 0:
            DELTA[bh, row] = total
            if row < SQ:
                LSE2[bh, row] = L_G[i64(b) * LB + i64(h) * LH + i64(row) * LR] * LOG2E
            else:
                LSE2[bh, row] = INF
        for c in unroll(range(D // 32)):
            DQA[(i64(bh) * ROWS + row) * D + lane + 32 * c] = 0.0

    return attention_bwd_pre.ir


def _post(problem: BackwardProblem, work: dict) -> Function:
    """dQ = dQacc * scale in the input type, with dQ's strides, a warp a row."""
    H, SQ, D, ROWS = problem.heads, problem.seq_q, problem.head_dim, problem.rows
    CAST = ScalarType(problem.dtype)
    SCALE = problem.scale
    DQ_G = problem.dq.ref
    QB, QH, QR, QC = problem.dq.strides
    DQA = work["dqacc"]
    BH = problem.batch * H
    own = tuple(_var(problem, work, r) for r in params(problem)["post"])

    @script(params=own)
    def attention_bwd_post():
        attrs.grid_dim = ((SQ + ROWS_A_BLOCK - 1) // ROWS_A_BLOCK, BH)
        attrs.block_dim = 32 * ROWS_A_BLOCK
        lane = threadIdx.x % 32
        row = blockIdx.x * ROWS_A_BLOCK + threadIdx.x // 32
        bh = blockIdx.y
        b = bh // H
        h = bh % H
        if row < SQ:
            at = i64(b) * QB + i64(h) * QH + i64(row) * QR
            for c in unroll(range(D // 32)):
                col = lane + 32 * c
                DQ_G[at + col * QC] = CAST(DQA[(i64(bh) * ROWS + row) * D + col] * SCALE)

    return attention_bwd_post.ir


def _store_grads(problem: BackwardProblem, names: tiles.Names) -> Macro:
    """Macro `store(dk_acc, dv_acc, k_s, v_s, kr, tq)`: dK * scale and dV of the thread's key
    rows kr and kr + 8 (rows of the block's tiles) into K's and V's tiles [D / 64, BN, 64],
    each 64-column box swizzled as TMA stores it (chunk c of row r at chunk c ^ r % 8)."""
    D = problem.head_dim
    CAST = ScalarType(problem.dtype)
    SCALE = problem.scale

    def store(dk_acc, dv_acc, k_s, v_s, kr, tq):
        @script
        def store_grads():
            for r in unroll(range(2)):
                sr = kr + 8 * r
                for j in unroll(range(D // 8)):
                    for c in unroll(range(2)):
                        col = (j % 8 ^ sr % 8) * 8 + 2 * tq + c
                        k_s[j // 8, sr, col] = CAST(dk_acc[4 * j + 2 * r + c] * SCALE)
                        v_s[j // 8, sr, col] = CAST(dv_acc[4 * j + 2 * r + c])

        return store_grads

    return names.fragment("out", store)


def _main(problem: BackwardProblem, cfg: HopperAttnBwdConfig, work: dict, store: Macro):
    """The main kernel's script (see the module doc)."""
    dt = ScalarType(problem.dtype)
    B, H, HK, SQ, SK, D = (
        problem.batch,
        problem.heads,
        problem.kv_heads,
        problem.seq_q,
        problem.seq_k,
        problem.head_dim,
    )
    G = H // HK
    BM, BN, STAGES, C = cfg.bm, cfg.bn, cfg.stages, cfg.consumers
    CONSUMERS = WARPGROUP * C
    DB = D // BOX
    V_AT = BN * D * 2  # byte offsets: multiples of 1024
    Q_AT = 2 * V_AT
    DO_AT = Q_AT + STAGES * BM * D * 2
    DS_AT = DO_AT + STAGES * BM * D * 2
    STAGE_BYTES = 2 * BM * D * 2 + 2 * BM * 4
    CAUSAL = problem.causal
    SCALE2 = problem.scale * LOG2E
    ROWS = problem.rows
    LSE2, DELTA, DQA = work["lse2"], work["delta"], work["dqacc"]
    own = tuple(_var(problem, work, r) for r in params(problem)["main"])

    @script(params=own)
    def attention_hopper_bwd(
        tma_q: tensor_map(dt[B, H, SQ, D], box=(1, 1, BM, BOX), swizzle=SWIZZLE),
        tma_k: tensor_map(dt[B, HK, SK, D], box=(1, 1, BN, BOX), swizzle=SWIZZLE),
        tma_v: tensor_map(dt[B, HK, SK, D], box=(1, 1, BN, BOX), swizzle=SWIZZLE),
        tma_do: tensor_map(dt[B, H, SQ, D], box=(1, 1, BM, BOX), swizzle=SWIZZLE),
        tma_dk: tensor_map(dt[B, HK, SK, D], box=(1, 1, 64, BOX), swizzle=SWIZZLE),
        tma_dv: tensor_map(dt[B, HK, SK, D], box=(1, 1, 64, BOX), swizzle=SWIZZLE),
    ):
        attrs.grid_dim = ((SK + BN - 1) // BN, B * HK)
        attrs.block_dim = CONSUMERS + 32
        t = threadIdx.x
        k_s = dynamic_shared_tensor(dt, (DB, BN, BOX), at=0)
        v_s = dynamic_shared_tensor(dt, (DB, BN, BOX), at=V_AT)
        q_s = dynamic_shared_tensor(dt, (STAGES, DB, BM, BOX), at=Q_AT)
        do_s = dynamic_shared_tensor(dt, (STAGES, DB, BM, BOX), at=DO_AT)
        # dS of a warpgroup's keys, [query, key] K-major over the keys: two buffers.
        ds_s = dynamic_shared_tensor(dt, (C, 2, BM, BOX), at=DS_AT)
        ds_flat = dynamic_shared_tensor(dt, (C, 2, BM * BOX), at=DS_AT)  # the same, flat
        lse_s = shared_tensor(f32, (STAGES, BM))
        dl_s = shared_tensor(f32, (STAGES, BM))
        kv_full = shared_tensor(u64, (1,))
        full = shared_tensor(u64, (STAGES,))
        empty = shared_tensor(u64, (STAGES,))
        ds_full = shared_tensor(u64, (2 * C,))
        done = shared_tensor(u64, (C,))
        if t == 0:
            mbarrier_init(kv_full[0], 1)
            for s in range(STAGES):
                mbarrier_init(full[s], 1)
                mbarrier_init(empty[s], CONSUMERS)
            for s in range(2 * C):
                mbarrier_init(ds_full[s], WARPGROUP)
            for s in range(C):
                mbarrier_init(done[s], WARPGROUP)
        syncthreads()
        b = blockIdx.y // HK
        hk = blockIdx.y % HK
        n0 = blockIdx.x * BN
        if CAUSAL:
            m_first = n0 // BM  # query blocks ending before the first key see none of them
        else:
            m_first = 0
        per_head = max((SQ + BM - 1) // BM - m_first, 0)
        steps = G * per_head
        if t == CONSUMERS:  # the producer: one thread issues every copy
            mbarrier_arrive_expect_tx(kv_full[0], 2 * BN * D * 2)
            for j in unroll(range(DB)):
                tma_load(k_s[j], tma_k, b, hk, n0, BOX * j, kv_full[0])
                tma_load(v_s[j], tma_v, b, hk, n0, BOX * j, kv_full[0])
            for it in range(steps):
                s = it % STAGES
                g = it // per_head
                h = hk * G + g
                m0 = (m_first + it - g * per_head) * BM
                mbarrier_wait(empty[s], it // STAGES % 2 ^ 1)
                mbarrier_arrive_expect_tx(full[s], STAGE_BYTES)
                for j in unroll(range(DB)):
                    tma_load(q_s[s, j], tma_q, b, h, m0, BOX * j, full[s])
                    tma_load(do_s[s, j], tma_do, b, h, m0, BOX * j, full[s])
                bulk_copy_g2s(lse_s[s, 0], LSE2[b * H + h, m0], BM * 4, full[s])
                bulk_copy_g2s(dl_s[s, 0], DELTA[b * H + h, m0], BM * 4, full[s])
        elif t < CONSUMERS:
            wg = t // WARPGROUP
            lane = t % 32
            tq = lane % 4
            w = t % WARPGROUP // 32
            kr = 64 * wg + 16 * w + lane // 4  # the thread's first key row
            # Element i of an accumulator over (key, query) is key kr + 8 (i // 2 % 2), query
            # 8 (i // 4) + 2 tq + i % 2: the addresses below are a base of the thread's plus a
            # constant of i's (else ptxas keeps an address a register for each i). In dS's
            # row (query) the key's chunk 2 w + r is swizzled to 2 (w ^ tq) + (r ^ i % 2).
            ds_at = 2 * tq * BOX + 16 * (w ^ tq) + lane // 4
            s_acc = register_tensor(f32, (BM // 2,))
            dp = register_tensor(f32, (BM // 2,))
            p = register_tensor(dt, (BM // 2,))
            ds = register_tensor(dt, (BM // 2,))
            dq_acc = register_tensor(f32, (BM // 2,))
            dk_acc = register_tensor(f32, (D // 2,))
            dv_acc = register_tensor(f32, (D // 2,))
            for i in unroll(range(D // 2)):
                dk_acc[i] = 0.0
                dv_acc[i] = 0.0
            mbarrier_wait(kv_full[0], 0)
            for it in range(steps):
                s = it % STAGES
                g = it // per_head
                bh = b * H + hk * G + g
                m0 = (m_first + it - g * per_head) * BM
                buf = it % 2
                dq_at = (i64(bh) * ROWS + m0 + 2 * tq) * D + kr % 64
                above = n0 + kr - m0 - 2 * tq  # a key past a query by more than this: masked
                mbarrier_wait(full[s], it // STAGES % 2)
                wgmma_fence()
                for kk in unroll(range(D // 16)):
                    wgmma_mma_async(
                        s_acc,
                        k_s[kk // 4, 64 * wg, 16 * (kk % 4)],
                        q_s[s, kk // 4, 0, 16 * (kk % 4)],
                        swizzle=SWIZZLE,
                        scale_d=kk > 0,
                    )
                wgmma_commit_group()
                wgmma_wait_group(0, s_acc)
                # P^T: element i is key kr + 8 (i // 2 % 2), query 8 (i // 4) + 2 tq + i % 2;
                # kept 16-bit only (S^T's registers are free for dP^T's).
                for i in unroll(range(BM // 2)):
                    e = exp2(s_acc[i] * SCALE2 - lse_s[s, 2 * tq + 8 * (i // 4) + i % 2])
                    if CAUSAL:
                        e = 0.0 if above > 8 * (i // 4) + i % 2 - 8 * (i // 2 % 2) else e
                    p[i] = dt(e)
                wgmma_fence()
                for kk in unroll(range(D // 16)):
                    wgmma_mma_async(
                        dp,
                        v_s[kk // 4, 64 * wg, 16 * (kk % 4)],
                        do_s[s, kk // 4, 0, 16 * (kk % 4)],
                        swizzle=SWIZZLE,
                        scale_d=kk > 0,
                    )
                wgmma_commit_group()
                for kk in unroll(range(BM // 16)):
                    wgmma_mma_async(
                        dv_acc, p[8 * kk], do_s[s, 0, 16 * kk, 0], swizzle=SWIZZLE, trans_b=True
                    )
                wgmma_commit_group()
                wgmma_wait_group(1, dp)
                # dS^T into registers, and dS into the buffer: query row, key chunk swizzled.
                for i in unroll(range(BM // 2)):
                    d_s = dt(f32(p[i]) * (dp[i] - dl_s[s, 2 * tq + 8 * (i // 4) + i % 2]))
                    ds[i] = d_s
                    row, chunk = 8 * (i // 4) + i % 2, i // 2 % 2 ^ i % 2
                    ds_flat[wg, buf, ds_at + row * BOX + 8 * chunk] = d_s
                fence_proxy_async()  # the stores, before the mma reads them
                mbarrier_arrive(ds_full[2 * wg + buf])
                wgmma_fence()
                for kk in unroll(range(BM // 16)):
                    wgmma_mma_async(
                        dk_acc, ds[8 * kk], q_s[s, 0, 16 * kk, 0], swizzle=SWIZZLE, trans_b=True
                    )
                wgmma_commit_group()
                mbarrier_wait(ds_full[2 * wg + buf], it // 2 % 2)
                # dQ^T += K^T dS^T, 64 rows of head dim at a time.
                for j in unroll(range(DB)):
                    wgmma_fence()
                    for kk in unroll(range(4)):
                        wgmma_mma_async(
                            dq_acc,
                            k_s[j, 64 * wg + 16 * kk, 0],
                            ds_s[wg, buf, 0, 16 * kk],
                            swizzle=SWIZZLE,
                            scale_d=kk > 0,
                            trans_a=True,
                        )
                    wgmma_commit_group()
                    wgmma_wait_group(0, dq_acc)
                    for i in unroll(range(BM // 2)):
                        at = (8 * (i // 4) + i % 2) * D + BOX * j + 8 * (i // 2 % 2)
                        atomic_add(DQA[dq_at + at], dq_acc[i])
                mbarrier_arrive(empty[s])
            wgmma_wait_group(0, dk_acc)
            # dK and dV into the rows of K and V this warpgroup alone read, once all of its
            # threads have waited for their last mma's (which read K).
            mbarrier_arrive(done[wg])
            mbarrier_wait(done[wg], 0)
            store(dk_acc, dv_acc, k_s, v_s, kr, tq)
            fence_proxy_async()  # the stores, before the TMA stores read them
        syncthreads()
        if t == 0:  # dK's and dV's boxes by TMA: rows past the last key are not written
            for wgi in unroll(range(C)):
                for j in unroll(range(DB)):
                    tma_store(tma_dk, b, hk, n0 + 64 * wgi, BOX * j, k_s[j, 64 * wgi, 0])
                    tma_store(tma_dv, b, hk, n0 + 64 * wgi, BOX * j, v_s[j, 64 * wgi, 0])
            bulk_commit_group()
            bulk_wait_group(0)

    return attention_hopper_bwd.ir


TEMPLATE = Template(NAME, space, heuristic, instantiate, applies)
