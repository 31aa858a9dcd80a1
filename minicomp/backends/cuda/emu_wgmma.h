// minicomp cuda-emu: warpgroup MMA (wgmma.h's macros, on the host), exactly as late as a GPU
// may run it, so that the bugs PTX leaves undefined show.
//
// emu.py appends this text after emu_mma.h (whose f16/bf16 widening it uses) and swizzle.h;
// kernels using it run their threads as fibers. Each thread keeps its own queue: a
// wgmma_mma_async is recorded at issue (its descriptors, its accumulator registers and, unless
// it continues an mma still pending on the same registers, their values then) and the
// registers are poisoned (NaN) until the wgmma_wait_group that retires its group computes it,
// reading shared memory at that moment, so an operand overwritten before the wait, or an
// accumulator read without it, gives a wrong result. The operands are read where the
// descriptors say, decoded as the GPU decodes them (start address, leading and stride byte
// offsets, the swizzle of swizzle.h on the address bits), within the tensors the script
// named: a descriptor reaching outside them is an error, never a stray read.
//
// A from registers is read at issue (every lane of the warp leaves its fragment at a warp
// barrier, as the instruction is .sync.aligned), not at the wait: the emulator does not catch
// those registers changed before the wait.
//
// Errors, naming the kernel's source line: an mma_async that does not continue a pending
// mma on its registers without a wgmma_fence since the thread's last wait (or its start); a
// warpgroup that is not complete, or whose threads issue different mma_asyncs (operands or
// count); an operand not 16-byte aligned, or swizzled and starting off the first row of an
// aligned swizzle pattern; work still pending when a thread exits.
//
// The lens counts each mma_async as n / 2 m16n8k16 mma (the same operations), priced at the
// device's mma.sync rate.
//
// Each thread's results are c (or 0 when scale-d is 0) plus the 16 (float8: 32) exact
// products, added in k order with rounding to nearest after each addition, as emu_mma.h's
// mma.sync.
#ifndef MC_EMU_WGMMA_H
#define MC_EMU_WGMMA_H

#include <deque>
#include <type_traits>

