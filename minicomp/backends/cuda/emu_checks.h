// minicomp cuda-emu checked launches (the emu_checks option): an access of a kernel outside its
// tensor arguments fails the launch with the argument, the offset and the thread, instead of
// corrupting the host process.
//
// Each tensor argument (each group of overlapping ones) is copied into a mapping of its own
// between two inaccessible guards of GUARD_BYTES; the kernel gets the copy's address, and the
// copy goes back to the tensor after the launch. Its end sits as close to the trailing guard as
// alignment allows: the copy keeps the tensor's address modulo 16 (the widest vector access), so
// vector accesses behave as on the original. Between the leading guard and the data lies about a
// page of slack at most. A checked library is compiled with the compiler's kernel-address
// instrumentation in its all-calls form: every load and store first calls
// __asan_{load,store}N_noabort, defined here, which fails the block when the access touches a
// mapping outside its data (a guard or the slack), before it happens. An access the
// instrumentation does not see (the C library's memcpy with a run-time size) faults on a guard:
// a SIGSEGV handler, installed for the launch, reports it the same way. Either way the block is
// left by a siglongjmp back to run_block, its fibers abandoned on stacks the launch unmaps.
#ifndef MC_EMU_CHECKS_H
#define MC_EMU_CHECKS_H

#include <setjmp.h>
#include <signal.h>
#include <ucontext.h>

#include <algorithm>

// The functions an instrumented access calls must not be instrumented themselves.
#define MC_EMU_UNCHECKED __attribute__((no_sanitize_address))

