// minicomp cuda-emu runtime: the CUDA names our generated kernels use, implemented on the host.
//
// The generated CUDA source is compiled unchanged by the host C++ compiler after this header.
// Each CUDA block runs on one OS thread; each CUDA thread of a block is a fiber of that OS
// thread when the kernel has barriers or warp collectives, or one iteration of a plain loop
// when it has none. Because a block never leaves its OS thread, `__shared__` is a function-local
// `static thread_local` variable: one copy per OS thread, so one per block running at a time.
// The dynamic shared memory (device.h's `mc_dynamic_smem`) is likewise a buffer of the OS
// thread, of the launch's size, reached through a thread-local pointer. Device printf is the
// host's; a launch flushes stdout before it returns, as a CUDA synchronisation shows the output.
//
// A kernel with a cluster (`__cluster_dims__`) runs each cluster's CTAs together, each block on
// an OS thread of its own (so each has its own `__shared__`), taking turns: one CTA runs until
// none of its threads can go on, then hands the turn to the next (struct Cluster), so that a
// CTA may touch another's shared memory and mbarriers (emu_cluster.h) as the owner would.
//
// The fiber switch is a small x86-64 routine (callee-saved registers and stack pointer); other architectures, and builds with MC_EMU_UCONTEXT defined, use
// swapcontext, which costs a signal-mask system call per switch.
#ifndef MC_EMU_H
#define MC_EMU_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if !defined(__x86_64__) && !defined(MC_EMU_UCONTEXT)
#define MC_EMU_UCONTEXT 1
#endif
#ifdef MC_EMU_UCONTEXT
#include <ucontext.h>
#endif
#include <pthread.h>
#include <sys/mman.h>

// A checked or counted build's kernel-address instrumentation defines __SANITIZE_ADDRESS__ too.
#if defined(MC_EMU_CHECKS) || defined(MC_EMU_LENS)
#elif defined(__SANITIZE_ADDRESS__)
#define MC_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MC_EMU_ASAN 1
#endif
#endif
#ifdef MC_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// The emulator's state (what a thread is, the block it runs, the launch it works for) lives in its
// runtime library, built once per compiler and flags with MC_EMU_RUNTIME defined: it runs
// launches. A kernel library refers to that state, and compiles only its kernels and what they
// call (barriers, shuffles, copies), not the launch machinery, which made up most of its build.
// `__thread`, not `thread_local`: a variable of another library is then reached without a call
// to an initialization wrapper.
#ifdef MC_EMU_RUNTIME
#define MC_EMU_SHARED
#else
#define MC_EMU_SHARED extern
#endif

// ---- qualifiers ----

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static thread_local
#define __constant__ static

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;
static const int warpSize = 32;

namespace mc_emu {

// WAIT_GROUP: at a warpgroup-wide instruction (setmaxnreg); WAIT_CLUSTER: at a cluster barrier.
enum State : int { RUNNABLE, WAIT_BLOCK, WAIT_WARP, WAIT_MBAR, WAIT_GROUP, WAIT_CLUSTER, DONE };

struct Block;
struct AsyncState;  // emu_async.h
struct WgmmaState;  // emu_wgmma.h
struct ClusterBlock;  // emu_cluster.h

struct Fiber {
    uint3 tid;
    unsigned linear;
    State state;
    int site;  // the source line of the __syncthreads() it waits at
    Block* block;
    char* stack;
#ifdef MC_EMU_UCONTEXT
    ucontext_t ctx;
#else
    void* sp;
#endif
#ifdef MC_EMU_ASAN
    void* fake_stack;
#endif
};

struct Warp {
    unsigned active;   // lanes that exist (threads of the block in this warp)
    unsigned arrived;  // lanes waiting at the current warp barrier
    unsigned gen;      // completed warp barriers; its low bit picks the exchange buffer
    uint64_t slots[2][32];
};

typedef void (*Body)(void** args);

struct Block {
    const char* kernel;
    Body body;
    void** args;
    uint3 dim;
    uint3 idx;
    unsigned nthreads;
    unsigned done;
    unsigned arrived;  // threads waiting at the block barrier
    size_t stack_bytes;
    Fiber* fibers;
    Warp* warps;
    Fiber* current;
    Fiber** queue;  // runnable fibers, a ring of nthreads entries
    size_t qhead, qtail;
    std::string error;
    std::unique_ptr<AsyncState> async;  // its mbarriers and bulk copies, once it uses one
    WgmmaState* wgmma;  // its threads' wgmma queues, once one issues (freed by wgmma_finish)
    std::unique_ptr<ClusterBlock> cluster;  // its warpgroup and cluster barriers, once used
    struct Cluster* cl;  // its cluster, when the launch has one of more than one CTA
    unsigned rank;       // its rank in that cluster
#ifdef MC_EMU_UCONTEXT
    ucontext_t sched;
#else
    void* sched_sp;
#endif
#ifdef MC_EMU_ASAN
    const void* sched_stack_bottom;
    size_t sched_stack_size;
#endif
};

// What the CUDA builtins read: set before a thread runs, by the plain loop or the scheduler.
MC_EMU_SHARED __thread uint3 tls_thread_idx;
MC_EMU_SHARED __thread uint3 tls_block_idx;
MC_EMU_SHARED __thread uint3 tls_block_dim;
MC_EMU_SHARED __thread uint3 tls_grid_dim;
MC_EMU_SHARED __thread Block* tls_block;  // null in plain (fiberless) mode
// The first misaligned vector access of the block running on this OS thread (a GPU faults).
MC_EMU_SHARED __thread const void* tls_misaligned;
MC_EMU_SHARED __thread unsigned tls_misaligned_bytes;
// The dynamic shared memory of the block running on this OS thread (null when a launch has none).
MC_EMU_SHARED __thread unsigned char* tls_dynamic_smem;
// The most dynamic shared memory a block may have: an H100's opt-in limit, 227 KiB.
static const unsigned long long MAX_DYNAMIC_SHARED = 227ull * 1024;

// Thrown only in plain mode, where the kernel runs on the worker's own stack.
struct PlainModeBarrier {};

static const unsigned MAX_CLUSTER = 8;  // CUDA's portable cluster size

// A cluster barrier (barrier.cluster): its completed phases, the arrivals of the current one.
struct ClusterBarrier {
    unsigned long long phase;
    unsigned arrived;
    unsigned expected;
};

// The CTAs of one cluster, each on its OS thread. Only the CTA holding the turn runs, so it
// may change another's barriers and wake its fibers; the mutex hands the turn over. `epoch`
// counts what one CTA does to the others (arrivals, copies, the cluster barrier): when every
// CTA that has not finished found nothing to run since the same epoch, the cluster is
// deadlocked, and `error` says how.
struct Cluster {
    unsigned size = 1;
    std::mutex mutex;
    std::condition_variable cv;
    unsigned registered = 0;  // CTAs that have started (or failed before starting)
    unsigned turn = 0;
    Block* blocks[MAX_CLUSTER] = {};          // each running CTA's block
    const char* tls[MAX_CLUSTER] = {};        // its library thread-local block: static shared
    unsigned char* smem[MAX_CLUSTER] = {};    // its dynamic shared memory
    size_t smem_bytes = 0;
    bool entered[MAX_CLUSTER] = {};
    bool finished[MAX_CLUSTER] = {};
    bool stuck[MAX_CLUSTER] = {};
    unsigned long long stuck_at[MAX_CLUSTER] = {};
    unsigned long long epoch = 0;
    bool failed = false;  // a CTA failed or the cluster deadlocked: every CTA stops
    std::string error;    // the deadlock
    ClusterBarrier barrier{};
};

// What a CTA reports when it stopped because another CTA of its cluster failed.
static const char* const CLUSTER_STOPPED = "stopped: another CTA of its cluster failed";

}  // namespace mc_emu

