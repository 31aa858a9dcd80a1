// minicomp cuda-emu: mbarriers and bulk asynchronous copies (async.h's names, on the host).
//
// emu.h includes this text after its barriers. Kernels using these run their threads as fibers.
// Each block keeps a table of its mbarriers, keyed by address: expected and pending arrivals,
// the transaction count (bytes announced by arrive_expect_tx minus bytes landed) and the number
// of completed phases; the uint64_t in shared memory only mirrors the current phase's parity.
//
// A bulk copy lands as late as a GPU may land it, so that a missing wait shows: at issue its
// destination is poisoned (every byte 0xff: NaN floats, -1 integers) and the copy is queued on
// its barrier; the queued copies land (source read then) only when the phase has all its
// arrivals and a thread needs it: one waits or tests for it, or arrives for the next phase.
// Then the transaction count must reach exactly zero: below zero (copies brought more bytes than
// announced) is an error naming the barrier; above zero leaves the phase incomplete, and its
// waiters blocked. A block in which no thread can go on (all wait, blocked or spinning on
// try_wait with no barrier changing) is a deadlock, reported with each barrier waited on, its
// pending arrivals and outstanding bytes, never a hang.
//
// TMA tensor copies (emu_tma.h moves their data) share the queue: a tensor load is a queued
// copy whose bytes are its whole box (out-of-bounds elements included, as on a GPU), landing
// swizzled with zeros outside the tensor. A tensor store snapshots its shared source at issue
// and writes the elements inside the tensor when a bulk_wait_group (or the thread's end)
// completes its bulk group; if the source has changed by the time bulk_wait_group_read (or
// bulk_wait_group, or the thread's end) waits for it, the store read memory being overwritten
// (a GPU may read it at any moment until then): an error naming the store's line.
#ifndef MC_EMU_ASYNC_H
#define MC_EMU_ASYNC_H

#include "emu_tma.h"

