/* Bounded gunzip for the C decoders, callable without the GIL. */
#ifndef HOTSPAN_INFLATE_H
#define HOTSPAN_INFLATE_H

#include <stddef.h>
#include <stdint.h>

#define GZIP_MAGIC_0 0x1f
#define GZIP_MAGIC_1 0x8b

/* Inflates every gzip member of ``data`` into a new malloc'd buffer of at most ``max_size``
 * bytes (``*out``, ``*out_len``; the caller frees it).  Returns 0, or -1 with the reason in
 * ``error`` (the texts hotspan/formats/compression.py gives for the same input). */
int gunzip_bounded(const uint8_t *data, size_t len, size_t max_size, uint8_t **out,
                   size_t *out_len, char *error, size_t error_size);

#endif
