// minicomp cuda-emu counted launches (the performance lens): for a sample of a launch's blocks,
// what the kernel asks of the GPU's memory system and units, counted the way the hardware
// counts it.
//
// A lens library is compiled with the same all-calls kernel-address instrumentation as a checked
// one (emu_checks.h), but its hooks record each access of a sampled block instead of checking it:
// the CUDA thread, the call site (the hook's return address), the address, its size and whether
// it stores. An access is global when it falls in a tensor argument's bytes (the launch passes
// their spans), shared when it falls in the block's dynamic shared memory or in this library's
// thread-local block (where emu.h puts `__shared__` arrays), and otherwise ignored: the rest is
// the thread's stack (its registers on a GPU) or the emulator's own memory. The emulator's
// vector accesses, ldmatrix and cp.async record themselves; their memcpy calls are not
// instrumented.
//
// When a sampled block ends, each warp's accesses are grouped into warp instructions: the k-th
// access a lane makes from a call site is the same instruction as the k-th access of every other
// lane of its warp from that site (exact for converged warps, which our kernels are but at
// their edges). Per instruction:
//   global: one request; its sectors are the distinct 32-byte segments its lanes touch;
//   shared: one request; a 4-byte access is one phase of 32 lanes, an 8-byte one two phases of
//     16, a 16-byte one (and ldmatrix, which reads 16-byte rows) four phases of 8; each phase
//     costs as many wavefronts as the most distinct 4-byte words any one of the 32 banks holds
//     (the same word is a broadcast), and at least one: the ideal is one per phase.
// Per-thread events (mma, barriers, atomics) and the kernel's own counts of operations
// (mc_lens_ops, which the lens build of the kernel IR inserts) are summed as they come.
#ifndef MC_EMU_LENS_H
#define MC_EMU_LENS_H

#include <algorithm>
#ifdef MC_EMU_LENS
#include <dlfcn.h>
#include <link.h>

#include <unordered_map>
#include <unordered_set>
#endif

