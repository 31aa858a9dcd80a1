/* minicomp: the shared-memory swizzle of Hopper's TMA copies and wgmma operands. A
   `span`-byte swizzle (32, 64 or 128; 0 for none) permutes the 16-byte chunks of each
   span-byte row: chunk c of row r is stored at chunk c ^ (r % (span / 16)), rows counted in
   128-byte units of the shared address. The pattern repeats every 8 * span bytes, so a
   swizzled buffer starts at an address aligned to that (256, 512 or 1024 bytes). */
#ifndef MINICOMP_SWIZZLE_H
#define MINICOMP_SWIZZLE_H

/* The byte address where the byte at unswizzled address `addr` lives under a `span`-byte
   swizzle. */
static inline unsigned mc_swizzle(unsigned addr, unsigned span) {
    unsigned mask = span == 128 ? 7u : span == 64 ? 3u : span == 32 ? 1u : 0u;
    return addr ^ (((addr >> 7) & mask) << 4);
}

#endif /* MINICOMP_SWIZZLE_H */