namespace mc_emu {

// The launch's argument, mirrored by emu.py's _Checks.
struct CheckedArg {
    int param;         // its position among the kernel's arguments
    long long lo, hi;  // its bytes, [pointer + lo, pointer + hi)
};
struct Violation {
    int found;
    int param;
    int write;  // 1 a store, 0 a load, -1 unknown (a fault outside the instrumentation)
    unsigned bytes;
    long long offset;  // of the access from the argument's pointer, in bytes
    unsigned thread[3];
    unsigned block[3];
};
struct Checks {
    int count;
    CheckedArg* args;
    Violation violation;
};

static const size_t GUARD_BYTES = 1 << 20;

struct Region {
    char* map;
    size_t map_bytes;
    uintptr_t lo, hi;            // the mapping, guards included
    uintptr_t data_lo, data_hi;  // the copied bytes
    uintptr_t original;          // where data_lo's bytes came from
};

// What the hooks read: plain arrays, as a hook may call nothing instrumented (a std::vector
// accessor the compiler does not inline would call the hook again).
struct CheckedLaunch {
    Region* regions = nullptr;
    size_t nregions = 0;
    const CheckedArg* args = nullptr;
    int nargs = 0;
    uintptr_t* pointers = nullptr;  // each checked argument's pointer into its copy
    int* region_of = nullptr;
    std::vector<Region> region_store;
    std::vector<uintptr_t> pointer_store;
    std::vector<int> region_of_store;
};

// The library's checked launch (emu.py runs one at a time), read first by every hook: a global
// costs a hook much less than a thread-local variable of a loaded library.
MC_EMU_SHARED const CheckedLaunch* active_checks;
MC_EMU_SHARED __thread const CheckedLaunch* tls_checks;  // the launch this OS thread works for
MC_EMU_SHARED __thread sigjmp_buf* tls_abort;            // where a failing block of it goes
MC_EMU_SHARED __thread Violation tls_violation;          // the failing block's bad access
// The SIGSEGV action a checked launch replaced (emu.py runs one checked launch at a time).
MC_EMU_SHARED struct sigaction previous_segv;
MC_EMU_SHARED bool segv_replaced;

// Notes the bad access of [addr, addr + bytes) in region `r` against the argument nearest it.
MC_EMU_UNCHECKED static void note(const CheckedLaunch* c, int r, uintptr_t addr, size_t bytes,
                                  int write) {
    int best = -1;
    uintptr_t best_gap = ~(uintptr_t)0;
    for (int k = 0; k < c->nargs; k++) {
        if (c->region_of[k] != r) continue;
        uintptr_t lo = c->pointers[k] + c->args[k].lo, hi = c->pointers[k] + c->args[k].hi;
        uintptr_t gap = addr + bytes <= lo ? lo - addr : addr >= hi ? addr - hi + 1 : 0;
        if (gap < best_gap) best = k, best_gap = gap;
    }
    Violation& v = tls_violation;
    v.found = 1;
    v.param = c->args[best].param;
    v.write = write;
    v.bytes = (unsigned)bytes;
    v.offset = (long long)(addr - c->pointers[best]);
    v.thread[0] = tls_thread_idx.x, v.thread[1] = tls_thread_idx.y, v.thread[2] = tls_thread_idx.z;
    v.block[0] = tls_block_idx.x, v.block[1] = tls_block_idx.y, v.block[2] = tls_block_idx.z;
}

MC_EMU_UNCHECKED static inline void check_access(uintptr_t addr, size_t bytes, int write) {
    const CheckedLaunch* c = __atomic_load_n(&active_checks, __ATOMIC_RELAXED);
    if (!c) return;
    for (size_t r = 0; r < c->nregions; r++) {
        const Region& g = c->regions[r];
        if (addr < g.hi && addr + bytes > g.lo && (addr < g.data_lo || addr + bytes > g.data_hi)) {
            if (tls_checks != c || !tls_abort) return;  // not one of the launch's blocks
            note(c, (int)r, addr, bytes, write);
            siglongjmp(*tls_abort, 1);
        }
    }
}

// What the emulator's own copies (vector accesses, cp.async) check: their size is known only at
// run time, where the C library's memcpy is not instrumented.
MC_EMU_UNCHECKED static inline void check_range(const void* p, size_t bytes, int write) {
    if (bytes) check_access((uintptr_t)p, bytes, write);
}

MC_EMU_UNCHECKED static void on_segv(int sig, siginfo_t* info, void* context) {
    const CheckedLaunch* c = tls_checks;
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (size_t r = 0; c && tls_abort && r < c->nregions; r++) {
        if (addr >= c->regions[r].lo && addr < c->regions[r].hi) {
            int write = -1;
#if defined(__x86_64__) && defined(REG_ERR)
            write = (((ucontext_t*)context)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
            (void)context;
#endif
            note(c, (int)r, addr, 0, write);  // the size of a faulting access is unknown
            siglongjmp(*tls_abort, 1);
        }
    }
    // Not ours: fault again under the handler this launch replaced.
    (void)sig;
    sigaction(SIGSEGV, &previous_segv, nullptr);
}

// Runs the threads of block `b`; false when a bad access of a checked launch ended them.
static bool run_guarded(Block* b, void (*run)(Block*)) {
    if (!tls_checks) {
        run(b);
        return true;
    }
    sigjmp_buf env;
    tls_violation.found = 0;
    tls_abort = &env;
    if (sigsetjmp(env, 1)) {
        tls_abort = nullptr;
        return false;
    }
    run(b);
    tls_abort = nullptr;
    return true;
}

// The message of the bad access that ended a block (emu.py words it with the argument's name).
static std::string violation_error() {
    const Violation& v = tls_violation;
    const char* kind = v.write < 0 ? "access" : v.write ? "write" : "read";
    return format("out-of-bounds %s of %u bytes at byte offset %lld of argument %d by thread "
                  "(%u,%u,%u) of block (%u,%u,%u)",
                  kind, v.bytes, v.offset, v.param, v.thread[0], v.thread[1], v.thread[2],
                  v.block[0], v.block[1], v.block[2]);
}

// Copies the tensor arguments into guarded mappings and points `args` at the copies.
static std::string begin_checks(Checks* checks, void** args, CheckedLaunch* c) {
#ifndef MC_EMU_CHECKS
    (void)checks, (void)args, (void)c;
    return "this library was built without checks (build it with checks=True)";
#else
    const size_t page = 4096;
    int n = checks->count;
    c->args = checks->args;
    c->nargs = n;
    c->pointer_store.assign(n, 0);
    c->region_of_store.assign(n, -1);
    c->region_store.reserve(n);
    c->pointers = c->pointer_store.data();
    c->region_of = c->region_of_store.data();
    c->regions = c->region_store.data();
    std::vector<int> order(n);
    for (int k = 0; k < n; k++) order[k] = k;
    auto pointer = [&](int k) -> uintptr_t { return (uintptr_t)*(void**)args[c->args[k].param]; };
    auto start = [&](int k) -> uintptr_t { return pointer(k) + c->args[k].lo; };
    auto end = [&](int k) -> uintptr_t { return pointer(k) + c->args[k].hi; };
    std::sort(order.begin(), order.end(), [&](int a, int b) { return start(a) < start(b); });
    for (int i = 0; i < n;) {
        // Overlapping arguments (a tensor updated in place) share one copy, as they share memory.
        uintptr_t lo = start(order[i]), hi = end(order[i]);
        int j = i + 1;
        for (; j < n && start(order[j]) < hi; j++) hi = std::max(hi, end(order[j]));
        size_t span = hi - lo, body = (span + 16 + page - 1) / page * page;
        Region r{};
        r.map_bytes = 2 * GUARD_BYTES + body;
        void* map = mmap(nullptr, r.map_bytes, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (map == MAP_FAILED) return format("cannot map %zu bytes to check an argument", span);
        r.map = (char*)map;
        c->region_store.push_back(r);  // within the reserved size: c->regions stays valid
        c->nregions++;
        if (mprotect(r.map + GUARD_BYTES, body, PROT_READ | PROT_WRITE) != 0) {
            return format("cannot map %zu bytes to check an argument", span);
        }
        uintptr_t trailing = (uintptr_t)r.map + GUARD_BYTES + body;
        r.lo = (uintptr_t)r.map;
        r.hi = r.lo + r.map_bytes;
        r.data_lo = trailing - span - ((trailing - span - lo) & 15);
        r.data_hi = r.data_lo + span;
        r.original = lo;
        c->regions[c->nregions - 1] = r;
        if (span) memcpy((void*)r.data_lo, (const void*)lo, span);
        for (; i < j; i++) {
            int k = order[i];
            c->pointers[k] = pointer(k) + (r.data_lo - lo);
            c->region_of[k] = (int)c->nregions - 1;
            *(void**)args[c->args[k].param] = (void*)c->pointers[k];
        }
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&act.sa_mask);
    segv_replaced = sigaction(SIGSEGV, &act, &previous_segv) == 0;
    __atomic_store_n(&active_checks, c, __ATOMIC_RELAXED);
    return "";
#endif
}

// Copies the arguments back to the tensors and unmaps them.
static void end_checks(CheckedLaunch* c) {
    __atomic_store_n(&active_checks, nullptr, __ATOMIC_RELAXED);
    if (segv_replaced) sigaction(SIGSEGV, &previous_segv, nullptr);
    segv_replaced = false;
    for (size_t i = 0; i < c->nregions; i++) {
        Region& r = c->regions[i];
        if (r.data_hi > r.data_lo) {
            memcpy((void*)r.original, (const void*)r.data_lo, r.data_hi - r.data_lo);
        }
        munmap(r.map, r.map_bytes);
    }
    c->nregions = 0;
}

}  // namespace mc_emu

#ifdef MC_EMU_CHECKS
// What the kernel-address instrumentation calls before each access.
#define MC_EMU_HOOK extern "C" MC_EMU_UNCHECKED __attribute__((visibility("hidden")))
#define MC_EMU_HOOKS(N)                                                                         \
    MC_EMU_HOOK void __asan_load##N##_noabort(uintptr_t p) { mc_emu::check_access(p, N, 0); } \
    MC_EMU_HOOK void __asan_store##N##_noabort(uintptr_t p) { mc_emu::check_access(p, N, 1); }
MC_EMU_HOOKS(1)
MC_EMU_HOOKS(2)
MC_EMU_HOOKS(4)
MC_EMU_HOOKS(8)
MC_EMU_HOOKS(16)
#undef MC_EMU_HOOKS
MC_EMU_HOOK void __asan_loadN_noabort(uintptr_t p, size_t n) {
    mc_emu::check_range((void*)p, n, 0);
}
MC_EMU_HOOK void __asan_storeN_noabort(uintptr_t p, size_t n) {
    mc_emu::check_range((void*)p, n, 1);
}
MC_EMU_HOOK void __asan_handle_no_return() {}
// Clang's instrumentation calls these for memcpy, memmove and memset; GCC's leaves them alone.
MC_EMU_HOOK void* __asan_memcpy(void* d, const void* s, size_t n) {
    mc_emu::check_range(s, n, 0);
    mc_emu::check_range(d, n, 1);
    return memcpy(d, s, n);
}
MC_EMU_HOOK void* __asan_memmove(void* d, const void* s, size_t n) {
    mc_emu::check_range(s, n, 0);
    mc_emu::check_range(d, n, 1);
    return memmove(d, s, n);
}
MC_EMU_HOOK void* __asan_memset(void* d, int v, size_t n) {
    mc_emu::check_range(d, n, 1);
    return memset(d, v, n);
}
#undef MC_EMU_HOOK
#endif

#endif  // MC_EMU_CHECKS_H