namespace mc_emu {

// The counters, in emu.py's LENS_COUNTERS order: what a launch's sampled blocks did in all.
enum LensCounter : int {
    LENS_GLOBAL_LOADS,  // warp-level requests
    LENS_GLOBAL_LOAD_SECTORS,
    LENS_GLOBAL_LOAD_BYTES,  // the bytes the lanes asked for
    LENS_GLOBAL_STORES,
    LENS_GLOBAL_STORE_SECTORS,
    LENS_GLOBAL_STORE_BYTES,
    LENS_SHARED_LOADS,
    LENS_SHARED_STORES,
    LENS_SHARED_WAVEFRONTS,
    LENS_SHARED_IDEAL_WAVEFRONTS,
    LENS_LDMATRIX,  // thread-level calls, like the next two: 32 a warp instruction
    LENS_CP_ASYNC,
    LENS_MMA,
    LENS_BARRIERS,  // thread-level calls: one a thread a __syncthreads()
    LENS_ATOMICS,   // thread-level
    LENS_FLOPS,     // thread-level, from mc_lens_ops: float operations (an fma is two)
    LENS_FP_INSTRUCTIONS,  // float arithmetic instructions (an fma is one)
    LENS_INT_INSTRUCTIONS,  // 32-bit integer arithmetic
    LENS_INT64_INSTRUCTIONS,  // 64-bit integer arithmetic
    LENS_INT_DIVIDES,  // integer divisions and remainders by a non-constant
    LENS_SPECIAL,      // special-function calls (exp, log, sin, rsqrt, tanh...)
    LENS_CONVERSIONS,  // conversions to and from f16/bf16
    LENS_ADDRESS_INSTRUCTIONS,  // integer work in load and store indices
    LENS_WGMMA,        // thread-level: a wgmma m64nNk16 counts N / 8 a thread (N / 2 m16n8k16)
    LENS_WGMMA_INSTRUCTIONS,  // thread-level calls of wgmma_mma_async: 32 a warp instruction
    LENS_THREADS,      // the threads of the sampled blocks
    LENS_BLOCKS,       // the sampled blocks
    LENS_COUNTERS
};

struct LensSpan {
    uintptr_t lo, hi;  // a tensor argument's bytes
};

// A counted launch, mirrored by emu.py's _Lens.
struct Lens {
    int nspans;
    const LensSpan* spans;
    int nsample;
    const unsigned long long* sample;  // the linear indices of the blocks to count, sorted
    int sample_only;                   // run only the sampled blocks
    unsigned long long counts[LENS_COUNTERS];
    unsigned char* read;     // nspans flags: the argument was read by a sampled block
    unsigned char* written;  // and written
    unsigned long long* read_sectors;     // nspans: the distinct sectors the sample read
    unsigned long long* written_sectors;  // and wrote
};

#ifndef MC_EMU_LENS
// Other builds keep only what launch() names: counting is a lens build's (emu.py passes a Lens
// to counted modules only), and its containers would slow every kernel's build.
struct LensWorker {};
struct LensSectors {};
MC_EMU_SHARED const Lens* active_lens;
MC_EMU_SHARED __thread LensWorker* tls_lens;
static inline void lens_begin_launch(LensWorker*, const Lens*, const void*) {}
static inline void lens_begin_block(LensWorker*, unsigned, const unsigned char*, size_t) {}
static inline void lens_end_block(LensWorker*) {}
static inline void lens_end_launch(LensWorker*, Lens*, LensSectors*, std::mutex&) {}
static inline void lens_tally(Lens*, const LensSectors&) {}
static inline bool lens_sampled(const Lens*, unsigned long long) { return false; }
template <class Each>
static inline void lens_bulk(int, Each) {}
static const bool lens_counts = false;
#else
static const bool lens_counts = true;

// A sector of an argument, as a set key (sector numbers fit in 56 bits of an address space).
static inline uint64_t lens_sector_key(uintptr_t sector, int span) {
    return ((uint64_t)sector << 8) | (uint64_t)span;
}

enum LensSpace : unsigned char { LENS_GLOBAL, LENS_SHARED };
// The emulator's own accesses, each helper a call site of its own: its lanes' k-th calls are one
// warp instruction.
enum LensSite : uintptr_t { LENS_SITE_VECTOR = 1, LENS_SITE_CP_ASYNC, LENS_SITE_LDMATRIX };

struct LensEvent {
    uintptr_t site;
    uintptr_t addr;
    unsigned bytes;
    unsigned char store;
    unsigned char space;
    unsigned char lane;  // in its warp
    short span;          // the argument, for a global access
};

// The functions the hooks call must not be instrumented themselves; the bookkeeping the others
// do runs while no block is being counted.
#define MC_LENS_HOOK_SAFE __attribute__((no_sanitize_address))

// One OS thread's counting state, alive for one launch.
struct LensWorker {
    const Lens* lens = nullptr;
    bool recording = false;  // the block running now is sampled
    bool busy = false;       // in a hook: the containers it calls are instrumented too
    uintptr_t tls_lo = 0, tls_hi = 0;
    uintptr_t smem_lo = 0, smem_hi = 0;
    unsigned nthreads = 0;
    std::vector<std::vector<LensEvent>> events;  // per thread of the block
    unsigned long long counts[LENS_COUNTERS] = {};
    std::vector<unsigned char> read, written;
    std::unordered_set<uint64_t> read_sectors, written_sectors;
};

MC_EMU_SHARED const Lens* active_lens;            // the counted launch running now (one at a time)
MC_EMU_SHARED __thread LensWorker* tls_lens;  // this OS thread's state in it

MC_LENS_HOOK_SAFE static inline LensWorker* lens_recording() {
    if (!__atomic_load_n(&active_lens, __ATOMIC_RELAXED)) return nullptr;
    LensWorker* w = tls_lens;
    return w && w->recording ? w : nullptr;
}

// The running CUDA thread's index in its block.
MC_LENS_HOOK_SAFE static inline unsigned lens_thread() {
    if (tls_block) return tls_block->current->linear;
    return tls_thread_idx.x + tls_block_dim.x * (tls_thread_idx.y + tls_block_dim.y * tls_thread_idx.z);
}

MC_LENS_HOOK_SAFE __attribute__((noinline)) static void lens_access(uintptr_t site, uintptr_t addr,
                                                                  size_t bytes, int store) {
    LensWorker* w = lens_recording();
    if (!w || !bytes || w->busy) return;
    LensEvent e{site, addr, (unsigned)bytes, (unsigned char)store, LENS_SHARED, 0, -1};
    const Lens* l = w->lens;
    for (int i = 0; i < l->nspans; i++) {
        if (addr < l->spans[i].hi && addr + bytes > l->spans[i].lo) {
            e.space = LENS_GLOBAL;
            e.span = (short)i;
            break;
        }
    }
    bool shared =
        (addr >= w->smem_lo && addr < w->smem_hi) || (addr >= w->tls_lo && addr < w->tls_hi);
    if (e.space != LENS_GLOBAL && !shared) return;  // the stack or the emulator's memory
    unsigned t = lens_thread();
    w->busy = true;
    if (t < w->events.size()) w->events[t].push_back(e);
    w->busy = false;
}

MC_LENS_HOOK_SAFE static inline void lens_count(LensCounter c, unsigned long long n) {
    if (LensWorker* w = lens_recording()) w->counts[c] += n;
}

// A bulk or tensor copy's global side (emu_async.h): one request, issued by one thread to the
// copy engine, its sectors the distinct 32-byte segments of the bytes it moves inside the
// tensor arguments. `each(visit)` calls visit(global address, bytes) for each run of them.
template <class Each>
MC_LENS_HOOK_SAFE static void lens_bulk(int store, Each each) {
    LensWorker* w = lens_recording();
    if (!w || w->busy) return;
    w->busy = true;  // the containers below are the lens's, not the kernel's
    const Lens* l = w->lens;
    std::vector<uintptr_t> sectors;
    unsigned long long bytes = 0;
    auto& touched = store ? w->written_sectors : w->read_sectors;
    int span = -1;
    each([&](uintptr_t addr, unsigned n) {
        if (span < 0 || addr < l->spans[span].lo || addr >= l->spans[span].hi) {
            span = -1;
            for (int i = 0; i < l->nspans && span < 0; i++) {
                if (addr >= l->spans[i].lo && addr < l->spans[i].hi) span = i;
            }
            if (span < 0) return;
        }
        for (uintptr_t s = addr >> 5; s <= (addr + n - 1) >> 5; s++) {
            sectors.push_back(s);
            if (span < 256) touched.insert(lens_sector_key(s, span));
        }
        bytes += n;
        (store ? w->written : w->read)[span] = 1;
    });
    if (!sectors.empty()) {
        std::sort(sectors.begin(), sectors.end());
        size_t distinct = std::unique(sectors.begin(), sectors.end()) - sectors.begin();
        w->counts[store ? LENS_GLOBAL_STORES : LENS_GLOBAL_LOADS] += 1;
        w->counts[store ? LENS_GLOBAL_STORE_SECTORS : LENS_GLOBAL_LOAD_SECTORS] += distinct;
        w->counts[store ? LENS_GLOBAL_STORE_BYTES : LENS_GLOBAL_LOAD_BYTES] += bytes;
    }
    w->busy = false;
}

// This thread's instance of the kernel library's thread-local block, the one holding
// `range[0]`: where `__shared__` arrays live.
static int lens_find_tls(struct dl_phdr_info* info, size_t, void* data) {
    uintptr_t* range = (uintptr_t*)data;
    if (!info->dlpi_tls_data) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type != PT_TLS) continue;
        uintptr_t lo = (uintptr_t)info->dlpi_tls_data, hi = lo + info->dlpi_phdr[i].p_memsz;
        if (range[0] >= lo && range[0] < hi) {
            range[0] = lo;
            range[1] = hi;
            return 1;
        }
    }
    return 0;
}

