// minicomp cuda-emu: clusters, distributed shared memory and setmaxnreg (cluster.h's names, on
// the host).
//
// emu.h includes this text after emu_async.h. The CTAs of a cluster take turns on their OS
// threads (emu.h's struct Cluster): while one runs, the others wait, so it may act on their
// barriers and shared memory directly. A shared address maps to another CTA's (mapa) at the
// same offset: into its dynamic shared memory, or its copy of the kernel library's
// thread-local block, where the static `__shared__` arrays live. A remote mbarrier arrival,
// or a multicast TMA load (queued on each CTA's barrier at the same offset and landing as
// late as emu_async.h lands any copy), then works as on the owner's own barrier. A CTA that
// has exited, or has not initialised the barrier, is an error naming it; a cluster whose CTAs
// all wait with nothing left to change is a deadlock listing each CTA's waits. The cluster
// barrier (cluster_arrive, cluster_wait) expects every thread of every CTA of the cluster;
// without a cluster it is a barrier of the block's threads.
//
// setmaxnreg changes no result in the emulator, but
// PTX requires every thread of the warpgroup to execute the same one together (.sync.aligned):
// each thread waits there until its warpgroup's 128 threads have all arrived, and threads of
// one warpgroup at different setmaxnreg calls are an error naming both lines. A warpgroup
// some of whose warps never arrive is reported as a deadlock (describe_cluster_waits), a block
// whose last warpgroup is partial as an error.
#ifndef MC_EMU_CLUSTER_H
#define MC_EMU_CLUSTER_H

