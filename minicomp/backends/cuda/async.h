/* minicomp CUDA asynchronous-barrier and bulk-copy helpers: the device functions behind the
   kernel-IR intrinsics mbarrier_*, fence_proxy_async and bulk_copy_g2s (rendered by
   intrinsics_async.py). Generated sources carry this text after mma.h, whose
   mc_shared_address it uses. On the GPU each helper is inline PTX: mbarrier init, arrive and
   the parity test need sm_80; arrive.expect_tx, try_wait, the async-proxy fence and
   cp.async.bulk need sm_90. Compiled for an older architecture, a helper is a template whose
   static_assert names the primitive and the architecture it needs, so a kernel using it fails
   to compile saying so. Under the emulator (MC_EMULATE) emu_async.h defines the same names.

   A barrier is a uint64_t in shared memory. Waits name the phase by parity: waiting for
   parity p returns once the barrier's current phase has parity 1 - p. */
#ifndef MINICOMP_ASYNC_H
#define MINICOMP_ASYNC_H

#if !defined(MC_EMULATE) && defined(__CUDA_ARCH__)

/* A helper the architecture lacks: instantiating it (calling it) fails, naming it. */
#define MC_ASYNC_NEEDS(NAME, ARCH, PARAMS)                                                  \
    template <int Arch = __CUDA_ARCH__>                                                     \
    MC_DEVICE void mc_##NAME PARAMS {                                                       \
        static_assert(Arch >= ARCH * 10, #NAME "() needs sm_" #ARCH " or newer; this kernel " \
                                              "is compiled for an older architecture");     \
    }

#if __CUDA_ARCH__ >= 800

MC_DEVICE void mc_mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mc_shared_address(bar)),
                 "r"(count)
                 : "memory");
}

/* The state token goes to a scratch register: waits name phases by parity. */
MC_DEVICE void mc_mbarrier_arrive(uint64_t* bar) {
    asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(
                     mc_shared_address(bar))
                 : "memory");
}

/* Whether the phase of parity `parity` has completed; false may come early (loop on it). */
MC_DEVICE bool mc_mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(mc_shared_address(bar)), "r"(parity)
        : "memory");
#else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(mc_shared_address(bar)), "r"(parity)
        : "memory");
#endif
    return done != 0;
}

MC_DEVICE void mc_mbarrier_wait(uint64_t* bar, uint32_t parity) {
    while (!mc_mbarrier_try_wait_parity(bar, parity)) {
    }
}

#else
MC_ASYNC_NEEDS(mbarrier_init, 80, (uint64_t*, uint32_t))
MC_ASYNC_NEEDS(mbarrier_arrive, 80, (uint64_t*))
template <int Arch = __CUDA_ARCH__>
MC_DEVICE bool mc_mbarrier_try_wait_parity(uint64_t*, uint32_t) {
    static_assert(Arch >= 800, "mbarrier_try_wait_parity() needs sm_80 or newer; this kernel is "
                               "compiled for an older architecture");
    return true;
}
MC_ASYNC_NEEDS(mbarrier_wait, 80, (uint64_t*, uint32_t))
#endif /* sm_80 */

#if __CUDA_ARCH__ >= 900

MC_DEVICE void mc_mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile(
        "{\n .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::
            "r"(mc_shared_address(bar)),
        "r"(bytes)
        : "memory");
}

MC_DEVICE void mc_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* `bytes` (a multiple of 16) from global `src` to shared `dst`, both 16-byte aligned; the
   bytes complete transactions on `bar`. */
MC_DEVICE void mc_bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        :
        : "r"(mc_shared_address(dst)), "l"(src), "r"(bytes), "r"(mc_shared_address(bar))
        : "memory");
}

#else
MC_ASYNC_NEEDS(mbarrier_arrive_expect_tx, 90, (uint64_t*, uint32_t))
MC_ASYNC_NEEDS(fence_proxy_async, 90, ())
MC_ASYNC_NEEDS(bulk_copy_g2s, 90, (void*, const void*, uint32_t, uint64_t*))
#endif /* sm_90 */

#undef MC_ASYNC_NEEDS
#endif /* not emulated */
#endif /* MINICOMP_ASYNC_H */