namespace mc_emu {

struct BulkCopy {
    void* dst;
    const void* src;
    uint32_t bytes;
    bool tensor;       // a TMA load of the box at `coords` described by `desc`
    TmaDesc desc;
    int32_t coords[TMA_MAX_RANK];
};

// A TMA store not yet completed: its shared source as it was at issue, its bulk group.
struct TmaStore {
    TmaDesc desc;
    int32_t coords[TMA_MAX_RANK];
    const void* src;
    std::vector<unsigned char> snapshot;
    unsigned long long group;
    bool read;  // bulk_wait_group_read has checked its source
    int line;
};

struct Mbar {
    uint64_t* addr;
    unsigned expected;
    unsigned pending;           // arrivals the current phase still needs
    long long tx;               // bytes announced minus bytes landed, this phase
    unsigned long long phases;  // completed phases: the current one has parity phases & 1
    unsigned waiters;           // fibers blocked in mbarrier_wait on it
    std::vector<BulkCopy> copies;  // issued, not landed
};

// What a fiber last waited for (blocked, or spinning on try_wait since epoch `epoch`).
struct FiberWait {
    const uint64_t* bar;
    const char* name;
    unsigned parity;
    int line;
    unsigned spins;
    unsigned long long epoch;
};

struct AsyncState {
    std::vector<Mbar> bars;
    std::vector<FiberWait> waits;  // by fiber
    std::vector<std::vector<TmaStore>> stores;      // by fiber, issued and not completed
    std::vector<unsigned long long> committed;      // by fiber: bulk groups committed
    unsigned long long epoch = 0;  // changes with every arrival, copy and phase
};

static AsyncState& async_state(Block* b) {
    if (!b->async) {
        b->async.reset(new AsyncState);
        b->async->waits.assign(b->nthreads, FiberWait{});
        b->async->stores.resize(b->nthreads);
        b->async->committed.assign(b->nthreads, 0);
    }
    return *b->async;
}

static inline Block* async_block() {
    Block* b = tls_block;
    if (!b) throw PlainModeBarrier();
    return b;
}

// The source spells a barrier `(uint64_t*)&bars[i]`: its name is what follows the cast.
static inline const char* bar_name(const char* spelled) {
    const char* cast = "(uint64_t*)";
    return strncmp(spelled, cast, strlen(cast)) ? spelled : spelled + strlen(cast);
}

// Ends the block with `message`; the calling thread never resumes.
[[noreturn]] static void async_fail(Block* b, const std::string& message) {
    Fiber* f = b->current;
    if (b->error.empty()) {
        b->error = format("thread (%u,%u,%u) of block (%u,%u,%u): ", f->tid.x, f->tid.y,
                          f->tid.z, b->idx.x, b->idx.y, b->idx.z) +
                   message;
    }
    switch_away(b, f, false);
    abort();
}

// The barrier at `addr` of block `owner` (another CTA of the cluster when not `b`, whose
// thread fails when there is none).
static Mbar& bar_of(Block* owner, Block* b, uint64_t* addr, const char* name, int line,
                    const char* what) {
    for (Mbar& m : async_state(owner).bars)
        if (m.addr == addr) return m;
    if (owner != b) {
        async_fail(b, format("%s on mbarrier %s (line %d) of CTA %u of the cluster, which that "
                             "CTA has not initialised with mbarrier_init (fence_mbarrier_init "
                             "and cluster_sync after the init, before other CTAs use it)",
                             what, bar_name(name), line, owner->rank));
    }
    async_fail(b, format("%s on mbarrier %s (line %d), which this block has not initialised "
                         "with mbarrier_init",
                         what, bar_name(name), line));
}

static Mbar& bar_of(Block* b, uint64_t* addr, const char* name, int line, const char* what) {
    return bar_of(b, b, addr, name, line, what);
}

static void cluster_event(Block* b);  // emu_cluster.h: another CTA may now go on

static void complete_phase(Block* b, Mbar& m) {
    AsyncState& s = async_state(b);
    m.phases++;
    m.pending = m.expected;
    m.tx = 0;
    *m.addr = m.phases & 1;
    s.epoch++;
    for (unsigned i = 0; i < b->nthreads; i++) {
        Fiber& g = b->fibers[i];
        if (g.state == WAIT_MBAR && s.waits[i].bar == m.addr) push_runnable(b, &g);
    }
}

// Lands the queued copies of a phase that has all its arrivals, completing it when its
// transaction count reaches zero (`owner`'s barrier; `b` the block of the thread landing them).
MC_LENS_UNINSTRUMENTED static void settle(Block* owner, Block* b, Mbar& m, const char* name,
                                          int line) {
    if (m.pending || m.copies.empty()) return;
    long long landed = 0;
    for (const BulkCopy& c : m.copies) {
        if (c.tensor)
            tma_land(c.desc, c.coords, c.dst);
        else
            memcpy(c.dst, c.src, c.bytes);
        landed += c.bytes;
    }
    m.copies.clear();
    m.tx -= landed;
    if (m.tx < 0) {
        async_fail(b, format("mbarrier %s (line %d): bulk copies completed %lld bytes more than "
                             "mbarrier_arrive_expect_tx announced for its phase %llu (the phase "
                             "would complete before all its data landed)",
                             bar_name(name), line, -m.tx, m.phases));
    }
    if (m.tx == 0) complete_phase(owner, m);
}

MC_LENS_UNINSTRUMENTED static void settle(Block* b, Mbar& m, const char* name, int line) {
    settle(b, b, m, name, line);
}

static void mbar_init(uint64_t* addr, uint32_t count, const char* name, int line) {
    Block* b = async_block();
    if ((uintptr_t)addr % 8) {
        async_fail(b, format("mbarrier %s (line %d) at %p is not 8-byte aligned", bar_name(name),
                             line, (void*)addr));
    }
    if (count < 1 || count >= (1u << 20)) {
        async_fail(b, format("mbarrier_init of %s (line %d) with %u arrivals; the count is 1 to "
                             "2^20-1",
                             bar_name(name), line, count));
    }
    AsyncState& s = async_state(b);
    Mbar* m = nullptr;
    for (Mbar& o : s.bars)
        if (o.addr == addr) m = &o;
    if (!m) {
        s.bars.push_back(Mbar{});
        m = &s.bars.back();
    }
    m->addr = addr;
    m->expected = m->pending = count;
    m->tx = 0;
    m->phases = 0;
    m->copies.clear();
    *addr = 0;
    s.epoch++;
}

// An arrival of a thread of block `b` on the barrier at `addr` of block `owner` (b itself, or
// another CTA of its cluster).
static void mbar_arrive_on(Block* owner, Block* b, uint64_t* addr, long long tx, const char* name,
                           int line) {
    MC_LENS_COUNT(LENS_BARRIERS, 1);
    Mbar& m = bar_of(owner, b, addr, name, line, "an arrival");
    if (owner != b) cluster_event(b);
    if (m.pending == 0) settle(owner, b, m, name, line);  // the previous phase's copies first
    if (m.pending == 0) {
        std::string of = owner != b ? format(" of CTA %u of the cluster", owner->rank) : "";
        async_fail(b, format("mbarrier %s (line %d)%s: an arrival beyond its count of %u in "
                             "phase %llu, which still waits for %lld transaction bytes",
                             bar_name(name), line, of.c_str(), m.expected, m.phases, m.tx));
    }
    m.tx += tx;
    m.pending--;
    async_state(owner).epoch++;
    if (m.pending) return;
    if (m.tx == 0 && m.copies.empty()) {
        complete_phase(owner, m);
    } else if (m.waiters) {
        settle(owner, b, m, name, line);
    }
}

static void mbar_arrive(uint64_t* addr, long long tx, const char* name, int line) {
    Block* b = async_block();
    mbar_arrive_on(b, b, addr, tx, name, line);
}

MC_LENS_UNINSTRUMENTED static void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                             uint64_t* addr, const char* name, int line) {
    Block* b = async_block();
    if (((uintptr_t)dst | (uintptr_t)src) % 16 || bytes % 16 || !bytes) {
        async_fail(b, format("bulk_copy_g2s (line %d) of %u bytes from %p to %p: the size must "
                             "be a positive multiple of 16 and both addresses 16-byte aligned "
                             "(a GPU faults)",
                             line, bytes, src, dst));
    }
#ifdef MC_EMU_CHECKS
    check_range(src, bytes, 0);
    check_range(dst, bytes, 1);
#endif
    MC_LENS_COUNT(LENS_CP_ASYNC, 1);
    lens_bulk(0, [&](auto visit) { visit((uintptr_t)src, bytes); });
    Mbar& m = bar_of(b, addr, name, line, "a bulk copy completing");
    memset(dst, 0xff, bytes);  // until it lands: a read without the wait sees NaNs and -1s
    BulkCopy c{};
    c.dst = dst;
    c.src = src;
    c.bytes = bytes;
    m.copies.push_back(c);
    async_state(b).epoch++;
    if (m.pending == 0 && m.waiters) settle(b, m, name, line);
}

