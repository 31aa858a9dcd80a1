/* minicomp CUDA TMA helpers: the device functions behind the kernel-IR intrinsics tma_load,
   tma_store, bulk_commit_group, bulk_wait_group and bulk_wait_group_read (rendered by
   intrinsics_tma.py). Generated sources carry this text after async.h; it uses mma.h's
   mc_shared_address. A tensor map is a kernel parameter `const __grid_constant__ mc_tensor_map`:
   the driver's 128-byte, 64-byte aligned CUtensorMap (cuTensorMapEncodeTiled) on the GPU, or
   under the emulator minicomp's own description of the same size (emu_tma.h reads it). The
   copies need sm_90; compiled for an older architecture a helper is a template whose
   static_assert names the primitive and sm_90. Coordinates are in PTX's order, the innermost
   dimension first. Under the emulator (MC_EMULATE) emu_async.h defines the same names. */
#ifndef MINICOMP_TMA_H
#define MINICOMP_TMA_H

struct alignas(64) mc_tensor_map {
    unsigned long long opaque[16];
};

#if defined(MC_EMULATE)
/* The emulator's launch wrappers pass a tensor map by the address of its bytes, which ctypes
   aligns to 8 only: copied into an aligned value here. */
static inline mc_tensor_map mc_emu_tensor_map(const void* bytes) {
    mc_tensor_map m;
    memcpy(&m, bytes, sizeof m);
    return m;
}
#endif

#if !defined(MC_EMULATE) && defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 900

MC_DEVICE void mc_tma_load_1d(void* dst, const mc_tensor_map* map, uint64_t* bar,
                              int32_t c0) {
    asm volatile(
        "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3}], [%2];\n"
        :
        : "r"(mc_shared_address(dst)), "l"(map), "r"(mc_shared_address(bar)),
          "r"(c0)
        : "memory");
}
MC_DEVICE void mc_tma_load_2d(void* dst, const mc_tensor_map* map, uint64_t* bar,
                              int32_t c0, int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4}], [%2];\n"
        :
        : "r"(mc_shared_address(dst)), "l"(map), "r"(mc_shared_address(bar)),
          "r"(c0), "r"(c1)
        : "memory");
}
MC_DEVICE void mc_tma_load_3d(void* dst, const mc_tensor_map* map, uint64_t* bar,
                              int32_t c0, int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5}], [%2];\n"
        :
        : "r"(mc_shared_address(dst)), "l"(map), "r"(mc_shared_address(bar)),
          "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
MC_DEVICE void mc_tma_load_4d(void* dst, const mc_tensor_map* map, uint64_t* bar,
                              int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5, %6}], [%2];\n"
        :
        : "r"(mc_shared_address(dst)), "l"(map), "r"(mc_shared_address(bar)),
          "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
MC_DEVICE void mc_tma_load_5d(void* dst, const mc_tensor_map* map, uint64_t* bar,
                              int32_t c0, int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
        :
        : "r"(mc_shared_address(dst)), "l"(map), "r"(mc_shared_address(bar)),
          "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

MC_DEVICE void mc_tma_store_1d(const mc_tensor_map* map, const void* src,
                               int32_t c0) {
    asm volatile(
        "cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];\n"
        :
        : "l"(map), "r"(mc_shared_address(src)), "r"(c0)
        : "memory");
}
MC_DEVICE void mc_tma_store_2d(const mc_tensor_map* map, const void* src,
                               int32_t c0, int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
        :
        : "l"(map), "r"(mc_shared_address(src)), "r"(c0), "r"(c1)
        : "memory");
}
MC_DEVICE void mc_tma_store_3d(const mc_tensor_map* map, const void* src,
                               int32_t c0, int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
        :
        : "l"(map), "r"(mc_shared_address(src)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
MC_DEVICE void mc_tma_store_4d(const mc_tensor_map* map, const void* src,
                               int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
        :
        : "l"(map), "r"(mc_shared_address(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
MC_DEVICE void mc_tma_store_5d(const mc_tensor_map* map, const void* src,
                               int32_t c0, int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
        :
        : "l"(map), "r"(mc_shared_address(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

MC_DEVICE void mc_bulk_commit_group() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Until at most N of this thread's committed bulk groups are pending (writes done). */
template <int N>
MC_DEVICE void mc_bulk_wait_group() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Until at most N of them still read their shared sources. */
template <int N>
MC_DEVICE void mc_bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

#else
/* A helper the architecture lacks: instantiating it (calling it) fails, naming it. */
#define MC_TMA_NEEDS(NAME, PRIMITIVE, PARAMS)                                               \
    template <int Arch = __CUDA_ARCH__>                                                     \
    MC_DEVICE void mc_##NAME PARAMS {                                                       \
        static_assert(Arch >= 900, #PRIMITIVE "() needs sm_90 or newer; this kernel is "    \
                                              "compiled for an older architecture");        \
    }
MC_TMA_NEEDS(tma_load_1d, tma_load,
             (void*, const mc_tensor_map*, uint64_t*, int32_t))
MC_TMA_NEEDS(tma_store_1d, tma_store,
             (const mc_tensor_map*, const void*, int32_t))
MC_TMA_NEEDS(tma_load_2d, tma_load,
             (void*, const mc_tensor_map*, uint64_t*, int32_t, int32_t))
MC_TMA_NEEDS(tma_store_2d, tma_store,
             (const mc_tensor_map*, const void*, int32_t, int32_t))
MC_TMA_NEEDS(tma_load_3d, tma_load,
             (void*, const mc_tensor_map*, uint64_t*, int32_t, int32_t, int32_t))
MC_TMA_NEEDS(tma_store_3d, tma_store,
             (const mc_tensor_map*, const void*, int32_t, int32_t, int32_t))
MC_TMA_NEEDS(tma_load_4d, tma_load,
             (void*, const mc_tensor_map*, uint64_t*, int32_t, int32_t, int32_t, int32_t))
MC_TMA_NEEDS(tma_store_4d, tma_store,
             (const mc_tensor_map*, const void*, int32_t, int32_t, int32_t, int32_t))
MC_TMA_NEEDS(tma_load_5d, tma_load,
             (void*, const mc_tensor_map*, uint64_t*, int32_t, int32_t, int32_t, int32_t, int32_t))
MC_TMA_NEEDS(tma_store_5d, tma_store,
             (const mc_tensor_map*, const void*, int32_t, int32_t, int32_t, int32_t, int32_t))
MC_TMA_NEEDS(bulk_commit_group, bulk_commit_group, ())
#undef MC_TMA_NEEDS
template <int N, int Arch = __CUDA_ARCH__>
MC_DEVICE void mc_bulk_wait_group() {
    static_assert(Arch >= 900, "bulk_wait_group() needs sm_90 or newer; this kernel is "
                               "compiled for an older architecture");
}
template <int N, int Arch = __CUDA_ARCH__>
MC_DEVICE void mc_bulk_wait_group_read() {
    static_assert(Arch >= 900, "bulk_wait_group_read() needs sm_90 or newer; this kernel is "
                               "compiled for an older architecture");
}
#endif /* sm_90 */
#endif /* not emulated */
#endif /* MINICOMP_TMA_H */
