/* fastload core: CRC-32C (Castagnoli), the checksum of TFRecord framing.
 *
 * Two implementations give the same value: the SSE4.2 crc32 instruction,
 * eight bytes at a time, on CPUs that have it (x86-64, chosen once at run
 * time, as the hot loops' clones are: core/image/simd.h), and a
 * slicing-by-8 table walk everywhere else.  Both are exported so the tests
 * compare them.  No state, no locks: any thread calls them at once.
 */
#ifndef FL_CRC32C_H
#define FL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of `size` bytes at `data`, continuing from `crc` (0 for a
 * first block): fl_crc32c(fl_crc32c(0, a, n), b, m) is the CRC of a then b. */
uint32_t fl_crc32c(uint32_t crc, const void *data, size_t size);

/* The table walk, on any CPU. */
uint32_t fl_crc32c_table(uint32_t crc, const void *data, size_t size);

/* The SSE4.2 instruction; only call it when fl_crc32c_hw_available(). */
uint32_t fl_crc32c_hw(uint32_t crc, const void *data, size_t size);

/* 1 when this CPU runs fl_crc32c_hw (and fl_crc32c uses it), else 0. */
int fl_crc32c_hw_available(void);

/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
static inline uint32_t fl_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

#endif /* FL_CRC32C_H */