// Counted launches (emu_lens.h; emu.py puts its text here).
#include "emu_lens.h"

namespace mc_emu {

static std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// ---- the context switch ----

#ifndef MC_EMU_UCONTEXT
// mc_emu_switch(void** save_sp, void* load_sp): pushes the callee-saved registers on the
// current stack, stores the stack pointer in *save_sp, loads load_sp and pops the registers
// saved there. The SSE and x87 control words are left alone: every fiber of an OS thread shares
// them (kernels never change rounding modes), and ldmxcsr/fldcw made up most of a switch's cost.
// mc_emu_fiber_entry is where a new fiber's first switch "returns" to: it calls r13(r12).
extern "C" void mc_emu_switch(void** save_sp, void* load_sp);
extern "C" void mc_emu_fiber_entry();
__asm__(
    ".text\n"
    ".p2align 4\n"
    ".local mc_emu_switch\n"
    ".type mc_emu_switch, @function\n"
    "mc_emu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size mc_emu_switch, .-mc_emu_switch\n"
    ".p2align 4\n"
    ".local mc_emu_fiber_entry\n"
    ".type mc_emu_fiber_entry, @function\n"
    "mc_emu_fiber_entry:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size mc_emu_fiber_entry, .-mc_emu_fiber_entry\n");
#endif

// Waiting fibers hand control straight to the next runnable one (a FIFO of the block); only
// when none is runnable does control go back to the scheduler, which then finds the block
// finished or deadlocked.
static inline void push_runnable(Block* b, Fiber* f) {
    f->state = RUNNABLE;
    b->queue[b->qtail++ % b->nthreads] = f;
}

static inline void* stack_of(Block* b, Fiber* to, size_t* size) {
#ifdef MC_EMU_ASAN
    if (!to) {
        *size = b->sched_stack_size;
        return (void*)b->sched_stack_bottom;
    }
#endif
    *size = b->stack_bytes;
    return to ? to->stack : nullptr;
}

// Leaves fiber `from` (a dead one when `exiting`) for the next runnable fiber or the scheduler;
// returns when `from` is resumed.
static void switch_away(Block* b, Fiber* from, bool exiting) {
    Fiber* to = b->qhead != b->qtail && b->error.empty() ? b->queue[b->qhead++ % b->nthreads]
                                                          : nullptr;
    if (to == from) return;  // it was released again before it left
    b->current = to;
    if (to) tls_thread_idx = to->tid;
#ifdef MC_EMU_ASAN
    size_t size;
    void* bottom = stack_of(b, to, &size);
    __sanitizer_start_switch_fiber(exiting ? nullptr : &from->fake_stack, bottom, size);
#else
    (void)exiting;
#endif
#ifdef MC_EMU_UCONTEXT
    swapcontext(&from->ctx, to ? &to->ctx : &b->sched);
#else
    mc_emu_switch(&from->sp, to ? to->sp : b->sched_sp);
#endif
#ifdef MC_EMU_ASAN
    __sanitizer_finish_switch_fiber(from->fake_stack, nullptr, nullptr);
#endif
}

// Scheduler -> the first runnable fiber; returns when no fiber is runnable any more.
static void run_queue(Block* b) {
    if (b->qhead == b->qtail) return;
    Fiber* to = b->queue[b->qhead++ % b->nthreads];
    b->current = to;
    tls_thread_idx = to->tid;
#ifdef MC_EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, to->stack, b->stack_bytes);
#endif
#ifdef MC_EMU_UCONTEXT
    swapcontext(&b->sched, &to->ctx);
#else
    mc_emu_switch(&b->sched_sp, to->sp);
#endif
#ifdef MC_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

#ifdef MC_EMU_RUNTIME
static void async_thread_exit(Block* b);  // emu_async.h

static void fiber_main(Fiber* f) {
    Block* b = f->block;
#ifdef MC_EMU_ASAN
    f->fake_stack = nullptr;
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    b->body(b->args);
    if (b->async) async_thread_exit(b);  // emu_async.h: its TMA stores complete
    f->state = DONE;
    b->done++;
    switch_away(b, f, true);  // never resumed
    abort();
}

#ifdef MC_EMU_UCONTEXT
static void fiber_trampoline(unsigned lo, unsigned hi) {
    fiber_main((Fiber*)(uintptr_t)(((uint64_t)hi << 32) | lo));
}
#endif

static const uint64_t STACK_CANARY = 0x6d635f656d755f53ull;

// Stack tops a multiple of 64 KiB apart all map to the same cache sets; staggering them by a
// few cache lines per fiber made a 1024-thread barrier several times faster.
static size_t stack_usable(Block* b, Fiber* f) {
    size_t span = b->stack_bytes / 4 < 16384 ? b->stack_bytes / 4 : 16384;
    return b->stack_bytes - (span >= 64 ? (f->linear * 17 * 64) % span : 0);
}

static void start_fiber(Block* b, Fiber* f) {
    *(uint64_t*)f->stack = STACK_CANARY;
#ifdef MC_EMU_UCONTEXT
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = stack_usable(b, f);
    f->ctx.uc_link = nullptr;
    // makecontext passes int arguments: split the pointer in two halves.
    uint64_t p = (uint64_t)(uintptr_t)f;
    makecontext(&f->ctx, (void (*)())fiber_trampoline, 2, (unsigned)(p & 0xffffffffu),
                (unsigned)(p >> 32));
#else
    // The frame mc_emu_switch pops: r15, r14, r13, r12, rbx, rbp, return address; the entry
    // then starts with a 16-byte aligned stack pointer, as its call needs.
    uintptr_t top = ((uintptr_t)f->stack + stack_usable(b, f)) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)(top - 72);
    sp[0] = 0;                       // r15
    sp[1] = 0;                       // r14
    sp[2] = (uint64_t)&fiber_main;   // r13: what the entry calls
    sp[3] = (uint64_t)f;             // r12: its argument
    sp[4] = 0;                       // rbx
    sp[5] = 0;                       // rbp
    sp[6] = (uint64_t)&mc_emu_fiber_entry;
    f->sp = sp;
#endif
}
#endif  // MC_EMU_RUNTIME

// ---- clusters: taking turns ----

static std::string describe_deadlock(Block* b);

// Gives the turn to the next CTA after `r` that has not finished (the mutex held).
static void cluster_pass_turn(Cluster* c, unsigned r) {
    for (unsigned k = 1; k <= c->size; k++) {
        unsigned n = (r + k) % c->size;
        if (!c->finished[n]) {
            c->turn = n;
            break;
        }
    }
    c->cv.notify_all();
}

// The deadlock of a whole cluster: what each CTA still running waits for.
static std::string describe_cluster_deadlock(Cluster* c) {
    std::string s = format("deadlock of a cluster of %u CTAs:", c->size);
    for (unsigned r = 0; r < c->size; r++) {
        if (c->finished[r]) {
            s += format(" CTA %u has exited;", r);
        } else if (c->blocks[r]) {
            s += format(" CTA %u: %s;", r, describe_deadlock(c->blocks[r]).c_str());
        }
    }
    s.pop_back();
    return s;
}

// Called by the CTA holding the turn when none of its threads can go on: hands the turn to the
// next CTA and waits until it comes back. False when the cluster has stopped instead (every
// CTA stuck since the same epoch: a deadlock, described in c->error; or a CTA failed): the
// block must end.
static bool cluster_yield(Block* b) {
    Cluster* c = b->cl;
    unsigned r = b->rank;
    std::unique_lock<std::mutex> lock(c->mutex);
    c->stuck[r] = true;
    c->stuck_at[r] = c->epoch;
    bool all = true;
    for (unsigned i = 0; i < c->size; i++) {
        if (!c->finished[i] && !(c->stuck[i] && c->stuck_at[i] == c->epoch)) all = false;
    }
    if (all && !c->failed) {
        c->error = describe_cluster_deadlock(c);
        c->failed = true;
        c->cv.notify_all();
    }
    if (!c->failed) {
        cluster_pass_turn(c, r);
        c->cv.wait(lock, [&] { return c->turn == r || c->failed; });
    }
    c->stuck[r] = false;
    return !c->failed;
}

// A CTA starts: it waits until every CTA of the cluster has started and the turn is its own.
static bool cluster_enter(Block* b, const void* tls, unsigned char* smem, size_t bytes) {
    Cluster* c = b->cl;
    unsigned r = b->rank;
    std::unique_lock<std::mutex> lock(c->mutex);
    c->blocks[r] = b;
    c->tls[r] = (const char*)tls;
    c->smem[r] = smem;
    c->smem_bytes = bytes;
    c->entered[r] = true;
    c->registered++;
    c->cv.notify_all();
    c->cv.wait(lock, [&] { return (c->registered == c->size && c->turn == r) || c->failed; });
    return !c->failed;
}

// A CTA ends (`failed`: with an error, which stops the others), started or not.
static void cluster_leave(Cluster* c, unsigned r, bool failed) {
    std::lock_guard<std::mutex> lock(c->mutex);
    if (!c->entered[r]) {
        c->entered[r] = true;
        c->registered++;
    }
    c->finished[r] = true;
    c->blocks[r] = nullptr;
    if (failed) c->failed = true;
    if (c->turn == r) cluster_pass_turn(c, r);
    c->cv.notify_all();
}

// ---- barriers ----

static void syncthreads(int line) {
    Block* b = tls_block;
    if (!b) throw PlainModeBarrier();
    Fiber* f = b->current;
    MC_LENS_COUNT(LENS_BARRIERS, 1);
    f->site = line;
    if (++b->arrived < b->nthreads) {
        f->state = WAIT_BLOCK;
        switch_away(b, f, false);
        return;
    }
    // Every thread has arrived: they must all be at the same __syncthreads().
    b->arrived = 0;
    for (unsigned i = 0; i < b->nthreads; i++) {
        Fiber& g = b->fibers[i];
        if (g.site != line && b->error.empty()) {
            b->error = format(
                "threads (%u,%u,%u) and (%u,%u,%u) of block (%u,%u,%u) wait at different "
                "__syncthreads() calls (lines %d and %d)",
                f->tid.x, f->tid.y, f->tid.z, g.tid.x, g.tid.y, g.tid.z, b->idx.x, b->idx.y,
                b->idx.z, line, g.site);
        }
        if (g.state == WAIT_BLOCK) push_runnable(b, &g);
    }
    if (!b->error.empty()) switch_away(b, f, false);  // to the scheduler; never resumed
}

// Waits until every lane of the warp reaches a warp barrier; returns the buffer index to use.
static inline Warp& warp_of(Block* b, Fiber* f) { return b->warps[f->linear / 32]; }

static void warp_barrier(Block* b, Fiber* f, Warp& w) {
    if (++w.arrived < w.active) {
        f->state = WAIT_WARP;
        switch_away(b, f, false);
        return;
    }
    w.arrived = 0;
    w.gen++;
    unsigned first = f->linear & ~31u;
    for (unsigned i = first; i < first + w.active; i++) {
        Fiber& g = b->fibers[i];
        if (g.state == WAIT_WARP) push_runnable(b, &g);
    }
}

enum ShflKind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };

