/* fastload core: CRC-32C (see crc32c.h). */
#include "core/source/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define FL_CRC32C_X86 1
#endif

#define POLY 0x82f63b78u /* Castagnoli, reflected */

/* table[k][b]: the CRC of byte b followed by k zero bytes, for slicing by
 * 8.  Filled once (pthread_once), then only read. */
static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void fill_table(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (POLY & (0u - (c & 1u)));
        table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int k = 1; k < 8; k++)
            table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xff];
}

uint32_t fl_crc32c_table(uint32_t crc, const void *data, size_t size)
{
    pthread_once(&table_once, fill_table);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; size >= 8; size -= 8, p += 8) {
        /* Little-endian lanes, assembled byte by byte: no alignment needed. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
            table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
            table[0][p[7]];
    }
    for (; size > 0; size--, p++)
        c = (c >> 8) ^ table[0][(c ^ *p) & 0xff];
    return ~c;
}

#ifdef FL_CRC32C_X86

__attribute__((target("sse4.2"))) uint32_t fl_crc32c_hw(uint32_t crc, const void *data,
                                                        size_t size)
{
    const unsigned char *p = data;
    uint64_t c = ~crc;
    for (; size > 0 && ((uintptr_t)p & 7u); size--, p++)
        c = _mm_crc32_u8((uint32_t)c, *p);
    for (; size >= 8; size -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        c = _mm_crc32_u64(c, v);
    }
    for (; size > 0; size--, p++)
        c = _mm_crc32_u8((uint32_t)c, *p);
    return ~(uint32_t)c;
}

int fl_crc32c_hw_available(void)
{
    return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

#else

uint32_t fl_crc32c_hw(uint32_t crc, const void *data, size_t size)
{
    return fl_crc32c_table(crc, data, size); /* never chosen: no instruction here */
}

int fl_crc32c_hw_available(void)
{
    return 0;
}

#endif

/* Which implementation fl_crc32c runs, decided on first use. */
static int use_hw;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    use_hw = fl_crc32c_hw_available();
}

uint32_t fl_crc32c(uint32_t crc, const void *data, size_t size)
{
    pthread_once(&choose_once, choose);
    return use_hw ? fl_crc32c_hw(crc, data, size) : fl_crc32c_table(crc, data, size);
}
