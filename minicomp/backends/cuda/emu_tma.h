// minicomp cuda-emu: the data movement of TMA tensor copies (tma.h's names, on the host).
//
// emu_async.h includes this text and queues the copies (a load lands when its mbarrier phase
// completes, a store when its bulk group is waited for). On cuda-emu a tensor map's 128 bytes
// are minicomp's own description (TmaDesc below, written by
// minicomp/backends/cuda/tensor_map.py): base address, element size, rank, swizzle, the sizes
// and byte strides of the tensor and the box, innermost dimension first as in PTX. A box is
// stored in shared memory row-major (innermost fastest) and swizzled by the map's span
// (swizzle.h); elements outside the tensor load as zeros and are not stored.
#ifndef MC_EMU_TMA_H
#define MC_EMU_TMA_H

#include "swizzle.h"

#define __grid_constant__

namespace mc_emu {

static const uint32_t TMA_MAGIC = 0x4d54434du;  // "MCTM"
static const int TMA_MAX_RANK = 5;

struct TmaDesc {
    uint64_t base;
    uint32_t magic;
    uint32_t elem_bytes;
    uint32_t rank;
    uint32_t swizzle;  // bytes: 0, 32, 64 or 128
    uint64_t dims[TMA_MAX_RANK];
    uint64_t strides[TMA_MAX_RANK];  // bytes; strides[0] is the element size
    uint32_t box[TMA_MAX_RANK];
    uint32_t fill;  // 0: out-of-bounds elements load as zeros
};
static_assert(sizeof(TmaDesc) == 128, "a tensor map is 128 bytes");

static inline uint32_t tma_box_bytes(const TmaDesc& d) {
    uint32_t n = d.elem_bytes;
    for (uint32_t k = 0; k < d.rank; k++) n *= d.box[k];
    return n;
}

// The shared alignment a box needs: 128 bytes, 1024 under a 128-byte swizzle.
static inline uint32_t tma_alignment(const TmaDesc& d) { return d.swizzle == 128 ? 1024 : 128; }

// Calls visit(shared byte offset of the element, global address or null when outside the
// tensor) for each element of the box at `coords` (innermost first), `smem` the box's start.
template <class Visit>
MC_LENS_UNINSTRUMENTED static void tma_each(const TmaDesc& d, const int32_t* coords,
                                            const void* smem, Visit visit) {
    uint32_t idx[TMA_MAX_RANK] = {0, 0, 0, 0, 0};
    uint32_t count = tma_box_bytes(d) / d.elem_bytes;
    unsigned low = (unsigned)(uintptr_t)smem;
    for (uint32_t e = 0; e < count; e++) {
        bool inside = true;
        uint64_t offset = 0;
        for (uint32_t k = 0; k < d.rank; k++) {
            long long c = (long long)coords[k] + idx[k];
            inside = inside && c >= 0 && (uint64_t)c < d.dims[k];
            offset += (uint64_t)c * d.strides[k];
        }
        unsigned linear = e * d.elem_bytes;
        unsigned at = mc_swizzle(low + linear, d.swizzle) - low;
        visit(at, inside ? (char*)(uintptr_t)d.base + offset : (char*)nullptr);
        for (uint32_t k = 0; k < d.rank && ++idx[k] == d.box[k]; k++) idx[k] = 0;
    }
}

// The box at `coords` from global memory into shared `dst`, swizzled; zeros outside.
MC_LENS_UNINSTRUMENTED static void tma_land(const TmaDesc& d, const int32_t* coords, void* dst) {
    char* out = (char*)dst;
    uint32_t n = d.elem_bytes;
    tma_each(d, coords, dst, [&](unsigned at, const char* g) {
        if (g)
            memcpy(out + at, g, n);
        else
            memset(out + at, 0, n);
    });
}

// The elements of the box at `coords` inside the tensor, from shared `src` (swizzled; `data`
// holds its bytes, a snapshot) to global memory.
MC_LENS_UNINSTRUMENTED static void tma_write(const TmaDesc& d, const int32_t* coords,
                                             const void* src, const unsigned char* data) {
    uint32_t n = d.elem_bytes;
    tma_each(d, coords, src, [&](unsigned at, char* g) {
        if (g) memcpy(g, data + at, n);
    });
}

}  // namespace mc_emu

#endif  // MC_EMU_TMA_H
