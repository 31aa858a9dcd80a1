/* minicomp CUDA cluster and register-reallocation helpers: the device code behind the
   kernel-IR intrinsics of intrinsics_cluster.py, as the lower-case macros below. Generated
   sources carry this text after wgmma.h; it uses mma.h's mc_shared_address. setmaxnreg exists
   only in the architecture-specific sm_90a (NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL for it);
   compiled for anything else such a helper is a template whose static_assert names the
   primitive and the architecture it needs, so a kernel using it fails to compile saying so.
   Under the emulator (MC_EMULATE) emu_cluster.h defines the same macros. */
#ifndef MINICOMP_CLUSTER_H
#define MINICOMP_CLUSTER_H

#if !defined(MC_EMULATE) && defined(__CUDA_ARCH__)

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