// `library_tls`: an address in this thread's thread-local block of the kernel's library.
static void lens_begin_launch(LensWorker* w, const Lens* lens, const void* library_tls) {
    w->lens = lens;
    uintptr_t range[2] = {(uintptr_t)library_tls, 0};
    if (dl_iterate_phdr(lens_find_tls, range)) w->tls_lo = range[0], w->tls_hi = range[1];
    w->read.assign(lens->nspans, 0);
    w->written.assign(lens->nspans, 0);
}

static void lens_begin_block(LensWorker* w, unsigned nthreads, const unsigned char* smem,
                             size_t shared) {
    w->nthreads = nthreads;
    w->smem_lo = (uintptr_t)smem;
    w->smem_hi = w->smem_lo + (smem ? shared : 0);
    w->events.resize(nthreads);
    for (auto& v : w->events) v.clear();
    w->counts[LENS_THREADS] += nthreads;
    w->counts[LENS_BLOCKS] += 1;
    w->recording = true;  // last: the bookkeeping above is not the kernel's
}

// The cost of one warp instruction's lanes: `accesses` of one space and direction.
static void lens_instruction(LensWorker* w, const std::vector<const LensEvent*>& accesses) {
    const LensEvent& first = *accesses[0];
    unsigned long long* c = w->counts;
    if (first.space == LENS_GLOBAL) {
        std::vector<uintptr_t> sectors;
        unsigned long long bytes = 0;
        auto& touched = first.store ? w->written_sectors : w->read_sectors;
        for (const LensEvent* e : accesses) {
            for (uintptr_t s = e->addr >> 5; s <= (e->addr + e->bytes - 1) >> 5; s++) {
                sectors.push_back(s);
                if (e->span < 256) touched.insert(lens_sector_key(s, e->span));
            }
            bytes += e->bytes;
            (e->store ? w->written : w->read)[e->span] = 1;
        }
        std::sort(sectors.begin(), sectors.end());
        size_t n = std::unique(sectors.begin(), sectors.end()) - sectors.begin();
        c[first.store ? LENS_GLOBAL_STORES : LENS_GLOBAL_LOADS] += 1;
        c[first.store ? LENS_GLOBAL_STORE_SECTORS : LENS_GLOBAL_LOAD_SECTORS] += n;
        c[first.store ? LENS_GLOBAL_STORE_BYTES : LENS_GLOBAL_LOAD_BYTES] += bytes;
        return;
    }
    unsigned width = 0;
    for (const LensEvent* e : accesses) width = std::max(width, e->bytes);
    unsigned lanes_per_phase = width <= 4 ? 32 : width <= 8 ? 16 : 8;
    c[first.store ? LENS_SHARED_STORES : LENS_SHARED_LOADS] += 1;
    for (unsigned phase = 0; phase < 32 / lanes_per_phase; phase++) {
        std::vector<uintptr_t> words[32];
        bool active = false;
        for (const LensEvent* e : accesses) {
            if (e->lane / lanes_per_phase != phase) continue;
            active = true;
            for (uintptr_t word = e->addr >> 2; word <= (e->addr + e->bytes - 1) >> 2; word++) {
                words[word % 32].push_back(word);
            }
        }
        if (!active) continue;
        size_t most = 1;
        for (auto& bank : words) {
            std::sort(bank.begin(), bank.end());
            most = std::max(most, (size_t)(std::unique(bank.begin(), bank.end()) - bank.begin()));
        }
        c[LENS_SHARED_WAVEFRONTS] += most;
        c[LENS_SHARED_IDEAL_WAVEFRONTS] += 1;
    }
}