// The tensor map a kernel was given, checked; `what` names the primitive.
static const TmaDesc& tma_desc(Block* b, const void* map, const char* what, int line) {
    const TmaDesc& d = *(const TmaDesc*)map;
    if (d.magic != TMA_MAGIC || d.rank < 1 || d.rank > (uint32_t)TMA_MAX_RANK) {
        async_fail(b, format("%s (line %d): its tensor map was not encoded by minicomp's cuda-emu "
                             "launch",
                             what, line));
    }
    return d;
}

static void tma_aligned(Block* b, const TmaDesc& d, const void* smem, const char* what,
                        int line) {
    if ((uintptr_t)smem % tma_alignment(d)) {
        async_fail(b, format("%s (line %d): its shared box at %p is not %u-byte aligned (a GPU "
                             "faults)",
                             what, line, smem, tma_alignment(d)));
    }
}

// Queues copy `c` into `dst` of block `owner` (b's own, or another CTA's of the cluster), on its
// barrier at `addr`; its destination holds 0xff bytes until it lands.
static void tma_queue(Block* owner, Block* b, BulkCopy c, void* dst, uint64_t* addr,
                      const char* name, int line) {
    Mbar& m = bar_of(owner, b, addr, name, line, "a tensor copy completing");
    c.dst = dst;
    memset(dst, 0xff, c.bytes);
    m.copies.push_back(c);
    async_state(owner).epoch++;
    if (owner != b) cluster_event(b);
    if (m.pending == 0 && m.waiters) settle(owner, b, m, name, line);
}