namespace mc_emu {

static const unsigned WARPGROUP = 128;

// The setmaxnreg a warpgroup's threads are gathering at.
struct GroupWait {
    unsigned arrived;
    int line;
    unsigned n;
    bool inc;
};

struct ClusterBlock {
    std::vector<GroupWait> groups;       // by warpgroup
    std::vector<long long> arrived_at;   // by thread: the cluster barrier phase it arrived in
    ClusterBarrier barrier;              // the cluster barrier when there is no cluster
    int wait_line;                       // of the last cluster_wait
};

static ClusterBlock& cluster_block(Block* b) {
    if (!b->cluster) {
        b->cluster.reset(new ClusterBlock{});
        b->cluster->groups.assign((b->nthreads + WARPGROUP - 1) / WARPGROUP, GroupWait{});
        b->cluster->arrived_at.assign(b->nthreads, -1);
        b->cluster->barrier.expected = b->nthreads;
    }
    return *b->cluster;
}

// ---- the cluster: ranks, other CTAs, their shared memory ----

// Something a thread of `b` did may let another CTA of its cluster go on.
static void cluster_event(Block* b) {
    if (b->cl) b->cl->epoch++;
}

static int32_t cluster_ctarank() {
    Block* b = async_block();
    return b->cl ? (int32_t)b->rank : 0;
}

static int32_t cluster_nctarank() {
    Block* b = async_block();
    return b->cl ? (int32_t)b->cl->size : 1;
}

// CTA `r` of b's cluster, running; else the calling thread fails naming `what`.
static Block* cluster_cta(Block* b, unsigned r, const char* what, int line) {
    Cluster* c = b->cl;
    unsigned size = c ? c->size : 1;
    if (r >= size) {
        async_fail(b, format("%s (line %d) names CTA %u of a cluster of %u CTAs%s", what, line,
                             r, size, c ? "" : " (the kernel sets no attrs.cluster_dim)"));
    }
    if (!c) return b;
    if (c->finished[r] || !c->blocks[r]) {
        async_fail(b, format("%s (line %d) reaches CTA %u of the cluster, which has exited (a "
                             "CTA must not end while others may still use its shared memory "
                             "or barriers: cluster_sync before the end)",
                             what, line, r));
    }
    return c->blocks[r];
}

// The address in CTA `r` of b's cluster at shared address `p`'s offset (mapa).
static void* map_shared(Block* b, const void* p, unsigned r) {
    Cluster* c = b->cl;
    if (!c || r == b->rank) return (void*)p;
    const unsigned char* mine = c->smem[b->rank];
    if (mine && p >= mine && (const unsigned char*)p < mine + c->smem_bytes) {
        return c->smem[r] + ((const unsigned char*)p - mine);
    }
    return (void*)(c->tls[r] + ((const char*)p - c->tls[b->rank]));
}

static void mbar_arrive_cluster(uint64_t* addr, uint32_t cta, const char* name, int line) {
    Block* b = async_block();
    Block* owner = cluster_cta(b, cta, "mbarrier_arrive_cluster", line);
    mbar_arrive_on(owner, b, (uint64_t*)map_shared(b, addr, cta), 0, name, line);
}

// Element `p` of CTA `cta`'s shared memory (ld/st.shared::cluster).
template <class T>
static T cluster_load(const T* p, uint32_t cta, int line) {
    Block* b = async_block();
    cluster_cta(b, cta, "cluster_load", line);
    T v;
    memcpy(&v, map_shared(b, p, cta), sizeof v);
    return v;
}

template <class T>
static void cluster_store(T* p, uint32_t cta, T value, int line) {
    Block* b = async_block();
    cluster_cta(b, cta, "cluster_store", line);
    memcpy(map_shared(b, p, cta), &value, sizeof value);
    cluster_event(b);
}

// ---- the cluster barrier ----

static ClusterBarrier& cluster_barrier(Block* b) {
    return b->cl ? b->cl->barrier : cluster_block(b).barrier;
}

static void wake_cluster_waiters(Block* b) {
    for (unsigned i = 0; i < b->nthreads; i++) {
        if (b->fibers[i].state == WAIT_CLUSTER) push_runnable(b, &b->fibers[i]);
    }
}

static void cluster_arrive(int line) {
    Block* b = async_block();
    Fiber* f = b->current;
    ClusterBlock& cb = cluster_block(b);
    if (cb.arrived_at[f->linear] >= 0) {
        async_fail(b, format("cluster_arrive (line %d) a second time without a cluster_wait "
                             "between",
                             line));
    }
    ClusterBarrier& bar = cluster_barrier(b);
    cb.arrived_at[f->linear] = (long long)bar.phase;
    MC_LENS_COUNT(LENS_BARRIERS, 1);
    cluster_event(b);
    if (++bar.arrived < bar.expected) return;
    bar.arrived = 0;
    bar.phase++;
    if (!b->cl) {
        wake_cluster_waiters(b);
        return;
    }
    for (unsigned r = 0; r < b->cl->size; r++) {
        if (b->cl->blocks[r]) wake_cluster_waiters(b->cl->blocks[r]);
    }
}

static void cluster_wait(int line) {
    Block* b = async_block();
    Fiber* f = b->current;
    ClusterBlock& cb = cluster_block(b);
    long long at = cb.arrived_at[f->linear];
    if (at < 0) {
        async_fail(b, format("cluster_wait (line %d) without a cluster_arrive before it", line));
    }
    while (cluster_barrier(b).phase == (unsigned long long)at) {
        f->state = WAIT_CLUSTER;
        f->site = line;
        cb.wait_line = line;
        switch_away(b, f, false);
    }
    cb.arrived_at[f->linear] = -1;
}

static const char* setmaxnreg_name(bool inc) { return inc ? "setmaxnreg_inc" : "setmaxnreg_dec"; }

static void setmaxnreg(unsigned n, bool inc, int line) {
    Block* b = async_block();
    Fiber* f = b->current;
    unsigned g = f->linear / WARPGROUP, first = g * WARPGROUP;
    if (b->nthreads - first < WARPGROUP) {
        async_fail(b, format("%s(%u) (line %d) in a block of %u threads: warpgroup %u has only "
                             "%u threads, and setmaxnreg needs all 128 of a warpgroup",
                             setmaxnreg_name(inc), n, line, b->nthreads, g,
                             b->nthreads - first));
    }
    GroupWait& w = cluster_block(b).groups[g];
    if (w.arrived == 0) {
        w = GroupWait{0, line, n, inc};
    } else if (w.line != line || w.n != n || w.inc != inc) {
        async_fail(b, format("threads of warpgroup %u execute different setmaxnreg calls "
                             "together, %s(%u) at line %d and %s(%u) at line %d: all 128 "
                             "threads of a warpgroup execute the same one (.sync.aligned)",
                             g, setmaxnreg_name(w.inc), w.n, w.line, setmaxnreg_name(inc), n,
                             line));
    }
    if (++w.arrived < WARPGROUP) {
        f->state = WAIT_GROUP;
        f->site = line;
        switch_away(b, f, false);
        return;
    }
    w.arrived = 0;
    for (unsigned i = first; i < first + WARPGROUP; i++) {
        if (b->fibers[i].state == WAIT_GROUP) push_runnable(b, &b->fibers[i]);
    }
}

// "K of 128 threads of warpgroup G wait at setmaxnreg_dec (line L)" for each warpgroup
// waiting, and the threads waiting at the cluster barrier; or "".
static std::string describe_cluster_waits(Block* b) {
    if (!b->cluster) return "";
    std::string out;
    unsigned at_cluster = 0;
    for (unsigned i = 0; i < b->nthreads; i++) at_cluster += b->fibers[i].state == WAIT_CLUSTER;
    if (at_cluster) {
        const ClusterBarrier& bar = cluster_barrier(b);
        out += format("%u threads wait at cluster_wait (line %d), the cluster barrier having %u "
                      "of its %u arrivals",
                      at_cluster, b->cluster->wait_line, bar.arrived, bar.expected);
    }
    const std::vector<GroupWait>& groups = b->cluster->groups;
    for (unsigned g = 0; g < groups.size(); g++) {
        const GroupWait& w = groups[g];
        if (!w.arrived) continue;
        if (!out.empty()) out += "; ";
        out += format("%u of %u threads of warpgroup %u wait at %s (line %d)", w.arrived,
                      WARPGROUP, g, setmaxnreg_name(w.inc), w.line);
    }
    return out;
}

}  // namespace mc_emu

