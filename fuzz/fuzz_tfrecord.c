/* libFuzzer target: untrusted bytes as a TFRecord file of tf.train.Examples.
 *
 * The input is the whole file.  It is indexed from memory twice, with and
 * without the length CRC check (a file that indexes with the check indexes
 * the same without it); every record found must lie inside the input, back
 * to back.  Each record's payload is then checked with and without its
 * CRCs, and each payload (and the whole input, so that inputs without
 * framing reach the parser too) is parsed as an Example: the features a
 * TFRecordDataset asks for by default, and every kind of list for each, so
 * the value walkers run on whatever the map holds.  Every value's first and
 * last bytes are read, so a sanitizer sees a range outside the input.
 *
 * Built by fuzz/Makefile with clang -fsanitize=fuzzer, or with any compiler
 * and fuzz/replay.c as a plain program (see fuzz_pipeline.c).
 */
#include "core/source/crc32c.h"
#include "core/source/example.h"
#include "core/source/tfrecord.h"
#include "core/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond))                                                                            \
            abort();                                                                            \
    } while (0)

#define MAX_VALUES 4096

static volatile uint8_t sink;

static void read_values(const fl_feature *f, const uint8_t *data, size_t size)
{
    static union {
        fl_bytes_ref refs[MAX_VALUES];
        float floats[MAX_VALUES];
        int64_t ints[MAX_VALUES];
    } out;
    char msg[256];
    size_t count = 0, again = 0;
    int rc = fl_feature_values(f, &out, MAX_VALUES, &count, msg, sizeof msg);
    CHECK(rc == FL_OK || rc == FL_ERR_DECODE);
    if (rc != FL_OK) {
        CHECK(msg[0] != '\0');
        return;
    }
    /* Counting only agrees with storing. */
    CHECK(fl_feature_values(f, NULL, 0, &again, msg, sizeof msg) == FL_OK && again == count);
    CHECK(count <= size); /* every value takes a byte of the input at least */
    size_t stored = count < MAX_VALUES ? count : MAX_VALUES;
    for (size_t i = 0; i < stored; i++) {
        if (f->kind == FL_FEATURE_BYTES) {
            const fl_bytes_ref *r = &out.refs[i];
            CHECK(r->data >= data && r->size <= size &&
                  (size_t)(r->data - data) <= size - r->size);
            if (r->size > 0)
                sink ^= r->data[0] ^ r->data[r->size - 1];
        } else if (f->kind == FL_FEATURE_FLOAT) {
            sink ^= (uint8_t)(out.floats[i] != out.floats[i]);
        } else {
            sink ^= (uint8_t)out.ints[i];
        }
    }
}

static void parse(const uint8_t *data, size_t size)
{
    static const char *names[] = {"image/encoded", "image/class/label", "a", ""};
    for (size_t n = 0; n < sizeof names / sizeof *names; n++) {
        int found = 0;
        fl_feature f;
        char msg[256];
        int rc = fl_example_find(data, size, names[n], strlen(names[n]), &found, &f, msg,
                                 sizeof msg);
        CHECK(rc == FL_OK || rc == FL_ERR_DECODE);
        if (rc != FL_OK) {
            CHECK(msg[0] != '\0');
            continue;
        }
        if (!found)
            continue;
        CHECK(f.kind >= FL_FEATURE_NONE && f.kind <= FL_FEATURE_INT64);
        if (f.kind != FL_FEATURE_NONE)
            CHECK(f.list >= data && f.size <= size && (size_t)(f.list - data) <= size - f.size);
        read_values(&f, data, size);
        /* The walkers of the other kinds, on the same bytes. */
        for (int kind = FL_FEATURE_BYTES; kind <= FL_FEATURE_INT64; kind++) {
            fl_feature other = f;
            other.kind = f.kind == FL_FEATURE_NONE ? FL_FEATURE_NONE : kind;
            read_values(&other, data, size);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fl_tfrecord_index checked, unchecked;
    char msg[256], msg2[256];
    fl_tfrecord_index_init(&checked);
    fl_tfrecord_index_init(&unchecked);
    int status = fl_tfrecord_scan_memory(data, size, 1, &checked, msg, sizeof msg);
    int status2 = fl_tfrecord_scan_memory(data, size, 0, &unchecked, msg2, sizeof msg2);
    CHECK(status == FL_OK || status == FL_ERR_DECODE);
    CHECK(status2 == FL_OK || status2 == FL_ERR_DECODE);
    if (status != FL_OK)
        CHECK(msg[0] != '\0');
    /* The check only ever stops the scan earlier. */
    CHECK(checked.count <= unchecked.count);
    if (status == FL_OK)
        CHECK(status2 == FL_OK && checked.count == unchecked.count);
    uint64_t at = 0;
    for (size_t i = 0; i < unchecked.count; i++) {
        int64_t offset = unchecked.offsets[i], bytes = unchecked.sizes[i];
        CHECK(offset >= 0 && (uint64_t)offset == at && bytes >= FL_TFRECORD_FRAMING);
        CHECK((uint64_t)offset + (uint64_t)bytes <= size);
        at += (uint64_t)bytes;
        if (i < checked.count)
            CHECK(checked.offsets[i] == offset && checked.sizes[i] == bytes);
        for (int verify = 0; verify <= 1; verify++) {
            const unsigned char *payload = NULL;
            size_t length = 0;
            int rc = fl_tfrecord_payload(data + offset, (size_t)bytes, verify, &payload, &length,
                                         msg, sizeof msg);
            CHECK(rc == FL_OK || rc == FL_ERR_DECODE);
            if (rc != FL_OK)
                continue;
            CHECK(payload == data + offset + FL_TFRECORD_HEADER &&
                  length + FL_TFRECORD_FRAMING == (size_t)bytes);
            if (verify)
                parse(payload, length);
        }
    }
    if (status2 == FL_OK)
        CHECK(at == size);
    fl_tfrecord_index_free(&checked);
    fl_tfrecord_index_free(&unchecked);
    /* Both CRC implementations agree on any bytes. */
    if (fl_crc32c_hw_available())
        CHECK(fl_crc32c_hw(0, data, size) == fl_crc32c_table(0, data, size));
    parse(data, size);
    return 0;
}