namespace mc_emu {

// One shared-memory operand as issued.
struct WgmmaOperand {
    uint64_t desc;
    uintptr_t ref;     // the address the script named (gives the high bits of the host address)
    uintptr_t lo, hi;  // the bytes of its tensor
    const char* name;
    bool mn;           // MN-major (imm-trans set): rows contiguous, not K
};

struct WgmmaOp {
    unsigned n;
    unsigned kind;  // wgmma.h's: 0 f16, 1 bf16, 2-5 float8 pairs (e4m3/e5m2 of a, then of b)
    float* d;
    WgmmaOperand a, b;
    int scale_d;
    bool chained;  // its input is the result of the pending mma before it on the same d
                   // (c once that one retires)
    int line;
    std::vector<float> c;
    std::vector<float> regs;  // A from registers: this thread's two rows of A, 16 K each
                              // (gathered from its quad's fragments at issue); else empty
};

struct WgmmaThread {
    std::deque<WgmmaOp> pending;   // issued, not retired, oldest first
    std::deque<unsigned> groups;   // committed groups (their sizes), oldest first
    unsigned open = 0;             // issued since the last commit
    unsigned issued = 0;
    bool fenced = false;           // a wgmma_fence since the start or the last wait
    int wait_line = 0;
};

struct WgmmaIssue {
    uint64_t da, db;
    unsigned n;
    int line;
};

struct WgmmaState {
    std::vector<WgmmaThread> threads;
    // A-from-registers fragments as issued (8 16-bit elements a thread), one buffer per warp
    // barrier parity as the warp shuffles' slots: a lane may issue the next before a slower
    // one has read this one.
    std::vector<uint16_t> fragments[2];
    std::vector<std::vector<WgmmaIssue>> warpgroups;  // each mma_async its warpgroup issued
};

namespace wgmma {

static const uint64_t ADDRESS_BITS = 0x3ffff;

static WgmmaState& state(Block* b) {
    if (!b->wgmma) {
        b->wgmma = new WgmmaState;
        b->wgmma->threads.resize(b->nthreads);
        b->wgmma->warpgroups.resize((b->nthreads + 127) / 128);
    }
    return *b->wgmma;
}

static Block* block() {
    Block* b = tls_block;
    if (!b) throw PlainModeBarrier();
    return b;
}

// Ends the block with `message`, as emu_async.h's errors do; the thread never resumes.
[[noreturn]] static void fail(Block* b, const std::string& message) { async_fail(b, message); }

// The descriptor wgmma.h builds: bits 0-13 start >> 4, 16-29 lbo >> 4, 32-45 sbo >> 4,
// 62-63 the swizzle mode; the start is the low 18 bits of the address, as in .shared space.
static uint64_t descriptor(uintptr_t p, uint32_t lbo, uint32_t sbo, uint32_t mode) {
    return (uint64_t)((p & ADDRESS_BITS) >> 4) | ((uint64_t)((lbo >> 4) & 0x3fffu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3fffu) << 32) | ((uint64_t)mode << 62);
}

// The swizzle span in bytes of a descriptor's mode (0 for none).
static unsigned span_of(unsigned mode) {
    return mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
}

// The bytes of shared tensor `a`: a static array, or a pointer into the dynamic shared memory
// (a tensor there may reach its end).
template <class A>
static void extent(A& a, uintptr_t& lo, uintptr_t& hi) {
    if constexpr (std::is_array<A>::value) {
        lo = (uintptr_t)a;
        hi = lo + sizeof a;
    } else {
        uintptr_t dyn = (uintptr_t)tls_dynamic_smem, q = (uintptr_t)a;
        bool inside = q >= dyn && q < dyn + tls_worker->smem_bytes;
        lo = inside ? dyn : q;
        hi = inside ? dyn + tls_worker->smem_bytes : q;
    }
}

// The bytes of an element of a K-major operand, and its K elements a step (32 bytes).
static unsigned element_bytes(unsigned kind) { return kind >= 2 ? 1 : 2; }

// Where the descriptor places element (row, k) of `size` bytes of an operand. K-major: core
// matrices of 8 rows of 16 bytes of K (lbo the next in K, sbo the next 8 rows), or under a
// swizzle rows of one span (sbo the next 8 rows). MN-major: core matrices of 8 K of 16 bytes
// of rows (lbo the next 8 K, sbo the next rows), or under a swizzle K rows of one span of
// rows (sbo the next 8 K, lbo the next span of rows).
static uintptr_t element(const WgmmaOperand& o, unsigned row, unsigned k, unsigned size) {
    uint64_t desc = o.desc;
    uintptr_t start = (uintptr_t)(desc & 0x3fffu) << 4;
    uintptr_t lbo = (uintptr_t)((desc >> 16) & 0x3fffu) << 4;
    uintptr_t sbo = (uintptr_t)((desc >> 32) & 0x3fffu) << 4;
    unsigned span = span_of((unsigned)(desc >> 62));
    uintptr_t base = (o.ref & ~(uintptr_t)ADDRESS_BITS) | start;
    unsigned kb = k * size, rb = row * size;
    uintptr_t u;
    if (!o.mn) {
        if (!span) return base + row / 8 * sbo + kb / 16 * lbo + row % 8 * 16 + kb % 16;
        u = base + row / 8 * sbo + row % 8 * span + kb;
    } else {
        if (!span) return base + rb / 16 * sbo + k / 8 * lbo + k % 8 * 16 + rb % 16;
        u = base + rb / span * lbo + k / 8 * sbo + k % 8 * span + rb % span;
    }
    return (u & ~(uintptr_t)0xffffffffu) | mc_swizzle((unsigned)u, span);
}

// Element (row, k) of operand a (`second` false) or b of `op` as a float, refused outside its
// tensor.
MC_LENS_UNINSTRUMENTED static float load(Block* b, const WgmmaOp& op, bool second, unsigned row,
                                         unsigned k) {
    const WgmmaOperand& o = second ? op.b : op.a;
    unsigned size = element_bytes(op.kind);
    uintptr_t at = element(o, row, k, size);
    if (at < o.lo || at + size > o.hi) {
        fail(b, format("wgmma_mma_async (line %d): the descriptor of operand %s places its "
                       "element (%u, %u) at byte %lld of that tensor, which has %llu bytes (a "
                       "wrong start, leading or stride byte offset)",
                       op.line, o.name, row, k, (long long)(at - o.lo),
                       (unsigned long long)(o.hi - o.lo)));
    }
    if (size == 2) {
        uint16_t h;
        memcpy(&h, (const void*)at, 2);
        return op.kind == 1 ? mma::bf16_to_f32(h) : mma::f16_to_f32(h);
    }
    unsigned char x = *(const unsigned char*)at;
    bool e5m2 = second ? (op.kind - 2) & 1 : (op.kind - 2) >> 1;
    return e5m2 ? mma::e5m2_to_f32(x) : mma::e4m3_to_f32(x);
}

// Computes `op` for the calling thread (shared memory as it is now): its results go to the
// next pending mma on the same registers, as its input, or else to the registers.
MC_LENS_UNINSTRUMENTED static void retire(Block* b, WgmmaThread& th, const WgmmaOp& op) {
    unsigned t = b->current->linear % 128, w = t / 32, l = t % 32;
    unsigned K = 32 / element_bytes(op.kind);
    float A[2][32];
    for (unsigned h = 0; h < 2; h++)
        for (unsigned k = 0; k < K; k++)
            A[h][k] = op.regs.empty() ? load(b, op, false, 16 * w + l / 4 + 8 * h, k)
                                      : op.regs[16 * h + k];
    std::vector<float> d(op.n / 2);
    for (unsigned i = 0; i < op.n / 2; i++) {
        unsigned col = 8 * (i >> 2) + 2 * (l & 3) + (i & 1);
        float acc = op.scale_d ? op.c[i] : 0.0f;
        for (unsigned k = 0; k < K; k++) {
            float product = A[(i >> 1) & 1][k] * load(b, op, true, col, k);
            acc = acc + product;
        }
        d[i] = acc;
    }
    for (WgmmaOp& next : th.pending) {
        if (next.d == op.d && next.chained) {
            next.c = std::move(d);
            next.chained = false;
            return;
        }
    }
    memcpy(op.d, d.data(), d.size() * sizeof(float));
}

static void check_swizzle(Block* b, const WgmmaOperand& o, int line) {
    unsigned span = span_of((unsigned)(o.desc >> 62));
    if (!span) return;
    unsigned mask = span / 16 - 1;
    uintptr_t start = (uintptr_t)(o.desc & 0x3fffu) << 4;
    if ((start >> 7) & mask) {
        fail(b, format("wgmma_mma_async (line %d): operand %s has a %u-byte swizzle but starts "
                       "at byte %llu of a %u-byte swizzle pattern, not in its first row (a "
                       "swizzled buffer must be %u-byte aligned)",
                       line, o.name, span, (unsigned long long)(start % (8 * span)), 8 * span,
                       8 * span));
    }
}

static void issue(unsigned n, unsigned kind, float* d, WgmmaOperand a, WgmmaOperand b_op,
                  int scale_d, int line, std::vector<float> regs = {}) {
    Block* b = block();
    Fiber* f = b->current;
    unsigned wg = f->linear / 128;
    if ((wg + 1) * 128 > b->nthreads) {
        fail(b, format("wgmma_mma_async (line %d) needs all 128 threads of warpgroup %u, but "
                       "the block has %u threads",
                       line, wg, b->nthreads));
    }
    WgmmaState& s = state(b);
    WgmmaThread& th = s.threads[f->linear];
    bool chained = false;
    for (const WgmmaOp& p : th.pending) {
        if (p.d == d && p.n == n) {
            chained = true;
        } else if (d < p.d + p.n / 2 && p.d < d + n / 2) {
            fail(b, format("wgmma_mma_async (line %d): its accumulators overlap those of the "
                           "pending wgmma_mma_async of line %d without being the same",
                           line, p.line));
        }
    }
    if (!chained && !th.fenced) {
        std::string since = th.wait_line ? format("the wgmma_wait_group of line %d", th.wait_line)
                                         : std::string("the kernel's start");
        fail(b, format("wgmma_mma_async (line %d) without a wgmma_fence() since this thread "
                       "last touched its accumulators (%s): PTX requires one before an "
                       "mma_async that does not continue a pending one",
                       line, since.c_str()));
    }
    for (const WgmmaOperand* o : {&a, &b_op}) {
        if (o == &a && !regs.empty()) continue;
        if (o->ref % 16) {
            fail(b, format("wgmma_mma_async (line %d): operand %s starts at byte %llu of its "
                           "tensor, not a multiple of 16 (a descriptor holds address / 16)",
                           line, o->name, (unsigned long long)(o->ref - o->lo)));
        }
        check_swizzle(b, *o, line);
    }
    std::vector<WgmmaIssue>& ops = s.warpgroups[wg];
    WgmmaIssue mine{a.desc, b_op.desc, n, line};
    if (th.issued == ops.size()) {
        ops.push_back(mine);
    } else {
        const WgmmaIssue& first = ops[th.issued];
        if (first.da != mine.da || first.db != mine.db || first.n != n || first.line != line) {
            fail(b, format("the threads of warpgroup %u issue different wgmma_mma_async as "
                           "their number %u (line %d and line %d, or other operands); all 128 "
                           "threads issue the same ones",
                           wg, th.issued, first.line, line));
        }
    }
    th.issued++;
    // Counted in m16n8k16 equivalents: 2 * 64 * n * 16 operations are n / 2 of them, n / 8 a
    // warp, counted as lens counts warp instructions (once a thread); priced at the device's
    // wgmma rate (lens/devices.py), apart from mma.sync's.
    MC_LENS_COUNT(LENS_WGMMA, n / 8);
    MC_LENS_COUNT(LENS_WGMMA_INSTRUCTIONS, 1);
    WgmmaOp op{n, kind, d, a, b_op, scale_d, chained, line, {}, std::move(regs)};
    if (!chained) op.c.assign(d, d + n / 2);
    for (unsigned i = 0; i < n / 2; i++) d[i] = NAN;  // until the wait that retires it
    th.pending.push_back(std::move(op));
    th.open++;
}

static void fence() { state(block()).threads[block()->current->linear].fenced = true; }

static void commit() {
    WgmmaThread& th = state(block()).threads[block()->current->linear];
    th.groups.push_back(th.open);
    th.open = 0;
}

static void wait(unsigned n, int line) {
    Block* b = block();
    WgmmaThread& th = state(b).threads[b->current->linear];
    while (th.groups.size() > n) {
        for (unsigned i = th.groups.front(); i; i--) {
            WgmmaOp op = std::move(th.pending.front());
            th.pending.pop_front();
            retire(b, th, op);
        }
        th.groups.pop_front();
    }
    th.fenced = false;
    th.wait_line = line;
}

template <class A, class B>
static void mma_async(unsigned n, unsigned kind, unsigned trans, float* d, A& a, const void* a_at,
                      uint32_t lbo_a, uint32_t sbo_a, B& b, const void* b_at, uint32_t lbo_b,
                      uint32_t sbo_b, uint32_t mode, int scale_d, const char* a_name,
                      const char* b_name, int line) {
    WgmmaOperand oa{descriptor((uintptr_t)a_at, lbo_a, sbo_a, mode), (uintptr_t)a_at, 0, 0,
                    a_name, (trans & 2) != 0};
    WgmmaOperand ob{descriptor((uintptr_t)b_at, lbo_b, sbo_b, mode), (uintptr_t)b_at, 0, 0,
                    b_name, (trans & 1) != 0};
    extent(a, oa.lo, oa.hi);
    extent(b, ob.lo, ob.hi);
    issue(n, kind, d, oa, ob, scale_d, line);
}

// A from registers: every lane of the warp leaves its 8 elements (a0..a7: rows l/4 and
// l/4 + 8 of its warp's 16, K 2 (l % 4) + {0, 1} and the same + 8) and waits for the others at
// a warp barrier (wgmma is .sync.aligned: the warp issues it together); then each takes the
// two rows of A its accumulators need from its quad (the 4 lanes of its rows).
template <class B>
static void mma_async_rs(unsigned n, unsigned kind, unsigned trans_b, float* d, const uint16_t* a,
                         B& b, const void* b_at, uint32_t lbo_b, uint32_t sbo_b, uint32_t mode,
                         int scale_d, const char* a_name, const char* b_name, int line) {
    Block* blk = block();
    Fiber* f = blk->current;
    WgmmaState& s = state(blk);
    Warp& w = warp_of(blk, f);
    unsigned buf = w.gen & 1, l = f->linear % 32, base = f->linear - l;
    std::vector<uint16_t>& slots = s.fragments[buf];
    if (slots.size() < 8u * blk->nthreads) slots.resize(8u * blk->nthreads);
    memcpy(&slots[8u * f->linear], a, 16);
    warp_barrier(blk, f, w);
    std::vector<float> regs(32);
    for (unsigned h = 0; h < 2; h++) {
        for (unsigned k = 0; k < 16; k++) {
            unsigned lane = l / 4 * 4 + k % 8 / 2, j = k % 2 + 2 * h + 4 * (k / 8);
            uint16_t x = slots[8u * (base + lane) + j];
            regs[16 * h + k] = kind == 1 ? mma::bf16_to_f32(x) : mma::f16_to_f32(x);
        }
    }
    WgmmaOperand oa{0, (uintptr_t)a, 0, 0, a_name, false};
    WgmmaOperand ob{descriptor((uintptr_t)b_at, lbo_b, sbo_b, mode), (uintptr_t)b_at, 0, 0,
                    b_name, trans_b != 0};
    extent(b, ob.lo, ob.hi);
    issue(n, kind, d, oa, ob, scale_d, line, std::move(regs));
}

}  // namespace wgmma

// At the block's end (emu.h): "" or the error of work left pending or of an incomplete
// warpgroup; frees the state.
static std::string wgmma_finish(Block* b) {
    if (!b->wgmma) return "";
    WgmmaState* s = b->wgmma;
    b->wgmma = nullptr;
    std::string error;
    for (unsigned i = 0; i < b->nthreads && error.empty(); i++) {
        const WgmmaThread& th = s->threads[i];
        if (th.pending.empty()) continue;
        error = format("thread %u of block (%u,%u,%u) exits with %zu wgmma_mma_async "
                       "pending (the last issued at line %d, %zu in committed groups): a "
                       "wgmma_wait_group must retire them",
                       i, b->idx.x, b->idx.y, b->idx.z, th.pending.size(),
                       th.pending.back().line, th.pending.size() - th.open);
    }
    for (unsigned i = 0; i < b->nthreads && error.empty(); i++) {
        const WgmmaThread& th = s->threads[i];
        const WgmmaThread& first = s->threads[i / 128 * 128];
        if (th.issued != first.issued) {
            error = format("block (%u,%u,%u): thread %u issued %u wgmma_mma_async "
                           "but thread %u of the same warpgroup %u; all 128 threads of a warpgroup "
                           "take part in each",
                           b->idx.x, b->idx.y, b->idx.z, i / 128 * 128,
                           first.issued, i, th.issued);
        }
    }
    delete s;
    return error;
}

}  // namespace mc_emu

#define mc_wgmma_fence() ::mc_emu::wgmma::fence()
#define mc_wgmma_commit_group() ::mc_emu::wgmma::commit()
#define mc_wgmma_wait_group(N) ::mc_emu::wgmma::wait(N, __LINE__)
#define mc_wgmma_wait_group_fenced(N, COUNT, acc) ::mc_emu::wgmma::wait(N, __LINE__)
#define mc_wgmma_mma_async(N, KIND, TRANS, d, a, ai, lbo_a, sbo_a, b, bi, lbo_b, sbo_b, mode,  \
                           scale)                                                               \
    ::mc_emu::wgmma::mma_async(N, KIND, TRANS, d, a, &(a)[ai], lbo_a, sbo_a, b, &(b)[bi], lbo_b, \
                               sbo_b, mode, scale, #a, #b, __LINE__)
#define mc_wgmma_mma_async_rs(N, KIND, TRANS_B, d, a, ai, b, bi, lbo_b, sbo_b, mode, scale)    \
    ::mc_emu::wgmma::mma_async_rs(N, KIND, TRANS_B, d, &(a)[ai], b, &(b)[bi], lbo_b, sbo_b, mode, \
                                  scale, #a, #b, __LINE__)

#endif  // MC_EMU_WGMMA_H