static Block* cluster_cta(Block* b, unsigned r, const char* what, int line);  // emu_cluster.h
static void* map_shared(Block* b, const void* p, unsigned r);                // emu_cluster.h

// A tensor load; `multicast`: into every CTA of the cluster in `mask` (bit r: rank r), each at
// dst's and bar's offsets, the bytes read (and counted by the lens) once.
MC_LENS_UNINSTRUMENTED static void tma_load(void* dst, const void* map, uint64_t* addr,
                                            const char* name, int line,
                                            std::initializer_list<int32_t> coords,
                                            bool multicast = false, unsigned mask = 0) {
    Block* b = async_block();
    const TmaDesc& d = tma_desc(b, map, "tma_load", line);
    tma_aligned(b, d, dst, "tma_load", line);
    MC_LENS_COUNT(LENS_CP_ASYNC, 1);
    if (!multicast) bar_of(b, addr, name, line, "a tensor copy completing");
    BulkCopy c{};
    c.bytes = tma_box_bytes(d);
    c.tensor = true;
    c.desc = d;
    int k = 0;
    for (int32_t x : coords) c.coords[k++] = x;
    lens_bulk(0, [&](auto visit) {
        tma_each(d, c.coords, dst, [&](unsigned, const char* g) {
            if (g) visit((uintptr_t)g, d.elem_bytes);
        });
    });
    if (!multicast) {
        tma_queue(b, b, c, dst, addr, name, line);
        return;
    }
    if (!(mask & 0xffff)) {
        async_fail(b, format("tma_load (line %d) with the multicast mask %#x, which names no CTA",
                             line, mask));
    }
    for (unsigned r = 0; r < 16; r++) {
        if (!(mask >> r & 1)) continue;
        Block* owner = cluster_cta(b, r, "tma_load's multicast", line);
        tma_queue(owner, b, c, map_shared(b, dst, r), (uint64_t*)map_shared(b, addr, r), name,
                  line);
    }
}

MC_LENS_UNINSTRUMENTED static void tma_store(const void* map, const void* src, int line,
                                             std::initializer_list<int32_t> coords) {
    Block* b = async_block();
    const TmaDesc& d = tma_desc(b, map, "tma_store", line);
    tma_aligned(b, d, src, "tma_store", line);
    MC_LENS_COUNT(LENS_CP_ASYNC, 1);
    AsyncState& s = async_state(b);
    unsigned me = b->current->linear;
    TmaStore st{};
    st.desc = d;
    int k = 0;
    for (int32_t x : coords) st.coords[k++] = x;
    lens_bulk(1, [&](auto visit) {
        tma_each(d, st.coords, src, [&](unsigned, const char* g) {
            if (g) visit((uintptr_t)g, d.elem_bytes);
        });
    });
    st.src = src;
    uint32_t span = d.swizzle ? d.swizzle : 1;
    uint32_t bytes = (tma_box_bytes(d) + span - 1) / span * span;
    st.snapshot.assign((const unsigned char*)src, (const unsigned char*)src + bytes);
    st.group = s.committed[me];
    st.line = line;
    s.stores[me].push_back(std::move(st));
}

