/*
 * Bounded gunzip for the C decoders.
 *
 * Why here rather than Python's zlib (or ISA-L): a decoder thread that gunzips in Python and
 * then decodes in C lets go of the GIL three or four times per upload, and on a busy server
 * every time it wants the GIL back it waits for the event loop and the store's writer.  Here
 * the decoder inflates and decodes in one stretch without the GIL.
 *
 * Same contract as hotspan/formats/compression.py's gunzip: every member is inflated, a
 * payload that would pass ``max_size`` bytes is refused before it is all in memory, and a
 * member that ends early is refused.
 */
#include "inflate.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* zlib counts in uInt: feed and fill at most this much per call. */
#define STEP ((size_t)UINT_MAX)

static int
fail(char *error, size_t error_size, const char *what, const z_stream *zs)
{
    if (zs && zs->msg)
        snprintf(error, error_size, "%s: %s", what, zs->msg);
    else
        snprintf(error, error_size, "%s", what);
    return -1;
}

/* The last member's trailer says its length (mod 2^32): a first guess, never trusted. */
static size_t
size_hint(const uint8_t *data, size_t len, size_t max_size)
{
    size_t hint = 4 * len;
    if (len >= 18) {
        const uint8_t *t = data + len - 4;
        size_t isize =
            (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24;
        if (isize > hint)
            hint = isize;
    }
    hint += 1; /* room to see that a member ends exactly at its size */
    if (hint > max_size + 1)
        hint = max_size + 1;
    return hint < 256 ? 256 : hint;
}

enum outcome { INFLATED, TRUNCATED, TOO_LARGE, BAD_DATA, NO_MEMORY };

/* One gzip member from ``*data`` into ``buf`` after ``*total`` bytes, growing it up to
 * ``max_size`` + 1 bytes; ``*data`` and ``*len`` move past the member. */
static enum outcome
inflate_member(const uint8_t **data, size_t *len, size_t max_size, uint8_t **buf, size_t *cap,
               size_t *total, z_stream *zs)
{
    const uint8_t *in = *data;
    size_t in_left = *len;
    enum outcome result;
    for (;;) {
        if (*total == *cap) { /* below max_size + 1, or TOO_LARGE was returned */
            size_t grown = *cap > (max_size + 1) / 2 ? max_size + 1 : *cap * 2;
            uint8_t *bigger = (uint8_t *)realloc(*buf, grown);
            if (!bigger)
                return NO_MEMORY;
            *buf = bigger;
            *cap = grown;
        }
        if (zs->avail_in == 0 && in_left > 0) {
            size_t n = in_left < STEP ? in_left : STEP;
            zs->next_in = (Bytef *)in;
            zs->avail_in = (uInt)n;
            in += n;
            in_left -= n;
        }
        size_t room = *cap - *total < STEP ? *cap - *total : STEP;
        zs->next_out = *buf + *total;
        zs->avail_out = (uInt)room;
        int rc = inflate(zs, Z_NO_FLUSH);
        *total += room - zs->avail_out;
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
            /* Before the size, as Python's zlib raises it. */
            result = rc == Z_MEM_ERROR ? NO_MEMORY : BAD_DATA;
            break;
        }
        if (*total > max_size) {
            result = TOO_LARGE;
            break;
        }
        if (rc == Z_STREAM_END) {
            result = INFLATED;
            break;
        }
        /* Z_BUF_ERROR: no progress, out of room (grown above) or of input. */
        if (rc == Z_BUF_ERROR && zs->avail_out != 0 && zs->avail_in == 0 && in_left == 0) {
            result = TRUNCATED;
            break;
        }
    }
    size_t used = (size_t)(in - *data) - zs->avail_in;
    *data += used;
    *len -= used;
    return result;
}

int
gunzip_bounded(const uint8_t *data, size_t len, size_t max_size, uint8_t **out, size_t *out_len,
               char *error, size_t error_size)
{
    size_t cap = size_hint(data, len, max_size), total = 0;
    uint8_t *buf = (uint8_t *)malloc(cap);
    if (!buf)
        return fail(error, error_size, "out of memory", NULL);
    while (len > 0) {
        z_stream zs;
        memset(&zs, 0, sizeof(zs));
        if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) { /* gzip only */
            free(buf);
            return fail(error, error_size, "out of memory", NULL);
        }
        enum outcome result = inflate_member(&data, &len, max_size, &buf, &cap, &total, &zs);
        if (result != INFLATED) {
            if (result == TOO_LARGE)
                snprintf(error, error_size,
                         "decompressed payload is larger than the limit of %zu bytes",
                         max_size);
            else if (result == TRUNCATED)
                fail(error, error_size, "truncated gzip data", NULL);
            else if (result == BAD_DATA)
                fail(error, error_size, "bad gzip data", &zs);
            else
                fail(error, error_size, "out of memory", NULL);
            inflateEnd(&zs);
            free(buf);
            return -1;
        }
        inflateEnd(&zs);
    }
    *out = buf;
    *out_len = total;
    return 0;
}
