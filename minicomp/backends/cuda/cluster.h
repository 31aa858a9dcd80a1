/* minicomp CUDA cluster and register-reallocation helpers: the device code behind the
   kernel-IR intrinsics of intrinsics_cluster.py (cluster rank, barrier, remote mbarrier
   arrive, multicast TMA load, setmaxnreg). Generated sources carry this text after wgmma.h;
   it uses mma.h's mc_shared_address and tma.h's mc_tensor_map. The cluster helpers need
   sm_90; compiled for an older architecture each is a template whose static_assert names
   the primitive and sm_90. setmaxnreg exists
   only in the architecture-specific sm_90a (NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL for it);
   compiled for anything else such a helper is a template whose static_assert names the
   primitive and the architecture it needs, so a kernel using it fails to compile saying so.
   Under the emulator (MC_EMULATE) emu_cluster.h defines the same macros. */
#ifndef MINICOMP_CLUSTER_H
#define MINICOMP_CLUSTER_H

#if !defined(MC_EMULATE) && defined(__CUDA_ARCH__)

#if __CUDA_ARCH__ >= 900

MC_DEVICE int32_t mc_cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return (int32_t)r;
}

MC_DEVICE int32_t mc_cluster_nctarank() {
    uint32_t n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return (int32_t)n;
}

MC_DEVICE void mc_cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }

MC_DEVICE void mc_cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

MC_DEVICE void mc_cluster_sync() {
    mc_cluster_arrive();
    mc_cluster_wait();
}

MC_DEVICE void mc_fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* The shared::cluster address of `p`'s offset in CTA `cta` of the cluster. */
MC_DEVICE uint32_t mc_cluster_address(const void* p, uint32_t cta) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(remote)
                 : "r"(mc_shared_address(p)), "r"(cta));
    return remote;
}

/* One arrival on the barrier at `bar`'s offset in CTA `cta` of the cluster. */
MC_DEVICE void mc_mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                     mc_cluster_address(bar, cta))
                 : "memory");
}

/* Element `p` of this CTA's shared memory, read / written in CTA `cta` of the cluster. */
template <class T>
MC_DEVICE T mc_cluster_load(const T* p, uint32_t cta) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cluster_load() moves 4 or 8 bytes");
    uint32_t remote = mc_cluster_address(p, cta);
    union {
        T value;
        uint32_t b32;
        unsigned long long b64;
    } out;
    if (sizeof(T) == 4) {
        asm volatile("ld.shared::cluster.b32 %0, [%1];\n" : "=r"(out.b32) : "r"(remote) : "memory");
    } else {
        asm volatile("ld.shared::cluster.b64 %0, [%1];\n" : "=l"(out.b64) : "r"(remote) : "memory");
    }
    return out.value;
}

template <class T>
MC_DEVICE void mc_cluster_store(T* p, uint32_t cta, T value) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cluster_store() moves 4 or 8 bytes");
    uint32_t remote = mc_cluster_address(p, cta);
    union {
        T value;
        uint32_t b32;
        unsigned long long b64;
    } in;
    in.b64 = 0;
    in.value = value;
    if (sizeof(T) == 4) {
        asm volatile("st.shared::cluster.b32 [%0], %1;\n" ::"r"(remote), "r"(in.b32) : "memory");
    } else {
        asm volatile("st.shared::cluster.b64 [%0], %1;\n" ::"r"(remote), "l"(in.b64) : "memory");
    }
}

/* tma.h's loads, the box and its bytes landing at the same shared offsets in every CTA of
   `mask` (bit r: rank r of the cluster). */
#define MC_TMA_MULTICAST(N, PARAMS, OPERANDS, ARGS)                                             \
    MC_DEVICE void mc_tma_load_multicast_##N##d(void* dst, const mc_tensor_map* map,           \
                                                uint64_t* bar, uint16_t mask, PARAMS) {        \
        asm volatile("cp.async.bulk.tensor." #N                                                 \
                     "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"               \
                     ".multicast::cluster [%0], [%1, {" OPERANDS "}], [%2], %3;\n"              \
                     :                                                                          \
                     : "r"(mc_shared_address(dst)), "l"(map), "r"(mc_shared_address(bar)),      \
                       "h"(mask), ARGS                                                          \
                     : "memory");                                                               \
    }
#define MC_COMMA ,
MC_TMA_MULTICAST(1, int32_t c0, "%4", "r"(c0))
MC_TMA_MULTICAST(2, int32_t c0 MC_COMMA int32_t c1, "%4, %5", "r"(c0) MC_COMMA "r"(c1))
MC_TMA_MULTICAST(3, int32_t c0 MC_COMMA int32_t c1 MC_COMMA int32_t c2, "%4, %5, %6",
                 "r"(c0) MC_COMMA "r"(c1) MC_COMMA "r"(c2))