// Refuse a store whose shared source changed since its issue; `when` names the wait.
static void tma_check_source(Block* b, TmaStore& st, const char* when) {
    if (st.read) return;
    if (memcmp(st.src, st.snapshot.data(), st.snapshot.size())) {
        async_fail(b, format("the shared source of tma_store (line %d) was overwritten before %s "
                             "waited for the store to read it (bulk_commit_group, then "
                             "bulk_wait_group_read, before writing it again)",
                             st.line, when));
    }
    st.read = true;
}

static void bulk_commit() {
    Block* b = async_block();
    async_state(b).committed[b->current->linear]++;
}

// Completes (`read`: only checks the sources of) this thread's stores in committed groups
// older than its `n` most recent ones; `n` < 0: every store, committed or not.
static void bulk_wait(int n, bool read, const char* when) {
    Block* b = async_block();
    AsyncState& s = async_state(b);
    unsigned me = b->current->linear;
    std::vector<TmaStore>& stores = s.stores[me];
    unsigned long long done = n < 0 ? ~0ull
                              : s.committed[me] > (unsigned long long)n ? s.committed[me] - n
                                                                        : 0;
    size_t kept = 0;
    for (size_t i = 0; i < stores.size(); i++) {
        TmaStore& st = stores[i];
        if (st.group < done || n < 0) {
            tma_check_source(b, st, when);
            if (!read) {
                tma_write(st.desc, st.coords, st.src, st.snapshot.data());
                continue;
            }
        }
        if (kept != i) stores[kept] = std::move(st);
        kept++;
    }
    stores.resize(kept);
}

// A thread ending completes its stores (a GPU finishes them before the block's memory goes).
static void async_thread_exit(Block* b) {
    if (!b->async || b->async->stores[b->current->linear].empty()) return;
    bulk_wait(-1, false, "the thread's end");
}

static inline bool phase_done(const Mbar& m, uint32_t parity) {
    return (m.phases & 1) != (parity & 1);
}

// Every thread of the block is done, blocked, or has spun on try_wait since the last change.
static bool all_stuck(Block* b) {
    AsyncState& s = async_state(b);
    for (unsigned i = 0; i < b->nthreads; i++) {
        Fiber& g = b->fibers[i];
        const FiberWait& w = s.waits[i];
        bool spinning = g.state == RUNNABLE && w.epoch == s.epoch && w.spins >= 2;
        if (g.state == RUNNABLE && !spinning) return false;
    }
    return true;
}

static std::string describe_deadlock(Block* b);

static bool mbar_try_wait(uint64_t* addr, uint32_t parity, const char* name, int line) {
    Block* b = async_block();
    Mbar* m = &bar_of(b, addr, name, line, "a wait");
    if (phase_done(*m, parity)) return true;
    settle(b, *m, name, line);
    if (phase_done(*m, parity)) return true;
    // Not yet: let the other threads run, unless none can change anything any more.
    AsyncState& s = async_state(b);
    Fiber* f = b->current;
    FiberWait& w = s.waits[f->linear];
    if (w.epoch != s.epoch || w.bar != addr) w.spins = 0;
    w = FiberWait{addr, name, parity, line, w.spins + 1, s.epoch};
    if (w.spins >= 2 && all_stuck(b)) {
        if (b->cl) {  // the other CTAs of the cluster may change something: their turn
            if (!cluster_yield(b)) {
                b->error = CLUSTER_STOPPED;
                switch_away(b, f, false);  // to the scheduler; never resumed
                abort();
            }
        } else {
            b->error = describe_deadlock(b);
            switch_away(b, f, false);  // to the scheduler; never resumed
            abort();
        }
    }
    push_runnable(b, f);
    switch_away(b, f, false);
    return false;
}

static void mbar_wait(uint64_t* addr, uint32_t parity, const char* name, int line) {
    Block* b = async_block();
    for (;;) {
        Mbar* m = &bar_of(b, addr, name, line, "a wait");
        if (phase_done(*m, parity)) return;
        settle(b, *m, name, line);
        if (phase_done(*m, parity)) return;
        Fiber* f = b->current;
        AsyncState& s = async_state(b);
        s.waits[f->linear] = FiberWait{addr, name, parity, line, 0, 0};
        m->waiters++;
        f->state = WAIT_MBAR;
        f->site = line;
        switch_away(b, f, false);
        bar_of(b, addr, name, line, "a wait").waiters--;
    }
}

