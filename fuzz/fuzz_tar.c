/* libFuzzer target: untrusted bytes as a tar shard.
 *
 * The input is the whole file.  It is indexed twice, from memory and
 * through a memfd with a small read window (512 bytes to 4 KiB, chosen by
 * the input's length) so that window refills, copies across the window's
 * edge and the skip-ahead read all run; both must agree to the byte, error
 * message included.  A successful index is then checked against the rules
 * the dataset relies on (names well formed and accepted, data inside the
 * file) and grouped into WebDataset samples, whose layout is checked too.
 * Every member's first and last data bytes are read, so a sanitizer sees an
 * offset past the input.
 *
 * Built by fuzz/Makefile with clang -fsanitize=fuzzer, or with any compiler
 * and fuzz/replay.c as a plain program (see fuzz_pipeline.c).
 */
#define _GNU_SOURCE
#include "core/source/tar.h"
#include "core/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond))                                                                            \
            abort();                                                                            \
    } while (0)

static volatile uint8_t sink;

/* The same index read through a file descriptor, or status 1 when no memfd
 * can be made here. */
static int index_through_fd(const uint8_t *data, size_t size, fl_tar_index *index,
                            fl_tar_error *error)
{
    int fd = memfd_create("fuzz_tar", MFD_CLOEXEC);
    if (fd < 0)
        return 1;
    size_t written = 0;
    while (written < size) {
        ssize_t n = write(fd, data + written, size - written);
        if (n <= 0) {
            close(fd);
            return 1;
        }
        written += (size_t)n;
    }
    size_t window = FL_TAR_BLOCK * (1 + size % 8);
    int status = fl_tar_index_fd(fd, window, index, error);
    close(fd);
    return status;
}

static void check_name(const char *name, size_t length)
{
    CHECK(length > 0 && name[0] != '/');
    for (size_t start = 0; start <= length;) {
        const char *slash = memchr(name + start, '/', length - start);
        size_t end = slash ? (size_t)(slash - name) : length;
        CHECK(!(end - start == 2 && name[start] == '.' && name[start + 1] == '.'));
        start = end + 1;
    }
}

static void check_index(const fl_tar_index *index, const uint8_t *data, size_t size)
{
    CHECK(index->count <= size / FL_TAR_BLOCK);
    for (size_t i = 0; i < index->count; i++) {
        size_t start = (size_t)index->name_offsets[i];
        size_t end = i + 1 < index->count ? (size_t)index->name_offsets[i + 1] : index->names_size;
        CHECK(start < end && end <= index->names_size && index->names[end - 1] == '\0');
        size_t length = end - start - 1;
        CHECK(strlen(index->names + start) == length);
        check_name(index->names + start, length);
        int64_t offset = index->data_offsets[i], bytes = index->sizes[i];
        CHECK(offset >= FL_TAR_BLOCK && offset % FL_TAR_BLOCK == 0 && bytes >= 0);
        CHECK((uint64_t)offset + (uint64_t)bytes <= size);
        if (bytes > 0)
            sink ^= data[offset] ^ data[offset + bytes - 1];
    }
}

static void check_samples(const fl_tar_index *index, const fl_tar_samples *samples)
{
    CHECK(samples->starts[0] == 0 && samples->starts[samples->n_samples] ==
                                         (int64_t)samples->n_members);
    size_t in_samples = 0;
    for (size_t i = 0; i < index->count; i++) {
        const char *name = fl_tar_name(index, i);
        int64_t key = samples->key_lengths[i];
        CHECK(key >= -1 && key < (int64_t)strlen(name));
        if (key >= 0)
            CHECK(name[key] == '.' && !fl_tar_is_meta(name, strlen(name)));
        in_samples += key >= 0;
    }
    CHECK(in_samples == samples->n_members);
    int64_t previous = -1;
    for (size_t s = 0; s < samples->n_samples; s++) {
        int64_t first = samples->members[samples->starts[s]];
        CHECK(samples->starts[s] < samples->starts[s + 1]);
        for (int64_t j = samples->starts[s]; j < samples->starts[s + 1]; j++) {
            int64_t m = samples->members[j];
            CHECK(m > previous && (size_t)m < index->count);
            previous = m;
            CHECK(samples->key_lengths[m] == samples->key_lengths[first]);
            CHECK(memcmp(fl_tar_name(index, (size_t)m), fl_tar_name(index, (size_t)first),
                         (size_t)samples->key_lengths[m]) == 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fl_tar_index index, through_fd;
    fl_tar_error error, fd_error;
    fl_tar_index_init(&index);
    fl_tar_index_init(&through_fd);
    int status = fl_tar_index_memory(data, size, &index, &error);
    CHECK(status == FL_OK || status == FL_ERR_DECODE || status == FL_ERR_TOO_BIG);
    if (status != FL_OK)
        CHECK(error.msg[0] != '\0');

    int fd_status = index_through_fd(data, size, &through_fd, &fd_error);
    if (fd_status != 1) {
        CHECK(fd_status == status && through_fd.count == index.count &&
              through_fd.names_size == index.names_size);
        if (status != FL_OK)
            CHECK(strcmp(error.msg, fd_error.msg) == 0 && error.offset == fd_error.offset);
        size_t n = index.count * sizeof(int64_t);
        CHECK(n == 0 || (memcmp(through_fd.name_offsets, index.name_offsets, n) == 0 &&
                         memcmp(through_fd.data_offsets, index.data_offsets, n) == 0 &&
                         memcmp(through_fd.sizes, index.sizes, n) == 0));
        CHECK(index.names_size == 0 ||
              memcmp(through_fd.names, index.names, index.names_size) == 0);
    }
    fl_tar_index_free(&through_fd);

    if (status == FL_OK) {
        check_index(&index, data, size);
        fl_tar_samples samples;
        fl_tar_samples_init(&samples);
        status = fl_tar_group(&index, &samples, &error);
        CHECK(status == FL_OK || status == FL_ERR_DECODE);
        if (status == FL_OK)
            check_samples(&index, &samples);
        fl_tar_samples_free(&samples);
    }
    fl_tar_index_free(&index);
    return 0;
}