#define mc_cluster_ctarank() ::mc_emu::cluster_ctarank()
#define mc_cluster_nctarank() ::mc_emu::cluster_nctarank()
#define mc_cluster_arrive() ::mc_emu::cluster_arrive(__LINE__)
#define mc_cluster_wait() ::mc_emu::cluster_wait(__LINE__)
#define mc_cluster_sync()                    \
    do {                                     \
        ::mc_emu::cluster_arrive(__LINE__);  \
        ::mc_emu::cluster_wait(__LINE__);    \
    } while (0)
#define mc_fence_mbarrier_init() ((void)0)
#define mc_cluster_load(p, cta) ::mc_emu::cluster_load(p, cta, __LINE__)
#define mc_cluster_store(p, cta, value) ::mc_emu::cluster_store(p, cta, value, __LINE__)
#define mc_mbarrier_arrive_cluster(bar, cta) \
    ::mc_emu::mbar_arrive_cluster(bar, cta, #bar, __LINE__)
#define MC_EMU_TMA_LOAD_MULTICAST(dst, map, bar, mask, ...) \
    ::mc_emu::tma_load(dst, map, bar, #bar, __LINE__, {__VA_ARGS__}, true, mask)
#define mc_tma_load_multicast_1d MC_EMU_TMA_LOAD_MULTICAST
#define mc_tma_load_multicast_2d MC_EMU_TMA_LOAD_MULTICAST
#define mc_tma_load_multicast_3d MC_EMU_TMA_LOAD_MULTICAST
#define mc_tma_load_multicast_4d MC_EMU_TMA_LOAD_MULTICAST
#define mc_tma_load_multicast_5d MC_EMU_TMA_LOAD_MULTICAST
#define mc_setmaxnreg_inc(N) ::mc_emu::setmaxnreg(N, true, __LINE__)
#define mc_setmaxnreg_dec(N) ::mc_emu::setmaxnreg(N, false, __LINE__)

#endif  // MC_EMU_CLUSTER_H