template <class T>
static T shuffle(T value, int kind, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle type");
    Block* b = tls_block;
    if (!b) throw PlainModeBarrier();
    Fiber* f = b->current;
    Warp& w = warp_of(b, f);
    int lane = (int)(f->linear & 31);
    int seg = lane & ~(width - 1);
    int src = lane;
    switch (kind) {
        case SHFL_IDX: src = seg + (arg & (width - 1)); break;
        case SHFL_UP: src = (lane - seg) >= arg ? lane - arg : lane; break;
        case SHFL_DOWN: src = (lane - seg) + arg < width ? lane + arg : lane; break;
        default: src = (lane ^ arg) & 31; src = src < seg + width ? src : lane; break;
    }
    // Lanes past the end of the block do not exist: reading one gives the caller's own value.
    if ((unsigned)src >= w.active) src = lane;
    unsigned buf = w.gen & 1;
    uint64_t bits = 0;
    memcpy(&bits, &value, sizeof(T));
    w.slots[buf][lane] = bits;
    warp_barrier(b, f, w);
    // The double buffer keeps this slot intact: the next exchange into it needs this lane.
    bits = w.slots[buf][src];
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

static inline void syncwarp() {
    Block* b = tls_block;
    if (!b) throw PlainModeBarrier();
    warp_barrier(b, b->current, warp_of(b, b->current));
}

}  // namespace mc_emu

