/* Frame ids remembered across decodes, one table per thread. */
#ifndef HOTSPAN_FRAME_CACHE_H
#define HOTSPAN_FRAME_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* hash_frame_raw(name, file, line) (hashing.h), from this thread's cache when it has the
 * frame.  Never fails: without memory for the cache it hashes every time. */
int64_t cached_frame_id(const uint8_t *name, size_t name_len, const uint8_t *file,
                        size_t file_len, int64_t line);

#endif
