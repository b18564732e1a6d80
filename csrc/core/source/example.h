/* fastload core: tf.train.Example, parsed without a protobuf library.
 *
 *     Example  { Features features = 1; }
 *     Features { map<string, Feature> feature = 1; }
 *     Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
 *                             Int64List int64_list = 3; } }
 *     BytesList { repeated bytes value = 1; }
 *     FloatList { repeated float value = 1 [packed]; }
 *     Int64List { repeated int64 value = 1 [packed]; }
 *
 * Protobuf's rules hold: unknown fields are skipped, a map key seen twice
 * keeps its last value, the last member of a oneof wins, and repeated
 * numbers may come packed, unpacked or both.  Every length is checked
 * against the bytes left, so any input, however damaged, gives FL_OK or
 * FL_ERR_DECODE, never a read outside it.  Values point into the input:
 * nothing is allocated.
 */
#ifndef FL_EXAMPLE_H
#define FL_EXAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef enum fl_feature_kind {
    FL_FEATURE_NONE = 0,  /* a Feature with no list set */
    FL_FEATURE_BYTES = 1,
    FL_FEATURE_FLOAT = 2,
    FL_FEATURE_INT64 = 3,
} fl_feature_kind;

/* A feature found in an Example: its kind and its encoded list message. */
typedef struct fl_feature {
    int kind;                  /* fl_feature_kind */
    const unsigned char *list; /* the XxxList message, inside the Example's bytes */
    size_t size;
} fl_feature;

/* One value of a bytes list: a range of the Example's bytes. */
typedef struct fl_bytes_ref {
    const unsigned char *data;
    size_t size;
} fl_bytes_ref;

/* The name of a kind ("bytes_list", "float_list", "int64_list", "no list"). */
const char *fl_feature_kind_name(int kind);

/* Finds feature `name` (`name_size` bytes) in the Example at data[0..size).
 * Returns FL_OK with *found 1 and *feature set, or *found 0 when the
 * Example has no such feature; FL_ERR_DECODE with msg ("malformed Example:
 * ...") when the bytes are not an Example. */
int fl_example_find(const unsigned char *data, size_t size, const char *name, size_t name_size,
                    int *found, fl_feature *feature, char *msg, size_t msg_size);

/* The values of a feature: *count set to how many there are, and the first
 * min(count, capacity) stored in `out` (fl_bytes_ref, float or int64_t by
 * the feature's kind; NULL with capacity 0 only counts).  Returns FL_OK, or
 * FL_ERR_DECODE with msg when the list is malformed (the whole list is
 * checked, however many are stored). */
int fl_feature_values(const fl_feature *feature, void *out, size_t capacity, size_t *count,
                      char *msg, size_t msg_size);

#endif /* FL_EXAMPLE_H */