struct LensKey {
    uintptr_t site;
    unsigned occurrence;
    unsigned char store, space;
    bool operator==(const LensKey& o) const {
        return site == o.site && occurrence == o.occurrence && store == o.store &&
               space == o.space;
    }
};
struct LensKeyHash {
    size_t operator()(const LensKey& k) const {
        return std::hash<uintptr_t>()(k.site) * 31 + k.occurrence * 4 + k.store * 2 + k.space;
    }
};

// Groups each warp's accesses into warp instructions and counts them.
static void lens_end_block(LensWorker* w) {
    w->recording = false;
    for (unsigned first = 0; first < w->nthreads; first += 32) {
        std::unordered_map<LensKey, std::vector<const LensEvent*>, LensKeyHash> groups;
        std::vector<LensKey> order;
        for (unsigned t = first; t < first + 32 && t < w->nthreads; t++) {
            std::unordered_map<uint64_t, unsigned> seen;
            for (LensEvent& e : w->events[t]) {
                uint64_t id = (uint64_t)e.site * 4 + e.store * 2 + e.space;
                LensKey key{e.site, seen[id]++, e.store, e.space};
                e.lane = (unsigned char)(t - first);
                auto& g = groups[key];
                if (g.empty()) order.push_back(key);
                g.push_back(&e);
            }
        }
        for (const LensKey& key : order) lens_instruction(w, groups[key]);
    }
}

// The sectors every OS thread's sampled blocks touched, merged (blocks share sectors).
struct LensSectors {
    std::unordered_set<uint64_t> read, written;
};