// Checked launches (emu_checks.h; emu.py puts its text here).
#include "emu_checks.h"

// mbarriers and bulk copies (emu_async.h; emu.py puts its text here).
#ifndef MC_EMU_NO_ASYNC
#include "emu_async.h"
// Clusters, distributed shared memory and setmaxnreg (emu_cluster.h; emu.py puts its text here).
#include "emu_cluster.h"
#endif

namespace mc_emu {

// ---- running blocks ----

static std::string describe_deadlock(Block* b) {
    unsigned at_block = 0, at_warp = 0, exited = 0;
    int line = -1;
    for (unsigned i = 0; i < b->nthreads; i++) {
        Fiber& g = b->fibers[i];
        if (g.state == WAIT_BLOCK) {
            at_block++;
            line = g.site;
        }
        at_warp += g.state == WAIT_WARP;
        exited += g.state == DONE;
    }
    std::string s = format("barrier deadlock in block (%u,%u,%u): ", b->idx.x, b->idx.y, b->idx.z);
    if (at_block) s += format("%u of %u threads wait at __syncthreads() (line %d)", at_block,
                              b->nthreads, line);
    if (at_warp) s += format("%s%u wait at a warp shuffle/__syncwarp", at_block ? ", " : "",
                             at_warp);
#ifndef MC_EMU_NO_ASYNC
    std::string mbar = describe_async_waits(b);
    if (!mbar.empty()) s += (at_block || at_warp ? ", " : "") + mbar;
    std::string group = describe_cluster_waits(b);
    if (!group.empty()) s += (at_block || at_warp || !mbar.empty() ? ", " : "") + group;
#endif
    if (exited) s += format(", %u exited without reaching it", exited);
    return s;
}

#ifdef MC_EMU_RUNTIME
static void run_fibers(Block* b) {
#ifdef MC_EMU_ASAN
    pthread_attr_t attr;
    pthread_getattr_np(pthread_self(), &attr);
    void* bottom;
    pthread_attr_getstack(&attr, &bottom, &b->sched_stack_size);
    pthread_attr_destroy(&attr);
    b->sched_stack_bottom = bottom;
#endif
    for (unsigned i = 0; i < b->nthreads; i++) {
        start_fiber(b, &b->fibers[i]);
        push_runnable(b, &b->fibers[i]);
    }
    run_queue(b);
    // In a cluster, a block whose threads all wait lets the other CTAs run, then goes on.
    while (b->cl && b->error.empty() && b->done < b->nthreads) {
        if (!cluster_yield(b)) {
            b->error = CLUSTER_STOPPED;
            break;
        }
        run_queue(b);
    }
    if (b->done < b->nthreads && b->error.empty()) b->error = describe_deadlock(b);
    for (unsigned i = 0; i < b->nthreads && b->error.empty(); i++) {
        if (*(uint64_t*)b->fibers[i].stack != STACK_CANARY) {
            b->error = format("fiber stack overflow (%zu bytes per thread); raise stack_bytes",
                              b->stack_bytes);
        }
    }
}

static void run_plain(Block* b) {
    tls_block = nullptr;
    uint3 t;
    for (t.z = 0; t.z < b->dim.z; t.z++)
        for (t.y = 0; t.y < b->dim.y; t.y++)
            for (t.x = 0; t.x < b->dim.x; t.x++) {
                tls_thread_idx = t;
                b->body(b->args);
            }
}

#endif  // MC_EMU_RUNTIME

// A kernel library's settings (mc_emu_configure), passed to each of its launches.
struct Config {
    size_t stack_bytes = 64 * 1024;
    unsigned workers = 0;  // 0: one per hardware thread
    // An address in the calling OS thread's thread-local block of the library, where its
    // kernels' `__shared__` arrays live (the lens tells shared accesses by it).
    const void* (*library_tls)() = nullptr;
};

// Each OS thread keeps its fiber stacks between the blocks of one launch and unmaps them when the
// launch ends: every guard page is a mapping of its own, and stacks kept by every loaded kernel
// library would exhaust the process's mapping limit (vm.max_map_count) in a long session.
// A stack overflow hits the guard page below each stack (a crash, never silent corruption);
// ASan builds use malloc'ed stacks, whose shadow memory ASan keeps right.
struct Worker {
    char* stacks = nullptr;
    size_t mapped = 0;   // bytes of the mapping
    size_t stride = 0;   // guard page + stack
    unsigned count = 0;  // stacks in the mapping
    size_t bytes = 0;    // usable bytes per stack
    char* stack(unsigned i) { return stacks + (size_t)i * stride + (stride - bytes); }
    bool reserve(unsigned n, size_t stack_bytes) {
        if (n <= count && stack_bytes == bytes) return true;
        release();
        const size_t page = 4096;
        size_t usable = (stack_bytes + page - 1) / page * page;
#ifdef MC_EMU_ASAN
        stride = usable;
        stacks = (char*)malloc(n * stride);
        if (!stacks) return false;
#else
        stride = usable + page;
        void* p = mmap(nullptr, n * stride, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        stacks = (char*)p;
        for (unsigned i = 0; i < n; i++) mprotect(stacks + (size_t)i * stride, page, PROT_NONE);
#endif
        mapped = n * stride;
        count = n;
        bytes = usable;
        return true;
    }
    void release() {
#ifdef MC_EMU_ASAN
        free(stacks);
#else
        if (stacks) munmap(stacks, mapped);
#endif
        stacks = nullptr;
        count = 0;
    }
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    std::vector<Fiber*> queue;
    // Dynamic shared memory, sized exactly (to 16 bytes) so ASan builds see overruns.
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    // emu_mma.h's warp-collective exchange slots: owned here, not by a thread_local vector,
    // whose destructor would keep the library from being unloaded while the thread lives.
    std::vector<unsigned char> exchange;
    unsigned char* dynamic_smem(size_t n) {
        if (n != smem_bytes) {
            free(smem);
            // 1024-byte aligned, as device.h declares it: swizzle patterns repeat that often.
            void* p = nullptr;
            smem = n && !posix_memalign(&p, 1024, (n + 15) & ~(size_t)15) ? (unsigned char*)p
                                                                           : nullptr;
            smem_bytes = smem ? n : 0;
        }
        return smem;
    }
    ~Worker() {
        release();
        free(smem);
    }
};

MC_EMU_SHARED __thread Worker* tls_worker;  // the Worker of the block running on this OS thread

#ifdef MC_EMU_RUNTIME
static std::string misaligned_error() {
    if (!tls_misaligned) return "";
    return format("misaligned %u-byte vector access at %p (a GPU raises a misaligned address "
                  "error)", tls_misaligned_bytes, tls_misaligned);
}

static std::string wgmma_finish(Block* b);  // emu_wgmma.h

// Runs block `linear` of the grid; returns an error message, or "" on success.
static std::string run_one_block(const char* kernel, Body body, void** args, bool fibers,
                                 uint3 grid, uint3 dim, size_t shared, unsigned linear,
                                 Worker& w, const Config& config, Cluster* cl, unsigned rank) {
    Block b{};
    b.cl = cl;
    b.rank = rank;
    b.kernel = kernel;
    b.body = body;
    b.args = args;
    b.dim = dim;
    b.idx = {linear % grid.x, linear / grid.x % grid.y, linear / grid.x / grid.y};
    b.nthreads = dim.x * dim.y * dim.z;
    b.stack_bytes = (config.stack_bytes + 4095) / 4096 * 4096;
    tls_block_idx = b.idx;
    tls_block_dim = dim;
    tls_grid_dim = grid;
    tls_misaligned = nullptr;
    tls_dynamic_smem = w.dynamic_smem(shared);
    if (shared && !tls_dynamic_smem) {
        return format("cannot allocate %zu bytes of dynamic shared memory", shared);
    }
    if (!fibers) {
        bool ok;
        try {
            ok = run_guarded(&b, run_plain);
        } catch (PlainModeBarrier&) {
            tls_abort = nullptr;
            return "the kernel reached a barrier or warp collective but was launched without "
                   "fibers (its sync flag is wrong)";
        }
        return ok ? misaligned_error() : violation_error();
    }
    if (!w.reserve(b.nthreads, b.stack_bytes)) {
        return format("cannot allocate %u fiber stacks of %zu bytes", b.nthreads, b.stack_bytes);
    }
    w.fibers.assign(b.nthreads, Fiber{});
    w.warps.assign((b.nthreads + 31) / 32, Warp{});
    b.fibers = w.fibers.data();
    b.warps = w.warps.data();
    for (unsigned i = 0; i < b.nthreads; i++) {
        Fiber& f = b.fibers[i];
        f.tid = {i % dim.x, i / dim.x % dim.y, i / dim.x / dim.y};
        f.linear = i;
        f.state = RUNNABLE;
        f.block = &b;
        f.stack = w.stack(i);
    }
    for (unsigned i = 0; i < b.nthreads; i += 32) {
        b.warps[i / 32].active = b.nthreads - i < 32 ? b.nthreads - i : 32;
    }
    w.queue.resize(b.nthreads);
    b.queue = w.queue.data();
    tls_block = &b;
    if (cl) {
        const void* tls = config.library_tls ? config.library_tls() : nullptr;
        if (!cluster_enter(&b, tls, tls_dynamic_smem, shared)) {
            tls_block = nullptr;
            return CLUSTER_STOPPED;
        }
    }
    bool ok = run_guarded(&b, run_fibers);
    tls_block = nullptr;
    std::string wgmma = wgmma_finish(&b);  // work left pending, an incomplete warpgroup
    if (!ok) return violation_error();
    if (b.error.empty()) b.error = wgmma;
    return b.error.empty() ? misaligned_error() : b.error;
}

// run_one_block, counted by `lens` when it is not null.
static std::string run_block(const char* kernel, Body body, void** args, bool fibers, uint3 grid,
                             uint3 dim, size_t shared, unsigned linear, Worker& w,
                             const Config& config, LensWorker* lens, Cluster* cl = nullptr,
                             unsigned rank = 0) {
    if (lens) lens_begin_block(lens, dim.x * dim.y * dim.z, w.dynamic_smem(shared), shared);
    std::string error = run_one_block(kernel, body, args, fibers, grid, dim, shared, linear, w,
                                      config, cl, rank);
    if (lens) lens_end_block(lens);
    return error;
}

#ifdef MC_EMU_ASAN
// With halt_on_error=0, ASan reports come here and the launch fails with the report.
static std::mutex* asan_mutex = new std::mutex;
static std::string* asan_report = new std::string;
static void asan_callback(const char* report) {
    std::lock_guard<std::mutex> lock(*asan_mutex);
    if (asan_report->empty()) *asan_report = report;
}
#endif

// Runs a kernel of a library with settings `config`; `checks`, when not null, describes its
// tensor arguments for a checked launch (emu_checks.h) and receives its first bad access;
// `lens`, when not null, which blocks to count (emu_lens.h), and receives the counts;
// (cx, cy, cz) is the kernel's cluster, (1, 1, 1) without one.
int launch(const char* kernel, bool fibers, Body body, const Config& config, unsigned gx,
           unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
           unsigned long long shared, void** args, Checks* checks, Lens* lens, char* err,
           int errlen, unsigned cx, unsigned cy, unsigned cz) {
    std::string error;
    unsigned long long threads = (unsigned long long)bx * by * bz;
    if (!gx || !gy || !gz || !bx || !by || !bz) {
        error = "empty grid or block";
    } else if (threads > 1024 || bz > 64) {
        error = format("block (%u,%u,%u) has more threads than CUDA allows", bx, by, bz);
    } else if (gy > 65535 || gz > 65535) {
        error = format("grid (%u,%u,%u) exceeds CUDA's y/z limits", gx, gy, gz);
    } else if (shared > MAX_DYNAMIC_SHARED) {
        error = format("%llu bytes of dynamic shared memory; a block may have %llu", shared,
                       MAX_DYNAMIC_SHARED);
    } else if (!cx || !cy || !cz || (unsigned long long)cx * cy * cz > MAX_CLUSTER) {
        error = format("a cluster of (%u,%u,%u) CTAs; a cluster has 1 to %u", cx, cy, cz,
                       MAX_CLUSTER);
    } else if (gx % cx || gy % cy || gz % cz) {
        error = format("the grid (%u,%u,%u) is not a multiple of its cluster (%u,%u,%u) "
                       "(__cluster_dims__) along every axis",
                       gx, gy, gz, cx, cy, cz);
    }
#ifdef MC_EMU_ASAN
    static std::once_flag once;
    std::call_once(once, [] { __asan_set_error_report_callback(asan_callback); });
#endif
    unsigned long long nblocks = (unsigned long long)gx * gy * gz;
    uint3 grid{gx, gy, gz}, dim{bx, by, bz};
    // A counted launch may run its sampled blocks only: the i-th block claimed is sample[i].
    unsigned long long nclaims = lens && lens->sample_only ? lens->nsample : nblocks;
    if (lens) {
        if (!lens_counts) error = "counting needs a library built with lens=True";
        memset(lens->counts, 0, sizeof lens->counts);
        if (error.empty() && lens->nsample && lens->sample[lens->nsample - 1] >= nblocks) {
            error = "a counted block is outside the grid";
        }
        __atomic_store_n(&active_lens, lens, __ATOMIC_RELAXED);
    }
    // Blocks are claimed in increasing order, and a failure stops claims past it: every block
    // before the first failing one still runs, so the reported failure is deterministic.
    std::atomic<unsigned long long> next{0};
    std::atomic<unsigned long long> first_bad{~0ull};
    std::mutex mutex;
    CheckedLaunch checked;
    LensSectors sectors;
    if (checks) {
        checks->violation.found = 0;
        if (error.empty()) error = begin_checks(checks, args, &checked);
    }
    // Runs `run(w, counted)` with this OS thread set up to run blocks: its worker, checks, lens.
    auto with_worker = [&](auto&& run) {
        Worker w;
        tls_worker = &w;
        tls_checks = checks ? &checked : nullptr;
        LensWorker counted;
        if (lens) lens_begin_launch(&counted, lens, config.library_tls());
        tls_lens = lens ? &counted : nullptr;
        run(w, counted);
        if (lens) lens_end_launch(&counted, lens, &sectors, mutex);
        tls_lens = nullptr;
        tls_checks = nullptr;
        tls_worker = nullptr;
    };
    auto blocks = [&](Worker& w, LensWorker& counted) {
        for (;;) {
            unsigned long long claim = next.fetch_add(1);
            if (claim >= nclaims || claim > first_bad.load()) break;
            unsigned long long i = lens && lens->sample_only ? lens->sample[claim] : claim;
            LensWorker* counting = lens && lens_sampled(lens, i) ? &counted : nullptr;
            std::string e = run_block(kernel, body, args, fibers, grid, dim, (size_t)shared,
                                      (unsigned)i, w, config, counting);
            if (e.empty()) continue;
            std::lock_guard<std::mutex> lock(mutex);
            if (claim < first_bad.load()) {
                first_bad = claim;
                error = e;
                if (checks) checks->violation = tls_violation.found ? tls_violation : Violation{};
            }
        }
    };
    // A launch with clusters (of a kernel on fibers: only those can reach each other) claims
    // whole clusters: the claiming OS thread runs rank 0 and one more thread each other rank.
    unsigned csize = cx * cy * cz;
    bool clustered = fibers && csize > 1 && error.empty();
    std::vector<unsigned long long> sampled_clusters;
    auto cluster_of = [&](unsigned long long i) {
        unsigned long long x = i % gx, y = i / gx % gy, z = i / gx / gy;
        return x / cx + (unsigned long long)(gx / cx) * (y / cy + (unsigned long long)(gy / cy) * (z / cz));
    };
    auto block_in = [&](unsigned long long cluster, unsigned r) {
        unsigned ncx = gx / cx, ncy = gy / cy;
        unsigned long long x = cluster % ncx * cx + r % cx;
        unsigned long long y = cluster / ncx % ncy * cy + r / cx % cy;
        unsigned long long z = cluster / ncx / ncy * cz + r / cx / cy;
        return x + (unsigned long long)gx * (y + (unsigned long long)gy * z);
    };
    if (clustered) {
        if (lens && lens->sample_only) {
            for (unsigned long long k = 0; k < lens->nsample; k++)
                sampled_clusters.push_back(cluster_of(lens->sample[k]));
            std::sort(sampled_clusters.begin(), sampled_clusters.end());
            sampled_clusters.erase(std::unique(sampled_clusters.begin(), sampled_clusters.end()),
                                   sampled_clusters.end());
            nclaims = sampled_clusters.size();
        } else {
            nclaims = nblocks / csize;
        }
    }
    auto clusters = [&](Worker& w, LensWorker& counted) {
        for (;;) {
            unsigned long long claim = next.fetch_add(1);
            if (claim >= nclaims || claim > first_bad.load()) break;
            unsigned long long index = sampled_clusters.empty() ? claim : sampled_clusters[claim];
            Cluster c;
            c.size = csize;
            c.barrier.expected = csize * (unsigned)threads;
            std::vector<std::string> errors(csize);
            std::vector<Violation> violations(csize);
            auto rank = [&](unsigned r, Worker& rw, LensWorker& rc) {
                unsigned long long i = block_in(index, r);
                LensWorker* counting = lens && lens_sampled(lens, i) ? &rc : nullptr;
                errors[r] = run_block(kernel, body, args, fibers, grid, dim, (size_t)shared,
                                      (unsigned)i, rw, config, counting, &c, r);
                violations[r] = tls_violation.found ? tls_violation : Violation{};
                cluster_leave(&c, r, !errors[r].empty());
            };
            std::vector<std::thread> others;
            for (unsigned r = 1; r < csize; r++) {
                others.emplace_back([&, r] { with_worker([&](Worker& rw, LensWorker& rc) { rank(r, rw, rc); }); });
            }
            rank(0, w, counted);
            for (auto& t : others) t.join();
            // The cluster's deadlock, else the first CTA's own failure (not its stopping).
            std::string e = c.error;
            Violation v{};
            for (unsigned r = 0; r < csize && e.empty(); r++) {
                if (!errors[r].empty() && errors[r] != CLUSTER_STOPPED) {
                    e = format("CTA %u of its cluster: ", r) + errors[r];
                    v = violations[r];
                }
            }
            for (unsigned r = 0; r < csize && e.empty(); r++) e = errors[r];
            if (e.empty()) continue;
            std::lock_guard<std::mutex> lock(mutex);
            if (claim < first_bad.load()) {
                first_bad = claim;
                error = e;
                if (checks) checks->violation = v;
            }
        }
    };
    if (error.empty()) {
        unsigned hw = config.workers ? config.workers : std::thread::hardware_concurrency();
        if (clustered) hw = hw / csize ? hw / csize : 1;  // each claim takes csize threads
        unsigned long long n = nclaims < hw ? nclaims : (hw ? hw : 1);
        auto work = [&] {
            if (clustered) {
                with_worker(clusters);
            } else {
                with_worker(blocks);
            }
        };
        std::vector<std::thread> pool;
        for (unsigned long long t = 1; t < n; t++) pool.emplace_back(work);
        work();
        for (auto& t : pool) t.join();
    }
    if (checks) end_checks(&checked);
    if (lens) {
        __atomic_store_n(&active_lens, (const Lens*)nullptr, __ATOMIC_RELAXED);
        lens_tally(lens, sectors);
    }
#ifdef MC_EMU_ASAN
    {
        std::lock_guard<std::mutex> lock(*asan_mutex);
        if (!asan_report->empty() && error.empty()) error = "AddressSanitizer: " + *asan_report;
        asan_report->clear();
    }
#endif
    fflush(stdout);  // the kernels' printf output, before Python prints anything else
    if (error.empty()) return 0;
    snprintf(err, (size_t)errlen, "kernel '%s': %s", kernel, error.c_str());
    return 1;
}
#else
int launch(const char* kernel, bool fibers, Body body, const Config& config, unsigned gx,
           unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
           unsigned long long shared, void** args, Checks* checks, Lens* lens, char* err,
           int errlen, unsigned cx, unsigned cy, unsigned cz);
#endif  // MC_EMU_RUNTIME

}  // namespace mc_emu

// ---- the CUDA names ----

#define threadIdx (::mc_emu::tls_thread_idx)
#define blockIdx (::mc_emu::tls_block_idx)
#define blockDim (::mc_emu::tls_block_dim)
#define gridDim (::mc_emu::tls_grid_dim)
#define mc_dynamic_smem (::mc_emu::tls_dynamic_smem)
#define __syncthreads() ::mc_emu::syncthreads(__LINE__)
#define __syncwarp(...) ::mc_emu::syncwarp()

template <class T>
static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return mc_emu::shuffle(v, mc_emu::SHFL_IDX, src, width);
}
template <class T>
static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    return mc_emu::shuffle(v, mc_emu::SHFL_UP, (int)delta, width);
}
template <class T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    return mc_emu::shuffle(v, mc_emu::SHFL_DOWN, (int)delta, width);
}
template <class T>
static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    return mc_emu::shuffle(v, mc_emu::SHFL_XOR, mask, width);
}

