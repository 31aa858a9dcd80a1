// minicomp cuda-emu: warpgroup-wide setmaxnreg (cluster.h's names, on the host).
//
// emu.h includes this text after emu_async.h. setmaxnreg changes no result in the emulator, but
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
    std::vector<GroupWait> groups;  // by warpgroup
};

static ClusterBlock& cluster_block(Block* b) {
    if (!b->cluster) {
        b->cluster.reset(new ClusterBlock);
        b->cluster->groups.assign((b->nthreads + WARPGROUP - 1) / WARPGROUP, GroupWait{});
    }
    return *b->cluster;
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
// waiting, or "".
static std::string describe_cluster_waits(Block* b) {
    if (!b->cluster) return "";
    std::string out;
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

#define mc_setmaxnreg_inc(N) ::mc_emu::setmaxnreg(N, true, __LINE__)
#define mc_setmaxnreg_dec(N) ::mc_emu::setmaxnreg(N, false, __LINE__)

#endif  // MC_EMU_CLUSTER_H