// "N threads wait on mbarrier X (line L) for parity P: ..." for each barrier waited on, or "".
static std::string describe_async_waits(Block* b) {
    if (!b->async) return "";
    AsyncState& s = *b->async;
    std::string out;
    for (const Mbar& m : s.bars) {
        unsigned blocked = 0, spinning = 0;
        const FiberWait* seen = nullptr;
        for (unsigned i = 0; i < b->nthreads; i++) {
            const FiberWait& w = s.waits[i];
            if (w.bar != m.addr) continue;
            if (b->fibers[i].state == WAIT_MBAR) {
                blocked++;
            } else if (b->fibers[i].state == RUNNABLE && w.epoch == s.epoch && w.spins) {
                spinning++;
            } else {
                continue;
            }
            seen = &w;
        }
        if (!seen) continue;
        if (!out.empty()) out += "; ";
        out += format("%u %s mbarrier %s (line %d) for the phase of parity %u, but its "
                      "phase %llu (parity %llu) still needs %u of %u arrivals and %lld "
                      "transaction bytes (%zu bulk copies issued)",
                      blocked + spinning,
                      blocked ? "threads wait on" : "threads spin on try_wait of",
                      bar_name(seen->name), seen->line, seen->parity, m.phases, m.phases & 1,
                      m.pending, m.expected, m.tx > 0 ? m.tx : 0, m.copies.size());
    }
    return out;
}

}  // namespace mc_emu

#define mc_mbarrier_init(bar, count) ::mc_emu::mbar_init(bar, count, #bar, __LINE__)
#define mc_mbarrier_arrive(bar) ::mc_emu::mbar_arrive(bar, 0, #bar, __LINE__)
#define mc_mbarrier_arrive_expect_tx(bar, bytes) \
    ::mc_emu::mbar_arrive(bar, (long long)(bytes), #bar, __LINE__)
#define mc_mbarrier_try_wait_parity(bar, parity) \
    ::mc_emu::mbar_try_wait(bar, parity, #bar, __LINE__)
#define mc_mbarrier_wait(bar, parity) ::mc_emu::mbar_wait(bar, parity, #bar, __LINE__)
#define mc_fence_proxy_async() ((void)0)
#define mc_bulk_copy_g2s(dst, src, bytes, bar) \
    ::mc_emu::bulk_copy(dst, src, bytes, bar, #bar, __LINE__)
#define MC_EMU_TMA_LOAD(dst, map, bar, ...) \
    ::mc_emu::tma_load(dst, map, bar, #bar, __LINE__, {__VA_ARGS__})
#define mc_tma_load_1d MC_EMU_TMA_LOAD
#define mc_tma_load_2d MC_EMU_TMA_LOAD
#define mc_tma_load_3d MC_EMU_TMA_LOAD
#define mc_tma_load_4d MC_EMU_TMA_LOAD
#define mc_tma_load_5d MC_EMU_TMA_LOAD
#define MC_EMU_TMA_STORE(map, src, ...) ::mc_emu::tma_store(map, src, __LINE__, {__VA_ARGS__})
#define mc_tma_store_1d MC_EMU_TMA_STORE
#define mc_tma_store_2d MC_EMU_TMA_STORE
#define mc_tma_store_3d MC_EMU_TMA_STORE
#define mc_tma_store_4d MC_EMU_TMA_STORE
#define mc_tma_store_5d MC_EMU_TMA_STORE
#define mc_bulk_commit_group() ::mc_emu::bulk_commit()
template <int N>
static inline void mc_bulk_wait_group() {
    ::mc_emu::bulk_wait(N, false, "bulk_wait_group");
}
template <int N>
static inline void mc_bulk_wait_group_read() {
    ::mc_emu::bulk_wait(N, true, "bulk_wait_group_read");
}

#endif  // MC_EMU_ASYNC_H