namespace mc_emu {
template <class T>
struct same {
    typedef T type;
};
template <class T>
static inline T atomic_float_add(T* p, T v) {
    T old, sum;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
        sum = old + v;
    } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
}  // namespace mc_emu

// CUDA atomics are relaxed; blocks on different OS threads need real atomics.
template <class T>
static inline T atomicAdd(T* p, typename mc_emu::same<T>::type v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline float atomicAdd(float* p, float v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    return mc_emu::atomic_float_add(p, v);
}
static inline double atomicAdd(double* p, double v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    return mc_emu::atomic_float_add(p, v);
}
template <class T>
static inline T atomicSub(T* p, typename mc_emu::same<T>::type v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);
}
template <class T>
static inline T atomicMax(T* p, typename mc_emu::same<T>::type v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T>
static inline T atomicMin(T* p, typename mc_emu::same<T>::type v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T>
static inline T atomicCAS(T* p, typename mc_emu::same<T>::type compare,
                          typename mc_emu::same<T>::type value) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    __atomic_compare_exchange_n(p, &compare, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
template <class T>
static inline T atomicExch(T* p, typename mc_emu::same<T>::type v) {
    MC_LENS_COUNT(LENS_ATOMICS, 1);
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class To, class From>
static inline To mc_emu_bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast size");
    To out;
    memcpy(&out, &v, sizeof out);
    return out;
}
static inline unsigned int __float_as_uint(float x) { return mc_emu_bit_cast<unsigned int>(x); }
static inline float __uint_as_float(unsigned int x) { return mc_emu_bit_cast<float>(x); }
static inline int __float_as_int(float x) { return mc_emu_bit_cast<int>(x); }
static inline float __int_as_float(int x) { return mc_emu_bit_cast<float>(x); }
static inline long long __double_as_longlong(double x) {
    return mc_emu_bit_cast<long long>(x);
}
static inline double __longlong_as_double(long long x) { return mc_emu_bit_cast<double>(x); }

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
template <class T>
static inline T __ldg(const T* p) {
    return *p;
}

// The integer min/max CUDA declares for device code.
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }

// ---- vector memory access (device.h's mc_load_vec<N> / mc_store_vec<N>) ----

namespace mc_emu {
// Copies `bytes` as one access would, noting an address the GPU could not access that way.
MC_LENS_UNINSTRUMENTED static inline void vector_copy(void* dst, const void* src,
                                                      unsigned bytes) {
    uintptr_t align = bytes < 16 ? bytes : 16;
    if (((uintptr_t)dst | (uintptr_t)src) % align && !tls_misaligned) {
        tls_misaligned = (uintptr_t)src % align ? src : dst;
        tls_misaligned_bytes = bytes;
    }
#ifdef MC_EMU_CHECKS
    check_range(src, bytes, 0);
    check_range(dst, bytes, 1);
#endif
    MC_LENS_ACCESS(LENS_SITE_VECTOR, src, bytes, 0);
    MC_LENS_ACCESS(LENS_SITE_VECTOR, dst, bytes, 1);
    memcpy(dst, src, bytes);
}
}  // namespace mc_emu

#define MC_EMU_VECTOR_ACCESS(N)                                                   \
    static inline void mc_load_vec##N(void* dst, const void* src) {               \
        mc_emu::vector_copy(dst, src, N);                                         \
    }                                                                             \
    static inline void mc_store_vec##N(void* dst, const void* src) {              \
        mc_emu::vector_copy(dst, src, N);                                         \
    }
MC_EMU_VECTOR_ACCESS(2)
MC_EMU_VECTOR_ACCESS(4)
MC_EMU_VECTOR_ACCESS(8)
MC_EMU_VECTOR_ACCESS(16)
MC_EMU_VECTOR_ACCESS(32)
#undef MC_EMU_VECTOR_ACCESS

#ifndef MC_EMU_RUNTIME
// This kernel library's settings: per-thread fiber stack bytes and OS worker threads.
static __thread char mc_emu_tls_anchor;
static const void* mc_emu_library_tls() { return &mc_emu_tls_anchor; }
static mc_emu::Config mc_emu_config{64 * 1024, 0, mc_emu_library_tls};
extern "C" void mc_emu_configure(unsigned long long stack_bytes, unsigned workers) {
    if (stack_bytes) mc_emu_config.stack_bytes = (stack_bytes + 15) & ~15ull;
    mc_emu_config.workers = workers;
}
#endif

#endif  // MC_EMU_H
