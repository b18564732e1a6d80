/* fastload core: gathering rows of in-memory or memory-mapped arrays into a
 * batch — the native path of ArrayDataset and TokenDataset.
 *
 * A source is a table of equally sized rows at a fixed byte stride (a NumPy
 * array whose rows are contiguous, or a memory-mapped file).  Callers check
 * every index against the row count before calling: these functions trust
 * them.  They touch no shared state, so any number of threads may gather
 * from one source at once.
 *
 * The one failure left is the source's memory going away under the copy: a
 * mapped file truncated or rewritten after it was mapped (or whose storage
 * fails) raises SIGBUS on the next read of a page past its new end.  Each
 * copy runs under the bus-error guard (bus_guard.h), which turns that
 * signal into FL_ERR_IO.
 */
#ifndef FL_GATHER_H
#define FL_GATHER_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_rows {
    const char *base;      /* row 0 */
    int64_t count;         /* number of rows */
    int64_t stride;        /* bytes from one row to the next; may be negative */
    size_t row_bytes;      /* contiguous bytes a row */
    int file_backed;       /* nonzero for a file mapping: worth prefetching */
} fl_rows;

/* Copies rows idx[0..n) of `src` to consecutive rows of `dst`
 * (n * row_bytes bytes).  For file-backed sources whose pages this thread
 * has recently found missing from the page cache, every row is first
 * advised as needed (MADV_WILLNEED), so a cold cache reads them in parallel
 * rather than one fault at a time.
 *
 * Returns FL_OK, or FL_ERR_IO when reading `src` raised a bus error (see
 * above); then *failed is the position in idx of the row being read (n when
 * the fault lies in no row), and dst holds a partial batch. */
int fl_gather_rows(const fl_rows *src, const int64_t *idx, size_t n, char *dst, size_t *failed);

/* Token windows: for each start s = starts[i], writes tokens[s .. s+len) to
 * row i of `x` and tokens[s+1 .. s+len+1) to row i of `y` (each n x len),
 * widened to int64.  Tokens are `token_size` (1, 2, 4 or 8) bytes, signed
 * when `is_signed` (8-byte tokens always are).  The caller guarantees
 * s + len + 1 <= number of tokens.  Prefetches and fails as fl_gather_rows
 * does: FL_OK, or FL_ERR_IO with *failed the position in starts of the
 * window being read. */
int fl_gather_windows(const void *tokens, int token_size, int is_signed, int file_backed,
                      const int64_t *starts, size_t n, size_t len, int64_t *x, int64_t *y,
                      size_t *failed);

#endif /* FL_GATHER_H */
