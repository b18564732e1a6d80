/* fastload core: tf.train.Example parsing (see example.h).
 *
 * A cursor walks each message once, field by field; a length-delimited
 * field is a sub-cursor over its bytes, so a nested message never reads
 * past its parent.  The cursor functions return 0 on success and -1 with
 * the reason in `why` (a static string) for the caller's message. */
#include "core/source/example.h"

#include "core/status.h"

#include <string.h>

typedef struct cursor {
    const unsigned char *p, *end;
    const char *why; /* set when a read fails */
} cursor;

static int fail(cursor *c, const char *why)
{
    c->why = why;
    return -1;
}

static int read_varint(cursor *c, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (c->p == c->end)
            return fail(c, "a varint runs past the end");
        unsigned char b = *c->p++;
        if (shift == 63 && (b & 0x7e))
            return fail(c, "a varint is longer than 64 bits");
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return fail(c, "a varint is longer than 10 bytes");
}

/* The next field's number and wire type; 0 at the end of the message
 * (*number 0), -1 when malformed. */
static int read_tag(cursor *c, uint32_t *number, int *wire)
{
    *number = 0;
    if (c->p == c->end)
        return 0;
    uint64_t tag;
    if (read_varint(c, &tag) < 0)
        return -1;
    if (tag >> 3 == 0 || tag >> 3 > 0x1fffffff)
        return fail(c, "a field number is out of range");
    *number = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    return 0;
}

/* A length-delimited field's bytes as a sub-cursor. */
static int read_bytes(cursor *c, cursor *sub)
{
    uint64_t n;
    if (read_varint(c, &n) < 0)
        return -1;
    if (n > (uint64_t)(c->end - c->p))
        return fail(c, "a length runs past the end");
    sub->p = c->p;
    sub->end = c->p + n;
    sub->why = NULL;
    c->p += n;
    return 0;
}

static int skip_fixed(cursor *c, size_t n)
{
    if ((size_t)(c->end - c->p) < n)
        return fail(c, "a fixed-size field runs past the end");
    c->p += n;
    return 0;
}

/* Skips a field of an unknown number. */
static int skip_field(cursor *c, int wire)
{
    uint64_t v;
    cursor sub;
    switch (wire) {
    case 0:
        return read_varint(c, &v);
    case 1:
        return skip_fixed(c, 8);
    case 2:
        return read_bytes(c, &sub);
    case 5:
        return skip_fixed(c, 4);
    default:
        return fail(c, "a field has a wire type fastload does not read (a group?)");
    }
}

/* Moves to the next field numbered `wanted`, skipping the others: 1 with
 * its wire type in *wire (the cursor at its payload), 0 at the end of the
 * message, -1 when malformed. */
static int next_field(cursor *c, uint32_t wanted, int *wire)
{
    for (;;) {
        uint32_t number;
        if (read_tag(c, &number, wire) < 0)
            return -1;
        if (number == 0)
            return 0;
        if (number == wanted)
            return 1;
        if (skip_field(c, *wire) < 0)
            return -1;
    }
}

const char *fl_feature_kind_name(int kind)
{
    switch (kind) {
    case FL_FEATURE_BYTES:
        return "bytes_list";
    case FL_FEATURE_FLOAT:
        return "float_list";
    case FL_FEATURE_INT64:
        return "int64_list";
    default:
        return "no list";
    }
}

/* A Feature message into *out (the last list set wins). */
static int parse_feature(cursor *c, fl_feature *out)
{
    out->kind = FL_FEATURE_NONE;
    out->list = NULL;
    out->size = 0;
    for (;;) {
        uint32_t number;
        int wire;
        if (read_tag(c, &number, &wire) < 0)
            return -1;
        if (number == 0)
            return 0;
        if (number >= 1 && number <= 3) {
            if (wire != 2)
                return fail(c, "a Feature's list is not length-delimited");
            cursor list;
            if (read_bytes(c, &list) < 0)
                return -1;
            out->kind = (int)number;
            out->list = list.p;
            out->size = (size_t)(list.end - list.p);
        } else if (skip_field(c, wire) < 0) {
            return -1;
        }
    }
}

/* A map entry of Features: its key, and its value's bytes (absent: an
 * empty Feature). */
static int parse_entry(cursor *c, cursor *key, cursor *value)
{
    key->p = key->end = value->p = value->end = c->p;
    for (;;) {
        uint32_t number;
        int wire;
        if (read_tag(c, &number, &wire) < 0)
            return -1;
        if (number == 0)
            return 0;
        if (number == 1 || number == 2) {
            if (wire != 2)
                return fail(c, "a map entry's key or value is not length-delimited");
            if (read_bytes(c, number == 1 ? key : value) < 0)
                return -1;
        } else if (skip_field(c, wire) < 0) {
            return -1;
        }
    }
}

/* Looks through one Features message, updating *found and *feature (the
 * last entry named `name` wins). */