MC_TMA_MULTICAST(4, int32_t c0 MC_COMMA int32_t c1 MC_COMMA int32_t c2 MC_COMMA int32_t c3,
                 "%4, %5, %6, %7", "r"(c0) MC_COMMA "r"(c1) MC_COMMA "r"(c2) MC_COMMA "r"(c3))
MC_TMA_MULTICAST(5,
                 int32_t c0 MC_COMMA int32_t c1 MC_COMMA int32_t c2 MC_COMMA int32_t c3
                     MC_COMMA int32_t c4,
                 "%4, %5, %6, %7, %8",
                 "r"(c0) MC_COMMA "r"(c1) MC_COMMA "r"(c2) MC_COMMA "r"(c3) MC_COMMA "r"(c4))
#undef MC_COMMA
#undef MC_TMA_MULTICAST

#else
/* A helper the architecture lacks: instantiating it (calling it) fails, naming it. */
#define MC_CLUSTER_NEEDS_SM90(NAME, RET, PARAMS)                                          \
    template <int Arch = __CUDA_ARCH__>                                                   \
    MC_DEVICE RET mc_##NAME PARAMS {                                                      \
        static_assert(Arch >= 900, #NAME "() needs sm_90 or newer; this kernel is compiled " \
                                         "for an older architecture");                    \
        return RET();                                                                     \
    }
MC_CLUSTER_NEEDS_SM90(cluster_ctarank, int32_t, ())
MC_CLUSTER_NEEDS_SM90(cluster_nctarank, int32_t, ())
MC_CLUSTER_NEEDS_SM90(cluster_arrive, void, ())
MC_CLUSTER_NEEDS_SM90(cluster_wait, void, ())
MC_CLUSTER_NEEDS_SM90(cluster_sync, void, ())
MC_CLUSTER_NEEDS_SM90(fence_mbarrier_init, void, ())
MC_CLUSTER_NEEDS_SM90(mbarrier_arrive_cluster, void, (uint64_t*, uint32_t))
template <class T>
MC_DEVICE T mc_cluster_load(const T*, uint32_t) {
    static_assert(sizeof(T) == 0, "cluster_load() needs sm_90 or newer; this kernel is compiled "
                                  "for an older architecture");
    return T();
}
template <class T>
MC_DEVICE void mc_cluster_store(T*, uint32_t, T) {
    static_assert(sizeof(T) == 0, "cluster_store() needs sm_90 or newer; this kernel is compiled "
                                  "for an older architecture");
}
#define MC_TMA_MULTICAST_NEEDS_SM90(N)                                                     \
    template <class... Coords>                                                             \
    MC_DEVICE void mc_tma_load_multicast_##N##d(void*, const mc_tensor_map*, uint64_t*,    \
                                                uint16_t, Coords...) {                     \
        static_assert(sizeof...(Coords) < 0, "tma_load() with multicast needs sm_90 or "    \
                                             "newer; this kernel is compiled for an older " \
                                             "architecture");                              \
    }
MC_TMA_MULTICAST_NEEDS_SM90(1)
MC_TMA_MULTICAST_NEEDS_SM90(2)
MC_TMA_MULTICAST_NEEDS_SM90(3)
MC_TMA_MULTICAST_NEEDS_SM90(4)
MC_TMA_MULTICAST_NEEDS_SM90(5)
#undef MC_TMA_MULTICAST_NEEDS_SM90
#undef MC_CLUSTER_NEEDS_SM90
#endif /* sm_90 */

#define mc_setmaxnreg_inc(N) mc_setmaxnreg_inc_<N>()
#define mc_setmaxnreg_dec(N) mc_setmaxnreg_dec_<N>()

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int N>
MC_DEVICE void mc_setmaxnreg_inc_() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
template <int N>
MC_DEVICE void mc_setmaxnreg_dec_() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
#else
/* A helper the architecture lacks: instantiating it (calling it) fails, naming it. */
#define MC_CLUSTER_NEEDS_SM90A(NAME)                                                        \
    template <int N>                                                                        \
    MC_DEVICE void mc_##NAME##_() {                                                         \
        static_assert(N < 0, #NAME "() needs sm_90a; this kernel is compiled for another "   \
                                   "architecture");                                         \
    }
MC_CLUSTER_NEEDS_SM90A(setmaxnreg_inc)
MC_CLUSTER_NEEDS_SM90A(setmaxnreg_dec)
#undef MC_CLUSTER_NEEDS_SM90A
#endif /* sm_90a */

#endif /* not emulated */
#endif /* MINICOMP_CLUSTER_H */