static void lens_end_launch(LensWorker* w, Lens* lens, LensSectors* all, std::mutex& mutex) {
    std::lock_guard<std::mutex> lock(mutex);
    for (int c = 0; c < LENS_COUNTERS; c++) lens->counts[c] += w->counts[c];
    for (int i = 0; i < lens->nspans; i++) {
        lens->read[i] |= w->read[i];
        lens->written[i] |= w->written[i];
    }
    all->read.insert(w->read_sectors.begin(), w->read_sectors.end());
    all->written.insert(w->written_sectors.begin(), w->written_sectors.end());
}

static void lens_tally(Lens* lens, const LensSectors& all) {
    for (int i = 0; i < lens->nspans; i++) lens->read_sectors[i] = lens->written_sectors[i] = 0;
    for (uint64_t key : all.read) lens->read_sectors[key & 255]++;
    for (uint64_t key : all.written) lens->written_sectors[key & 255]++;
}

static bool lens_sampled(const Lens* lens, unsigned long long block) {
    return std::binary_search(lens->sample, lens->sample + lens->nsample, block);
}

#endif  // MC_EMU_LENS

}  // namespace mc_emu

#ifdef MC_EMU_LENS
#define MC_LENS_ACCESS(site, addr, bytes, store) \
    ::mc_emu::lens_access(::mc_emu::site, (uintptr_t)(addr), (bytes), (store))
#define MC_LENS_COUNT(counter, n) ::mc_emu::lens_count(::mc_emu::counter, (n))
// The emulator's helpers that record their accesses themselves, and its warp collectives, which
// touch the lanes' memory on the lanes' behalf: their own accesses are not the kernel's.
#define MC_LENS_UNINSTRUMENTED __attribute__((no_sanitize_address))

// The kernel's own counts of what it computes, inserted by the lens build of its IR.
__attribute__((no_sanitize_address)) static inline void mc_lens_ops(
    unsigned long long flops, unsigned long long fp, unsigned long long i32,
    unsigned long long i64, unsigned long long divides, unsigned long long special,
    unsigned long long conversions, unsigned long long address) {
    if (mc_emu::LensWorker* w = mc_emu::lens_recording()) {
        w->counts[mc_emu::LENS_FLOPS] += flops;
        w->counts[mc_emu::LENS_FP_INSTRUCTIONS] += fp;
        w->counts[mc_emu::LENS_INT_INSTRUCTIONS] += i32;
        w->counts[mc_emu::LENS_INT64_INSTRUCTIONS] += i64;
        w->counts[mc_emu::LENS_INT_DIVIDES] += divides;
        w->counts[mc_emu::LENS_SPECIAL] += special;
        w->counts[mc_emu::LENS_CONVERSIONS] += conversions;
        w->counts[mc_emu::LENS_ADDRESS_INSTRUCTIONS] += address;
    }
}

// What the kernel-address instrumentation calls before each access.
#define MC_EMU_HOOK extern "C" __attribute__((no_sanitize_address, visibility("hidden")))
#define MC_EMU_HOOKS(N)                                                                 \
    MC_EMU_HOOK void __asan_load##N##_noabort(uintptr_t p) {                            \
        mc_emu::lens_access((uintptr_t)__builtin_return_address(0), p, N, 0);        \
    }                                                                                   \
    MC_EMU_HOOK void __asan_store##N##_noabort(uintptr_t p) {                           \
        mc_emu::lens_access((uintptr_t)__builtin_return_address(0), p, N, 1);        \
    }
MC_EMU_HOOKS(1)
MC_EMU_HOOKS(2)
MC_EMU_HOOKS(4)
MC_EMU_HOOKS(8)
MC_EMU_HOOKS(16)
#undef MC_EMU_HOOKS
MC_EMU_HOOK void __asan_loadN_noabort(uintptr_t p, size_t n) {
    mc_emu::lens_access((uintptr_t)__builtin_return_address(0), p, n, 0);
}
MC_EMU_HOOK void __asan_storeN_noabort(uintptr_t p, size_t n) {
    mc_emu::lens_access((uintptr_t)__builtin_return_address(0), p, n, 1);
}
MC_EMU_HOOK void __asan_handle_no_return() {}
#undef MC_EMU_HOOK
#else
#define MC_LENS_ACCESS(site, addr, bytes, store) ((void)0)
#define MC_LENS_COUNT(counter, n) ((void)0)
#define MC_LENS_UNINSTRUMENTED
#endif

#endif  // MC_EMU_LENS_H