static int search_features(cursor *c, const char *name, size_t name_size, int *found,
                           fl_feature *feature)
{
    int wire, more;
    while ((more = next_field(c, 1, &wire)) > 0) {
        if (wire != 2)
            return fail(c, "a Features entry is not length-delimited");
        cursor entry, key, value;
        if (read_bytes(c, &entry) < 0)
            return -1;
        if (parse_entry(&entry, &key, &value) < 0)
            return fail(c, entry.why);
        /* Every entry's value is parsed, so a malformed one is found
         * whichever feature is asked for. */
        fl_feature f;
        if (parse_feature(&value, &f) < 0)
            return fail(c, value.why);
        if ((size_t)(key.end - key.p) == name_size && memcmp(key.p, name, name_size) == 0) {
            *found = 1;
            *feature = f;
        }
    }
    return more;
}

int fl_example_find(const unsigned char *data, size_t size, const char *name, size_t name_size,
                    int *found, fl_feature *feature, char *msg, size_t msg_size)
{
    *found = 0;
    if (size == 0)
        return FL_OK; /* an empty Example */
    cursor c = {data, data + size, NULL};
    int wire, more;
    while ((more = next_field(&c, 1, &wire)) > 0) {
        if (wire != 2) {
            fail(&c, "the Example's features are not length-delimited");
            break;
        }
        cursor features;
        if (read_bytes(&c, &features) < 0)
            break;
        if (search_features(&features, name, name_size, found, feature) < 0) {
            c.why = features.why;
            break;
        }
    }
    if (more == 0)
        return FL_OK;
    fl_set_msg(msg, msg_size, "malformed Example: %s", c.why ? c.why : "unreadable");
    return FL_ERR_DECODE;
}

/* Stores value k of a list when there is room. */
static void store(void *out, size_t capacity, size_t k, const void *value, size_t value_size)
{
    if (out && k < capacity)
        memcpy((char *)out + k * value_size, value, value_size);
}

static int bytes_values(cursor *c, fl_bytes_ref *out, size_t capacity, size_t *count)
{
    int wire, more;
    while ((more = next_field(c, 1, &wire)) > 0) {
        if (wire != 2)
            return fail(c, "a bytes_list value is not length-delimited");
        cursor v;
        if (read_bytes(c, &v) < 0)
            return -1;
        fl_bytes_ref ref = {v.p, (size_t)(v.end - v.p)};
        store(out, capacity, (*count)++, &ref, sizeof ref);
    }
    return more;
}

static float load_float(const unsigned char *p)
{
    uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                    (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int float_values(cursor *c, float *out, size_t capacity, size_t *count)
{
    int wire, more;
    while ((more = next_field(c, 1, &wire)) > 0) {
        if (wire == 5) { /* one value, unpacked */
            if (skip_fixed(c, 4) < 0)
                return -1;
            float f = load_float(c->p - 4);
            store(out, capacity, (*count)++, &f, sizeof f);
        } else if (wire == 2) { /* packed */
            cursor v;
            if (read_bytes(c, &v) < 0)
                return -1;
            if ((v.end - v.p) % 4 != 0)
                return fail(c, "a packed float_list is not a whole number of floats");
            for (; v.p < v.end; v.p += 4) {
                float f = load_float(v.p);
                store(out, capacity, (*count)++, &f, sizeof f);
            }
        } else {
            return fail(c, "a float_list value has the wrong wire type");
        }
    }
    return more;
}

static int int64_values(cursor *c, int64_t *out, size_t capacity, size_t *count)
{
    int wire, more;
    while ((more = next_field(c, 1, &wire)) > 0) {
        uint64_t u;
        if (wire == 0) { /* one value, unpacked */
            if (read_varint(c, &u) < 0)
                return -1;
            int64_t v = (int64_t)u;
            store(out, capacity, (*count)++, &v, sizeof v);
        } else if (wire == 2) { /* packed */
            cursor v;
            if (read_bytes(c, &v) < 0)
                return -1;
            while (v.p < v.end) {
                if (read_varint(&v, &u) < 0)
                    return fail(c, v.why);
                int64_t x = (int64_t)u;
                store(out, capacity, (*count)++, &x, sizeof x);
            }
        } else {
            return fail(c, "an int64_list value has the wrong wire type");
        }
    }
    return more;
}

int fl_feature_values(const fl_feature *feature, void *out, size_t capacity, size_t *count,
                      char *msg, size_t msg_size)
{
    *count = 0;
    if (feature->kind == FL_FEATURE_NONE || !feature->list)
        return FL_OK; /* no list: no values */
    cursor c = {feature->list, feature->list + feature->size, NULL};
    int rc = 0;
    switch (feature->kind) {
    case FL_FEATURE_BYTES:
        rc = bytes_values(&c, out, capacity, count);
        break;
    case FL_FEATURE_FLOAT:
        rc = float_values(&c, out, capacity, count);
        break;
    case FL_FEATURE_INT64:
        rc = int64_values(&c, out, capacity, count);
        break;
    default:
        break; /* no list: no values */
    }
    if (rc < 0) {
        fl_set_msg(msg, msg_size, "malformed %s: %s", fl_feature_kind_name(feature->kind),
                   c.why ? c.why : "unreadable");
        return FL_ERR_DECODE;
    }
    return FL_OK;
}
